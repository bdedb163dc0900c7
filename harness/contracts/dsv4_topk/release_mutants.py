"""Planted bugs in vLLM's own kernel text, made at run time (docs/contract.md §12, "Self-test").

Two are the releases as shipped (``vllm==0.34.0``: DeepSeek-V4's kernel; ``vllm==0.34.0:v41``: V4.1's): the
self-test counts how often the plain fuzz finds the bug the issue names. The others patch the text of V4's kernel as
kvfence extracted it from the wheel (``kvfence.release.vllm_kernels``), never a copy in this repository: the fix's
bound put into the release's load with a planted mistake. Their ``kernel`` is ``vllm-patched==V:NAME``, which the
kernel source registered here as ``vllm-patched`` (entry-point group ``kvfence.kernel_sources``) resolves by patching
the cached extraction of ``vllm==V`` with the mutant's ``patch`` pairs (each must match the release's text exactly
once). The release's kernel is read from its wheel on first use (``KVFENCE_WHEEL_DIR``, or downloaded unless
offline; offline and not cached, each such mutant is one line naming what is missing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Tuple

from kvfence.contract import Mutant

SOURCE = "vllm-patched"
#: The release whose kernels the mutants are and patch.
RELEASE = "0.34.0"
#: What catches a load past a row: the poison of a guard or a spare row, another request's block id, a load outside
#: the table (the CPU's address audit).
READ_PAST = ("POISON_READ", "VALUE_MISMATCH", "OOB_READ")
#: An unbounded load: a padding token's garbage index (up to 2**31 - 1) reads blocks far past the table, outside its
#: allocation; on CUDA that load faults (``CRASH``, the kernel's illegal address: 11 of 20 seeds on an H100), on the
#: CPU the address audit sees it first (``OOB_READ``).
READ_UNBOUNDED = READ_PAST + ("CRASH",)
_LOAD_MASK = "mask=mask & is_valid,"
_SLOT = "slot_ids = tl.where(is_valid, slot_ids, -1)"

#: name -> (doc, detects, (release text, mutated text) pairs).
PATCHES = {
    "release_fix_one_past": (
        "The fix's row bound in the release's load and slot, one block too far (<= the stride) and without the "
        "valid-token gate: a padding token's index in the first block past the row reads the next row.", READ_PAST,
        ((_LOAD_MASK, "mask=mask & is_valid & (block_indices <= block_table_stride),  # BUG: one past"),
         (_SLOT, "slot_ids = tl.where(is_valid & (block_indices <= block_table_stride), slot_ids, -1)"))),
    "release_fix_load_only": (
        "The fix's bound in the release's load but not in its slot: an index past the row maps to a slot made of "
        "what the masked load left (not -1).", ("VALUE_MISMATCH",),
        ((_LOAD_MASK, "mask=mask & is_valid & (block_indices < block_table_stride),  # BUG: the slot is not"),)),
}
#: The patch that makes the release's text the fix (vllm#57388's bound and gate): a positive control, not a mutant.
#: The token's flag joins the block through tl.where: the interpreter refuses a mask of ``block & scalar bool``.
_FIXED = "tl.where(is_valid_token != 0, is_valid & (block_indices < block_table_stride), False)"
FIX = ((_LOAD_MASK, f"mask=mask & {_FIXED},"), (_SLOT, f"slot_ids = tl.where({_FIXED}, slot_ids, -1)"))


def release_mutants() -> Tuple[Mutant, ...]:
    shipped = (
        Mutant("release_v4_as_shipped", f"vllm=={RELEASE}'s DeepSeek-V4 kernel as shipped (cache_utils.py:592-643): "
               "the block-table load masked by idx >= 0 only.", READ_UNBOUNDED, kernel=f"vllm=={RELEASE}"),
        Mutant("release_v41_as_shipped", f"vllm=={RELEASE}'s DeepSeek-V4.1 kernel as shipped (deepseek_v41 "
               "cache_utils.py:763-811): the same load.", READ_UNBOUNDED, kernel=f"vllm=={RELEASE}:v41"),
    )
    return shipped + tuple(Mutant(name, f"Mutant (release text, vllm=={RELEASE}): {doc}", detects, patch,
                                  kernel=f"{SOURCE}=={RELEASE}:{name}")
                           for name, (doc, detects, patch) in PATCHES.items())


def patched_release(record, spec: str) -> Tuple[Path, str]:
    """The kernel source ``vllm-patched``: ``(file, function)`` of release ``V``'s DeepSeek-V4 kernel of ``record``
    with the record's mutant ``NAME``'s patch applied (``vllm-patched==V:NAME``;
    ``kvfence.engine.kernels.patched_release``)."""
    from kvfence.engine.kernels import patched_release as patched

    return patched(record, spec, "vllm")
