"""What is under test: kernels and sizing policies, by builtin name or plug-in spec.

A spec is a builtin name (``reference``, ``reference-blocked``; ``eager``, ``fixed``, ``prefix``, ``safe``),
``package.module:attr``, ``path/to/file.py:attr`` or, for kernels, ``sglang==VERSION[:attr]`` (SGLang's own
kernel from its wheel, harness.upstream). A kernel attr is either a ``@triton.jit`` function
with the classic ABI of docs/contract.md §2, or a launcher callable taking the keyword arguments of ``LAUNCH_KWARGS``.
A sizing attr is a callable ``(n, topk, ctx, num_steps) -> width``. Anything else is ``BadInput``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import operator
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from harness.device import ensure
from harness.errors import BadInput, require

#: Keyword arguments a launcher plug-in receives; kv_indices / kv_indptr are 2-D (num_steps, .) views.
LAUNCH_KWARGS = ("req_pool_indices", "req_to_token", "seq_lens", "kv_indices", "kv_indptr", "positions", "topk",
                 "num_steps", "page_size")
#: The classic ABI's parameter count (docs/contract.md §2).
CLASSIC_ARITY = 13
BUILTIN_KERNELS = ("reference", "reference-blocked")


@dataclass(frozen=True)
class KernelTarget:
    """A resolved kernel: its spec and a launcher with the ``LAUNCH_KWARGS`` signature.

    ``request_axis`` is the launch grid's axis that indexes requests (1 for classic-ABI kernels; None for
    a launcher plug-in, whose grid kvfence does not know). The address audit uses it to check that
    program ``(., b, .)`` reads only its own ``req_to_token`` row.
    """

    spec: str
    launch: Callable[..., None]
    request_axis: Optional[int] = 1


def _load_file(path: Path):
    """Import a plug-in file once per process (kernel and sizing specs may name the same file)."""
    resolved = path.resolve()
    name = "kvfence_plugin_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:16]
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None) == str(resolved):
        return module
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # triton.jit needs the module to be importable by name
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _load_attr(spec: str, what: str):
    require(":" in spec, f"unknown {what} {spec!r}: expected a builtin name, module:attr or file.py:attr")
    where, _, attr = spec.rpartition(":")
    require(where and attr, f"malformed {what} spec {spec!r}: expected module:attr or file.py:attr")
    try:
        if where.endswith(".py") or os.sep in where:
            path = Path(where)
            require(path.is_file(), f"{what} file {where} does not exist")
            module = _load_file(path)
        else:
            module = importlib.import_module(where)
    except BadInput:
        raise
    except (Exception, SystemExit) as exc:  # any import-time failure of user code is bad input, in one line
        raise BadInput(f"cannot import {what} {spec!r}: {type(exc).__name__}: {exc}") from None
    require(hasattr(module, attr), f"{what} {spec!r}: {where} has no attribute {attr!r}")
    return getattr(module, attr)


def _is_triton_kernel(obj) -> bool:
    # JITFunction (compiled) and InterpretedFunction (TRITON_INTERPRET=1) both carry the raw fn; so do
    # the autotune / heuristics wrappers around them (their fn is the JIT function).
    return hasattr(obj, "fn") and hasattr(obj, "run") and callable(getattr(obj, "fn"))


def _unwrap(kernel):
    """``(jit_function, python_function, names the wrappers supply)`` of a possibly autotuned kernel."""
    supplied, jit = set(), kernel
    while _is_triton_kernel(jit) and _is_triton_kernel(jit.fn):
        for config in getattr(jit, "configs", None) or []:  # triton.autotune
            supplied.update(getattr(config, "kwargs", {}))
        supplied.update(getattr(jit, "values", None) or {})  # triton.heuristics
        jit = jit.fn
    return jit, jit.fn, supplied


def _check_classic_signature(spec: str, kernel) -> None:
    """13 positional parameters without a default (docs/contract.md §2); any other must have one or be supplied."""
    _, fn, supplied = _unwrap(kernel)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise BadInput(f"kernel {spec!r}: cannot read its signature") from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is inspect.Parameter.empty and p.name not in supplied]
    require(len(positional) >= CLASSIC_ARITY and required == positional[:len(required)]
            and len(required) == CLASSIC_ARITY,
            f"kernel {spec!r} takes {len(required)} required arguments "
            f"({', '.join(p.name for p in required)}); the classic ABI has {CLASSIC_ARITY} (docs/contract.md §2)")


def _for_device(kernel, device: str):
    """Check that a ``@triton.jit`` kernel was built for ``device`` (interpreted on CPU, compiled on CUDA)."""
    from triton.runtime.interpreter import InterpretedFunction

    ensure(device)
    interpreted = isinstance(_unwrap(kernel)[0], InterpretedFunction)
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


def check_kernel_spec(spec: str):
    """The device-independent part of ``resolve_kernel``: import the plug-in and check its signature.
    Returns the object (None for a builtin); ``BadInput`` on anything unusable. Commands that pick their
    device later (``sweep``) call it first, so a bad ``--kernel`` is reported as such."""
    require(isinstance(spec, str) and spec, "kernel spec must be a non-empty string")
    if spec in BUILTIN_KERNELS:
        return None
    from harness import upstream

    if upstream.is_spec(spec):
        upstream.resolve(spec)  # found in the cache (or fetched) and its ABI checked now
        return None
    obj = _load_attr(spec, "kernel")
    if _is_triton_kernel(obj):
        _check_classic_signature(spec, obj)
        return obj
    require(callable(obj), f"kernel {spec!r} is neither a @triton.jit function nor a launcher callable")
    try:
        sig = inspect.signature(obj)
        sig.bind(**{name: None for name in LAUNCH_KWARGS})
    except (TypeError, ValueError):
        raise BadInput(f"launcher {spec!r} must accept keyword arguments {', '.join(LAUNCH_KWARGS)}") from None
    return obj


def resolve_kernel(spec: str, device: str) -> KernelTarget:
    """Resolve a kernel spec for ``device`` (``cpu`` or ``cuda``); ``BadInput`` on anything unusable."""
    obj = check_kernel_spec(spec)
    if spec in BUILTIN_KERNELS:
        from kernels.draft_kv_indices import generate_draft_decode_kv_indices

        return KernelTarget(spec, _kernel_launcher(_for_device(generate_draft_decode_kv_indices, device),
                                                   spec == "reference-blocked"))
    from harness import upstream

    if upstream.is_spec(spec):
        return _upstream_kernel(spec, device)
    if _is_triton_kernel(obj):
        return KernelTarget(spec, _kernel_launcher(_for_device(obj, device), False))
    ensure(device)
    return KernelTarget(spec, obj, request_axis=None)


def _upstream_kernel(spec: str, device: str) -> KernelTarget:
    """``sglang==VERSION[:attr]``: a kernel extracted from SGLang's wheel (harness.upstream), fetched if allowed."""
    from harness import upstream

    entry, attr, abi = upstream.resolve(spec)
    # The rail kernel has its own contract (docs/contract.md §6), which the oracle does not check yet.
    require(abi.contract == "draft", f"kernel {spec!r}: contract {abi.contract} not supported yet")
    kernel = getattr(_load_file(entry.module_path), attr)
    return KernelTarget(spec, upstream.launcher(_for_device(kernel, device), abi))


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

    @functools.wraps(obj)
    def policy(n: int, topk: int, ctx: int, num_steps: int) -> int:
        # User code: an exception or a non-integer width is bad input (one line), not a traceback.
        try:
            return operator.index(obj(n, topk, ctx, num_steps))
        except Exception as exc:
            raise BadInput(f"sizing {spec!r} failed for n={n}, topk={topk}, ctx={ctx}, num_steps={num_steps}: "
                           f"{type(exc).__name__}: {exc}") from None

    return policy
