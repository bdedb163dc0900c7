"""Planted bugs in the release kernels' own text, made at run time from the wheel (never kept in the repo).

A table contract's mutants patch kvfence's own kernel (``kernels/<contract>/``) or, here, the kernel an SGLang
release ships: ``release_mutant(contract, name, doc, detects, patch, version=...)`` declares one as a
``kvfence.contract.Mutant`` whose ``kernel`` spec is an attribute of this module. Resolving it
(``kvfence.engine.kernels``: ``mutant:NAME`` -> that spec -> ``getattr`` of this module) reads the release's wheel
as data (``KVFENCE_WHEEL_DIR``, ``pip download`` or the cache; the same wheel ``--kernel sglang==V`` uses),
extracts the contract's ``@triton.jit`` function and what it reads (``kvfence.release.extract``: never importing
the wheel), caches that text under ``$KVFENCE_CACHE/contracts/sglang-V/`` with its sha256, applies the mutant's
``(release text, mutated text)`` pairs (each must match exactly once: a release that spells the code otherwise is
one line naming the text, never a silently different mutant) and loads the result like any planted kernel. The
patched kernel must take the contract's ABI (``kvfence.engine.kernels.check_abi``).

A release whose kernel has another signature can still be planted when the patch makes it fit: the FlashMLA
kernel of PR #11985's era (0.4.10.post1 .. 0.5.3.post3) takes ``NUM_PAGE_PER_BLOCK`` as a ninth parameter; its
mutant moves that parameter into the body with the value the releases launched it with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

from kvfence.contract import Mutant

#: The release whose kernels the mutants patch unless a mutant names another.
RELEASE = "0.5.23"
#: Bumped when a cache entry of this module changes shape (an entry of another format is extracted again).
CACHE_FORMAT = 1
SPEC_MODULE = "kvfence.contracts.page_table.release_mutants"

#: Planted release mutants by attribute name: ``(contract, mutant name, release version, patch pairs)``.
_PLANTED: Dict[str, Tuple[str, str, str, Tuple[Tuple[str, str], ...]]] = {}
_BUILT: Dict[str, object] = {}


def attribute(contract: str, name: str) -> str:
    """The attribute of this module that is the planted kernel ``name`` of ``contract``."""
    return f"{contract}__{name}".replace("-", "_")


def release_mutant(contract: str, name: str, doc: str, detects, patch, *, version: str = RELEASE,
                   domain: str = "cpu", sizing=None) -> Mutant:
    """A ``Mutant`` of ``contract``: release ``version``'s kernel with ``patch`` applied, built when resolved."""
    attr = attribute(contract, name)
    _PLANTED[attr] = (contract, name, version, tuple((a, b) for a, b in patch))
    return Mutant(name, f"Mutant (release text, sglang=={version}): {doc}", tuple(detects),
                  kernel=f"{SPEC_MODULE}:{attr}", sizing=sizing, domain=domain)


def planted(contract: str) -> Dict[str, Tuple[str, Tuple[Tuple[str, str], ...]]]:
    """``{mutant name: (release version, patch pairs)}`` of ``contract``'s release mutants."""
    return {name: (version, patch) for c, name, version, patch in _PLANTED.values() if c == contract}


def versions(contract: str) -> Tuple[str, ...]:
    """The releases whose wheels ``contract``'s release mutants are made from."""
    return tuple(sorted({v for v, _ in planted(contract).values()}))


def __getattr__(attr: str):
    """A planted release kernel, built on first use in this process (PEP 562: ``module:attr`` specs)."""
    if attr.startswith("__") or attr not in _PLANTED:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    if attr not in _BUILT:
        _BUILT[attr] = _build(*_PLANTED[attr])
    return _BUILT[attr]


def _build(contract: str, name: str, version: str, patch):
    from kvfence.engine import kernels

    module, function = release_text(contract, version)
    path = kernels.patched_kernel(f"{name} ({contract}, sglang=={version})", [list(p) for p in patch], module,
                                  f"{contract}-sglang-{version}-{name}.py")
    return kernels.load_attr(f"{path}:{function}", "kernel")


# -- the release's text, extracted from its wheel as data --------------------------------------------------------
def release_text(contract: str, version: str) -> Tuple[Path, str]:
    """``(module, function)``: ``contract``'s kernel of sglang ``version`` and the jit helpers and constants it
    reads, extracted from the wheel into the cache (whatever its signature: the mutant's patch fits it), an entry
    of its own beside the contract's kernel entry (``kvfence.release.contract_kernels``)."""
    from kvfence.release.contract_kernels import contract_entry, load_contract_entry, store_extracted, wheel_source
    from kvfence.release.knowledge import upstream_of
    from kvfence.release.wheels import check_version

    check_version(version)
    where = upstream_of(contract)
    function = where.function
    module, manifest = contract_entry(version, f"{contract}.release-text")
    if load_contract_entry(module, manifest, function, CACHE_FORMAT) is not None:
        return module, function
    found, source = wheel_source(version, where.paths, function, contract)
    store_extracted(module, manifest, source, found, function, version, contract, "For its planted mutants",
                    CACHE_FORMAT)
    return module, function
