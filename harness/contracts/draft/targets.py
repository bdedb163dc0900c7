"""The draft's kernels under test, by builtin name or spec, resolved through ``kvfence.engine.kernels``.

A spec is a builtin name (``reference``, ``reference-blocked``), ``mutant:NAME`` (the engine's
``mutant_kernel_spec``), ``package.module:attr``, ``path/to/file.py:attr`` (loaded by the engine's ``load_attr``) or
``sglang==VERSION[:attr]`` (SGLang's own kernel from its wheel, ``release_kernels``). A kernel attr is either a
``@triton.jit`` function with the classic ABI of docs/contract.md §2, or a launcher callable taking the keyword
arguments of ``LAUNCH_KWARGS``. What is the draft's own here: the ABI launcher (``abi_launcher``,
``family_constexprs``), the §6 ``Capabilities`` a kernel declares, and the launchers of the releases' older ABIs.
Anything else is ``BadInput``. Sizing specs resolve in ``kvfence.contracts.draft.sizing``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, FrozenSet, Optional, Sequence, Tuple

from kvfence.contracts.draft import release_kernels
from kvfence.contracts.draft.mutants import REFERENCE_KERNELS, mutants, reference_spec
from kvfence.device import ensure
from kvfence.engine.kernels import (
    is_triton_kernel,
    load_attr,
    load_file,
    mutant_kernel_spec,
    release_source,
    unwrap,
)
from kvfence.errors import BadInput, require

#: Keyword arguments a launcher plug-in receives; kv_indices / kv_indptr are 2-D (num_steps, .) views.
LAUNCH_KWARGS = ("req_pool_indices", "req_to_token", "seq_lens", "kv_indices", "kv_indptr", "positions", "topk",
                 "num_steps", "page_size")
#: The classic ABI's parameter count (docs/contract.md §2).
CLASSIC_ARITY = 13
BUILTIN_KERNELS = ("reference", "reference-blocked")


#: The §6 parameters a config field needs from a kernel (docs/contract.md §6), by the kernel's names.
FAMILY_PARAMS = {"window_size": ("window_size",), "sink_size": ("sink_size",), "entry_page_size": ("ENTRY_PAGE_SIZE",),
                 "translate": ("v2p", "TRANSLATE")}
#: Keyword arguments the runner adds for a §6 config (``kvfence.contracts.draft.runner``), on top of ``LAUNCH_KWARGS``.
FAMILY_KWARGS = ("contract", "window_size", "sink_size", "entry_page_size", "v2p")
ALL_FAMILY = frozenset(p for ps in FAMILY_PARAMS.values() for p in ps)


@dataclass(frozen=True)
class Capabilities:
    """What a kernel can be given: the contracts it implements and the §6 parameters it declares."""

    contracts: Tuple[str, ...] = ("draft",)
    params: FrozenSet[str] = frozenset()

    @property
    def family(self) -> bool:
        """Every §6 draft parameter (window, sinks, page-granular rows, translation) is declared."""
        return ALL_FAMILY <= self.params or (self.contracts == ("window-rail",)
                                            and {"ENTRY_PAGE_SIZE", "v2p", "TRANSLATE"} <= self.params)

    def check_config(self, spec: str, config) -> None:
        """``BadInput`` (one line) unless this kernel can run ``config``'s contract and §6 fields."""
        require(config.contract in self.contracts,
                f"kernel {spec!r} implements the {'/'.join(self.contracts)} contract, not {config.contract} "
                "(docs/contract.md §6)")
        fields = config.family_dict()
        fields.pop("contract", None)
        if config.is_rail:
            fields.pop("window_size", None)  # the rail's required ``window``
        missing = [p for name in fields for p in FAMILY_PARAMS[name] if p not in self.params]
        require(not missing, f"kernel {spec!r} lacks {', '.join(missing)}: its ABI cannot take "
                             f"{', '.join(f'{k}={v}' for k, v in fields.items())} (docs/contract.md §6)")


#: The launch grid's axis that indexes requests in the classic ABI (``abi_launcher``'s kernels).
CLASSIC_REQUEST_AXIS = 1


def pool_row_owners(request_axis: Optional[int], req_pool_indices: Sequence[int]
                    ) -> Optional[Tuple[int, Tuple[int, ...]]]:
    """req_to_token's ``row_owners`` (``kvfence.contract.Table``): request ``b``'s programs (index ``b`` on
    ``request_axis``) read only pool row ``req_pool_indices[b]``; None where the grid is unknown (a launcher)."""
    if request_axis is None:
        return None
    return request_axis, tuple(int(r) for r in req_pool_indices)


@dataclass(frozen=True)
class KernelTarget:
    """A resolved kernel: its spec and a launcher with the ``LAUNCH_KWARGS`` signature (plus, for a §6
    config, ``FAMILY_KWARGS``: only kernels whose ``capabilities`` accept the config get them).

    ``request_axis`` is the launch grid's axis that indexes requests (1 for classic-ABI kernels; None for
    a launcher plug-in, whose grid kvfence does not know). The address audit uses it to check that
    program ``(., b, .)`` reads only its own ``req_to_token`` row.
    """

    spec: str
    launch: Callable[..., None]
    request_axis: Optional[int] = CLASSIC_REQUEST_AXIS
    capabilities: Capabilities = Capabilities()

    def check_config(self, config) -> None:
        self.capabilities.check_config(self.spec, config)


def family_constexprs(kw: dict) -> Tuple[str, dict]:
    """Pop ``FAMILY_KWARGS`` from a launch's keyword arguments: ``(contract, constexprs)``, the §6
    parameters by the kernel's names, only those away from their defaults (so a kernel is compiled for
    exactly the paths a config turns on). ``window_size`` stays in for the rail, which calls it ``window``."""
    contract = kw.pop("contract", "draft")
    family = {name: kw.pop(name) for name in FAMILY_KWARGS[1:] if name in kw}
    out = {}
    if family.get("window_size"):
        out["window_size"] = family["window_size"]
    if family.get("sink_size"):
        out["sink_size"] = family["sink_size"]
    if family.get("entry_page_size", 1) != 1:
        out["ENTRY_PAGE_SIZE"] = family["entry_page_size"]
    if family.get("v2p") is not None:
        out["v2p"], out["TRANSLATE"] = family["v2p"], True
    return contract, out


def abi_launcher(draft=None, rail=None, token_blocks_for_batch: bool = False):
    """A ``LAUNCH_KWARGS`` (+ ``FAMILY_KWARGS``) launcher over a draft kernel and/or a rail kernel, both of
    the classic 13-argument head (``kvfence.kernels.draft.draft_kv_indices.launch`` /
    ``kvfence.kernels.draft.window_kv_indices.launch``)."""
    from kvfence.kernels.draft import draft_kv_indices, window_kv_indices

    def launch_kernel(**kw):
        contract, constexprs = family_constexprs(kw)
        if contract == "window-rail":
            window = constexprs.pop("window_size")
            window_kv_indices.launch(rail, window=window, **kw, **constexprs)
            return
        # From a shape, not from seq_lens' values: no host sync, so it also works inside graph capture.
        blocks = draft_kv_indices.token_blocks_for(kw["req_to_token"].shape[1]) if token_blocks_for_batch else 0
        draft_kv_indices.launch(draft, token_blocks=blocks, **kw, **constexprs)

    return launch_kernel


def mutant_spec(spec: str) -> str:
    """``mutant:NAME``: the ``file.py:attr`` spec of the planted bug's kernel (``kvfence.engine.kernels``'s
    ``mutant_kernel_spec`` on the draft's or the rail's planted bugs, ``kvfence.contracts.draft.mutants``: this
    resolver is not told which contract runs it); ``BadInput`` for an unknown name or a sizing mutant."""
    name = spec.split(":", 1)[1]
    for contract in REFERENCE_KERNELS:
        mutant = next((m for m in mutants(contract) if m.name == name), None)
        if mutant is not None:
            return mutant_kernel_spec(contract, mutant, reference_spec(contract))
    known = [m.name for contract in REFERENCE_KERNELS for m in mutants(contract) if m.patch]
    raise BadInput(f"unknown mutant {name!r} of the draft kernel: choose from {', '.join(known)}")


#: The window rail's required parameter after the classic 13 (docs/contract.md §6).
RAIL_WINDOW = "window"


def _sglang_release(spec: str) -> bool:
    """A release spec (``kvfence.engine.kernels.release_source``): the draft kernel's are SGLang's, extracted from
    its wheels by ``kvfence.contracts.draft.release_kernels`` (``BadInput`` for another project's)."""
    source = release_source(spec)
    require(source in (None, "sglang"), f"kernel {spec!r}: the draft kernel's releases are SGLang's "
                                        f"(sglang==VERSION[:attr]), not {source}'s")
    return source is not None


def _check_classic_signature(spec: str, kernel) -> Capabilities:
    """13 positional parameters without a default (docs/contract.md §2), or 14 ending in ``window`` (the
    window rail, §6); any other must have one or be supplied. Returns what the kernel can be given."""
    _, fn, supplied = unwrap(kernel)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise BadInput(f"kernel {spec!r}: cannot read its signature") from None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is inspect.Parameter.empty and p.name not in supplied]
    rail = len(required) == CLASSIC_ARITY + 1 and required[-1].name == RAIL_WINDOW
    require(len(positional) >= CLASSIC_ARITY and required == positional[:len(required)]
            and (len(required) == CLASSIC_ARITY or rail),
            f"kernel {spec!r} takes {len(required)} required arguments "
            f"({', '.join(p.name for p in required)}); the classic ABI has {CLASSIC_ARITY} (docs/contract.md §2)")
    optional = frozenset(p.name for p in params if p not in required) & ALL_FAMILY
    return Capabilities(("window-rail",) if rail else ("draft",), optional)


def _for_device(kernel, device: str):
    """Check that a ``@triton.jit`` kernel was built for ``device`` (interpreted on CPU, compiled on CUDA)."""
    from triton.runtime.interpreter import InterpretedFunction

    ensure(device)
    interpreted = isinstance(unwrap(kernel)[0], InterpretedFunction)
    require(interpreted == (device == "cpu"),
            f"kernel was {'interpreted' if interpreted else 'compiled'} but device is {device}: "
            "choose the device before importing the kernel")
    return kernel


#: What kvfence's own kernels implement: both contracts, every §6 parameter.
REFERENCE_CAPABILITIES = Capabilities(("draft", "window-rail"), ALL_FAMILY)


def kernel_capabilities(spec: str) -> Capabilities:
    """What the kernel ``spec`` names can be given (device-independent: imports a plug-in, never launches).
    A launcher plug-in gets only ``LAUNCH_KWARGS``: the classic draft contract."""
    if spec.startswith("mutant:"):
        spec = mutant_spec(spec)
    obj = check_kernel_spec(spec)
    if spec in BUILTIN_KERNELS:
        return REFERENCE_CAPABILITIES
    if _sglang_release(spec):
        return _upstream_capabilities(release_kernels.resolve(spec)[2])
    if is_triton_kernel(obj):
        return _check_classic_signature(spec, obj)
    return Capabilities()


def check_kernel_spec(spec: str):
    """The device-independent part of ``resolve_kernel``: import the plug-in and check its signature.
    Returns the object (None for a builtin); ``BadInput`` on anything unusable. Commands that pick their
    device later (``sweep``) call it first, so a bad ``--kernel`` is reported as such."""
    require(isinstance(spec, str) and spec, "kernel spec must be a non-empty string")
    if spec in BUILTIN_KERNELS:
        return None
    if spec.startswith("mutant:"):
        spec = mutant_spec(spec)
    if _sglang_release(spec):
        release_kernels.resolve(spec)  # found in the cache (or fetched) and its ABI checked now
        return None
    obj = load_attr(spec, "kernel")
    if is_triton_kernel(obj):
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
    if spec.startswith("mutant:"):
        target = resolve_kernel(mutant_spec(spec), device)
        return KernelTarget(spec, target.launch, target.request_axis, target.capabilities)
    obj = check_kernel_spec(spec)
    if spec in BUILTIN_KERNELS:
        draft, rail = (_for_device(load_attr(reference_spec(c), "kernel"), device) for c in ("draft", "window-rail"))
        launch = abi_launcher(draft, rail, spec == "reference-blocked")
        return KernelTarget(spec, launch, capabilities=REFERENCE_CAPABILITIES)
    if _sglang_release(spec):
        return _upstream_kernel(spec, device)
    if is_triton_kernel(obj):
        caps = _check_classic_signature(spec, obj)
        kernel = _for_device(obj, device)
        rail = caps.contracts == ("window-rail",)
        return KernelTarget(spec, abi_launcher(None if rail else kernel, kernel if rail else None), capabilities=caps)
    ensure(device)
    return KernelTarget(spec, obj, request_axis=None)


def _upstream_kernel(spec: str, device: str) -> KernelTarget:
    """``sglang==VERSION[:attr]``: a kernel extracted from SGLang's wheel (``release_kernels``), fetched if
    allowed."""
    entry, attr, abi = release_kernels.resolve(spec)
    kernel = getattr(load_file(entry.module_path), attr)
    return KernelTarget(spec, _upstream_launcher(_for_device(kernel, device), abi),
                        capabilities=_upstream_capabilities(abi))


def _upstream_capabilities(abi) -> "Capabilities":
    """What an extracted kernel can be given (``Capabilities``): its contract, and the §6
    parameters its signature declares (only the classic and row-stride ABIs launch with them)."""
    params = frozenset(abi.optional) & ALL_FAMILY if abi.name in ("classic", "row-stride") else frozenset()
    return Capabilities(("window-rail",) if abi.rail else ("draft",), params)


def _upstream_launcher(kernel, abi):
    """A ``LAUNCH_KWARGS`` launcher for an extracted kernel of ABI ``abi`` (grid (steps, seqs, topk)); the
    classic and row-stride ABIs also take a §6 config's ``FAMILY_KWARGS`` (``abi_launcher``)."""
    import triton

    if abi.name in ("classic", "row-stride"):
        # Same 13 positional values (plus the rail's window); row_stride gets pool_len's (kvfence's
        # req_to_token is contiguous); the §6 constexprs by name.
        rail = abi.rail
        return abi_launcher(None if rail else kernel, kernel if rail else None)

    def launch_by_name(*, req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions, topk,
                       num_steps, page_size):
        num_seqs = seq_lens.shape[0]
        values = {"req_pool_indices": req_pool_indices, "req_to_token": req_to_token, "paged_kernel_lens": seq_lens,
                  "kv_indices": kv_indices, "kv_indptr": kv_indptr, "positions": positions, "num_seqs": num_seqs,
                  "topk": topk, "pool_len": req_to_token.shape[1], "kv_indices_stride": kv_indices.stride(0),
                  "kv_indptr_stride": kv_indptr.stride(0), "bs_upper": triton.next_power_of_2(num_seqs),
                  "iter_upper": triton.next_power_of_2(num_steps),
                  "num_tokens_upper": triton.next_power_of_2(num_seqs * topk), "page_size": page_size}
        kernel[(num_steps, num_seqs, topk)](*(values[p] for p in abi.required))

    return launch_by_name
