"""The oracle: docs/contract.md §2 written as plain Python (no torch, numpy or Triton).

Read it beside docs/contract.md §2. Given what a launch is fed, it returns exactly what the kernel must write:
every kv_indices element ``(s, e)`` (step row ``s``, element ``e`` of that row, possibly past the row's
width: that is the sizing bug, not the oracle's business) and every kv_indptr column, plus, for
attributing findings, the segment ``[start, stop)`` of row ``s`` that each program ``(s, b, k)`` writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple


def draft_slot_start(L: int, k: int, topk: int, num_steps: int, page_size: int) -> int:
    """``e_k``: the req_to_token position of branch ``k``'s first draft token, for a request of length L."""
    if page_size == 1 or topk == 1:
        # Branch-major draft slots right after the prefix.
        return L + k * num_steps
    # Paged, topk > 1: each branch owns fresh pages that start with a copy of the partial last page.
    last = L % page_size
    pages_per_branch = -(-(last + num_steps) // page_size)
    base = L - last
    return base + k * pages_per_branch * page_size + last


def read_extent(L: int, topk: int, num_steps: int, page_size: int) -> int:
    """How many req_to_token slots a request of length L reads: ``max_k e_k + num_steps`` (and >= L)."""
    return max(L, max(draft_slot_start(L, k, topk, num_steps, page_size) + num_steps for k in range(topk)))


def used_length(seq_lens: Sequence[int], topk: int, s: int) -> int:
    """``U(s) = topk*sum(L) + bs*(s+1)``: entries of step row ``s`` that the kernel writes."""
    return topk * sum(seq_lens) + len(seq_lens) * topk * (s + 1)


def need(seq_lens: Sequence[int], topk: int, num_steps: int) -> int:
    """``U(num_steps-1)``: the row width a launch needs; a buffer row narrower than this overflows."""
    return used_length(seq_lens, topk, num_steps - 1)


def segment_offset(seq_lens: Sequence[int], topk: int, s: int, b: int, k: int) -> int:
    """``O(s,b,k) = topk*C_b + b*n*topk + k*(L_b + n)``: where program (s, b, k) starts in row s."""
    n = s + 1
    prefix_sum = sum(seq_lens[:b])  # C_b: exclusive, the current request is not included
    return topk * prefix_sum + b * n * topk + k * (seq_lens[b] + n)


@dataclass(frozen=True)
class ProgramSegment:
    """Program ``(s, b, k)`` writes elements ``[start, stop)`` of step row ``s`` of kv_indices."""

    s: int
    b: int
    k: int
    start: int
    stop: int


@dataclass
class WriteSet:
    """Everything one launch must write, and nothing else may change."""

    kv_indices: Dict[Tuple[int, int], int] = field(default_factory=dict)
    kv_indptr: Dict[Tuple[int, int], int] = field(default_factory=dict)
    segments: List[ProgramSegment] = field(default_factory=list)


def expected_writes(
    seq_lens: Sequence[int],
    req_pool_indices: Sequence[int],
    positions: Sequence[int],
    req_to_token: Sequence[Sequence[int]],
    topk: int,
    num_steps: int,
    page_size: int,
) -> WriteSet:
    """The write set of a launch with grid ``(num_steps, len(seq_lens), topk)``.

    ``seq_lens``, ``req_pool_indices`` and ``positions`` are what the kernel reads (after any graph
    padding); ``req_to_token[r][t]`` is the KV slot id of token ``t`` of pool row ``r``.
    """
    num_seqs = len(seq_lens)
    bs = num_seqs * topk
    out = WriteSet()
    for s in range(num_steps):
        n = s + 1
        for b in range(num_seqs):
            L = seq_lens[b]
            row = req_to_token[req_pool_indices[b]]
            for k in range(topk):
                start = segment_offset(seq_lens, topk, s, b, k)
                for t in range(L):  # prefix copy
                    out.kv_indices[(s, start + t)] = row[t]
                e_k = draft_slot_start(L, k, topk, num_steps, page_size)
                for j in range(n):  # draft tokens
                    out.kv_indices[(s, start + L + j)] = row[e_k + j]
                out.segments.append(ProgramSegment(s, b, k, start, start + L + n))

                z = b * topk + k
                if z == 0:
                    # Program (s, 0, 0) writes the last column; column 0 is never written.
                    z = bs
                out.kv_indptr[(s, z)] = sum(positions[:z]) + z * n
    return out
