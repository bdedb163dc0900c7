"""Planted bugs in a release's own kernel text, made at run time (docs/contract.md §10, "Bug classes").

A release mutant patches the text of SGLang's ``assign_req_to_token_pool`` as kvfence extracted it from the
wheel (``kvfence.release.contract_kernels``), never a copy in this repository: its ``kernel`` is
``sglang-patched==V:NAME``, which the kernel source registered here as ``sglang-patched`` (entry-point group
``kvfence.kernel_sources``) resolves by patching the cached extraction of ``sglang==V`` with the mutant's
``patch`` pairs (each must match the release's text exactly once). The release's kernel is extracted from its
wheel on first use (downloaded unless offline; offline and not cached, each such mutant is one line naming what
is missing, before anything runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

from kvfence.contract import Mutant

SOURCE = "sglang-patched"
_STRAY = ("STRAY_WRITE", "GUARD_OVERWRITE", "VALUE_MISMATCH", "MISSING_WRITE", "POISON_READ")

#: name -> (doc, detects, (release text, mutated text) pairs).
PATCHES = {
    "release_inclusive_mask": (
        "The release's kernel stores one position past end_b too (its mask made inclusive).",
        ("STRAY_WRITE", "GUARD_OVERWRITE", "POISON_READ", "VALUE_MISMATCH"),
        (("mask = save_offset < kv_end", "mask = save_offset <= kv_end  # BUG"),)),
    "release_prefix_dropped": (
        "The release's kernel reads every request's slots from the start of out_cache_loc (no prefix sum).",
        ("VALUE_MISMATCH", "POISON_READ"),
        (("out_offset = tl.sum(end - start, axis=0)", "out_offset = 0 * tl.sum(end - start, axis=0)  # BUG"),)),
    "release_row_of_program": (
        "The release's kernel writes pool row pid instead of req_pool_indices[pid].", _STRAY,
        (("tl.load(req_pool_indices + pid) * pool_len", "(pid + 0 * tl.load(req_pool_indices + pid)) * pool_len"),)),
}


def release_mutants(contract: str, version: str) -> Tuple[Mutant, ...]:
    return tuple(Mutant(name, doc, detects, patch, kernel=f"{SOURCE}=={version}:{name}")
                 for name, (doc, detects, patch) in PATCHES.items())


def patched_release(record, spec: str) -> Tuple[Path, str]:
    """The kernel source ``sglang-patched``: ``(file, function)`` of release ``V``'s kernel of ``record`` with the
    record's mutant ``NAME``'s patch applied (``sglang-patched==V:NAME``;
    ``kvfence.engine.kernels.patched_release``)."""
    from kvfence.engine.kernels import patched_release as patched

    return patched(record, spec, "sglang")
