"""What every contract's release tooling shares about SGLang's wheels: the ``sglang==VERSION`` spec, why a release
cannot be tested (``Refused``: no kernel, or an ABI kvfence does not know) and finding a release's wheel.

The draft kernel's own release cache (its kernels extracted from the wheel, their ABIs, the manifest) is the
draft's (``kvfence.contracts.draft.release_kernels``); the release tooling reaches it through the registered
``kvfence.release.knowledge.Shipped.release_cache``, never by the contract's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

from kvfence.errors import BadInput
from kvfence.release.wheels import cache_root
from kvfence.release.wheels import find_wheel as find_project_wheel

#: ``--kernel sglang==VERSION`` or ``sglang==VERSION:attr``.
SPEC_PREFIX = "sglang=="

#: Why a release cannot be tested, read from its wheel (``Refused.status``).
NO_KERNEL = "no-kernel"
ABI_UNSUPPORTED = "abi-unsupported"
REFUSALS = (NO_KERNEL, ABI_UNSUPPORTED)


class Refused(BadInput):
    """A release kvfence cannot test for a reason inside its wheel: it has no kernel of the contract
    (``NO_KERNEL``) or its kernel fits no known ABI (``ABI_UNSUPPORTED``). The draft's cache remembers it
    (``sglang-VERSION.refused.json``), so an offline run (the release matrix on a GPU host) gives the same
    reason instead of "not in the cache"."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


def entry_folder(version: str) -> Path:
    """The cache folder of one SGLang release (the draft's entry; an offline refusal to find a wheel names it)."""
    return cache_root() / f"sglang-{version}"


def find_wheel(version: str, wheel: Optional[str], offline: bool, tmp: Path, announce,
               record: Optional[Tuple[Path, str]] = None) -> Path:
    """The ``sglang`` wheel of ``version`` (``kvfence.release.wheels.find_wheel``). ``record``: the cache record
    a command reads it for, and what is wrong with it (``missing``, ``damaged (...)``), which an offline refusal
    names rather than the release's entry."""
    where, why = record if record is not None else (entry_folder(version), "")
    return find_project_wheel("sglang", version, wheel, offline, tmp, announce, cached_in=where, why=why)
