"""What is under test: kernels and sizing policies, by builtin name or plug-in spec.

A spec is a builtin name (``reference``, ``reference-blocked``; ``eager``, ``fixed``, ``prefix``, ``safe``),
``package.module:attr`` or ``path/to/file.py:attr``. A kernel attr is either a ``@triton.jit`` function
with the classic ABI of SPEC §2, or a launcher callable taking the keyword arguments of ``LAUNCH_KWARGS``.
A sizing attr is a callable ``(n, topk, ctx, num_steps) -> width``. Anything else is ``BadInput``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.device import ensure
from harness.errors import BadInput, require

#: Keyword arguments a launcher plug-in receives; kv_indices / kv_indptr are 2-D (num_steps, .) views.
LAUNCH_KWARGS = ("req_pool_indices", "req_to_token", "seq_lens", "kv_indices", "kv_indptr", "positions", "topk",
                 "num_steps", "page_size")
#: The classic ABI's parameter count (SPEC §2).
CLASSIC_ARITY = 13
BUILTIN_KERNELS = ("reference", "reference-blocked")


@dataclass(frozen=True)
class KernelTarget:
    """A resolved kernel: its spec and a launcher with the ``LAUNCH_KWARGS`` signature."""

    spec: str
    launch: Callable[..., None]


def _load_attr(spec: str, what: str):
    require(":" in spec, f"unknown {what} {spec!r}: expected a builtin name, module:attr or file.py:attr")
    where, _, attr = spec.rpartition(":")
    require(where and attr, f"malformed {what} spec {spec!r}: expected module:attr or file.py:attr")
    try:
        if where.endswith(".py") or os.sep in where:
            path = Path(where)
            require(path.is_file(), f"{what} file {where} does not exist")
            name = f"kvfence_plugin_{abs(hash(str(path.resolve())))}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module  # triton.jit needs the module to be importable by name
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except BadInput:
        raise
    except Exception as exc:  # any import-time failure of user code is bad input, in one line
        raise BadInput(f"cannot import {what} {spec!r}: {type(exc).__name__}: {exc}") from None
    require(hasattr(module, attr), f"{what} {spec!r}: {where} has no attribute {attr!r}")
    return getattr(module, attr)


def _is_triton_kernel(obj) -> bool:
    # JITFunction (compiled) and InterpretedFunction (TRITON_INTERPRET=1) both carry the raw fn.
    return hasattr(obj, "fn") and hasattr(obj, "run") and callable(getattr(obj, "fn"))


def _for_device(kernel, device: str):
    """Check that a ``@triton.jit`` kernel was built for ``device`` (interpreted on CPU, compiled on CUDA)."""
    from triton.runtime.interpreter import InterpretedFunction

    ensure(device)
    interpreted = isinstance(kernel, InterpretedFunction)
    require(interpreted == (device == "cpu"),
            f"kernel was {'interpreted' if interpreted else 'compiled'} but device is {device}: "
            "choose the device before importing the kernel")
    return kernel


def _kernel_launcher(kernel, token_blocks_for_batch: bool):
    from kernels.draft_kv_indices import launch, token_blocks_for

    def launch_kernel(**kw):
        # From a shape, not from seq_lens' values: no host sync, so it also works inside graph capture.
        blocks = token_blocks_for(kw["req_to_token"].shape[1]) if token_blocks_for_batch else 0
        launch(kernel, token_blocks=blocks, **kw)

    return launch_kernel


def resolve_kernel(spec: str, device: str) -> KernelTarget:
    """Resolve a kernel spec for ``device`` (``cpu`` or ``cuda``); ``BadInput`` on anything unusable."""
    require(isinstance(spec, str) and spec, "kernel spec must be a non-empty string")
    if spec in BUILTIN_KERNELS:
        from kernels.draft_kv_indices import generate_draft_decode_kv_indices

        return KernelTarget(spec, _kernel_launcher(_for_device(generate_draft_decode_kv_indices, device),
                                                   spec == "reference-blocked"))
    obj = _load_attr(spec, "kernel")
    if _is_triton_kernel(obj):
        params = list(inspect.signature(obj.fn).parameters.values())
        required = [p for p in params if p.default is inspect.Parameter.empty]
        require(len(required) == CLASSIC_ARITY,
                f"kernel {spec!r} takes {len(required)} required arguments; the classic ABI has {CLASSIC_ARITY}")
        return KernelTarget(spec, _kernel_launcher(_for_device(obj, device), False))
    require(callable(obj), f"kernel {spec!r} is neither a @triton.jit function nor a launcher callable")
    try:
        sig = inspect.signature(obj)
        sig.bind(**{name: None for name in LAUNCH_KWARGS})
    except (TypeError, ValueError):
        raise BadInput(f"launcher {spec!r} must accept keyword arguments {', '.join(LAUNCH_KWARGS)}") from None
    ensure(device)
    return KernelTarget(spec, obj)


@functools.lru_cache(maxsize=None)
def resolve_sizing(spec: str) -> Callable[[int, int, int, int], int]:
    """Resolve a sizing spec to ``(n, topk, ctx, num_steps) -> width``."""
    from kernels.sizing import POLICIES

    require(isinstance(spec, str) and spec, "sizing spec must be a non-empty string")
    if spec in POLICIES:
        return POLICIES[spec]
    require(":" in spec, f"unknown sizing {spec!r}: choose {', '.join(POLICIES)} or module:attr / file.py:attr")
    obj = _load_attr(spec, "sizing")
    require(callable(obj), f"sizing {spec!r} is not callable")
    try:
        inspect.signature(obj).bind(1, 1, 1, 1)
    except (TypeError, ValueError):
        raise BadInput(f"sizing {spec!r} must take (n, topk, ctx, num_steps)") from None
    return obj
