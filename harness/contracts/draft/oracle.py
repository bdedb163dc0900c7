"""The oracle: docs/contract.md §2 written as plain Python (no torch, numpy or Triton).

Read it beside docs/contract.md §2. Given what a launch is fed, it returns exactly what the kernel must write:
every kv_indices element ``(s, e)`` (step row ``s``, element ``e`` of that row, possibly past the row's
width: that is the sizing bug, not the oracle's business) and every kv_indptr column, plus, for
attributing findings, the segment ``[start, stop)`` of row ``s`` that each program ``(s, b, k)`` writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple


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
    #: Elements two programs write with different values (the window rail's graph padding, §6): any of
    #: these values is right, since which program writes last is up to the device.
    either: Dict[Tuple[int, int], Set[int]] = field(default_factory=dict)


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


# -- the newer upstream family (docs/contract.md §6) -------------------------------------------------------
# Plain Python again, from the contract's words. ``kvfence.contracts.draft.case.Case.expected`` uses these for a config
# with any §6 field set (``Config.is_family``); with every default they equal §2's functions above.


def read_token(row: Sequence[int], p: int, *, entry_page_size: int = 1, v2p: Optional[Sequence[int]] = None,
               page_size: int = 1) -> int:
    """``token_b(p)``: the KV slot of token position ``p`` of a request whose req_to_token row is ``row``.

    ``entry_page_size = E > 1``: the row holds one entry per page of ``E`` tokens. ``v2p`` (TRANSLATE):
    the id is virtual and maps through the page table, one entry per page of ``page_size`` tokens; a
    negative id reads as 0, and a negative result is clipped to 0.
    """
    if entry_page_size == 1:
        token = row[p]
    else:
        token = row[p // entry_page_size] * entry_page_size + p % entry_page_size
    if v2p is None:
        return token
    if token < 0:
        return 0
    return max(v2p[token // page_size] * page_size + token % page_size, 0)


def clipped_length(L: int, window_size: int, sink_size: int) -> int:
    """``L'``: the committed length the sliding-window draft sees (``min(L, w + S)``; ``L`` with no window)."""
    return min(L, window_size + sink_size) if window_size > 0 else L


def used_length_family(seq_lens: Sequence[int], topk: int, s: int, window_size: int = 0, sink_size: int = 0) -> int:
    """``U(s)`` of the draft kernel under a window: ``topk*sum(L') + bs*(s+1)`` (``used_length`` without one)."""
    if window_size <= 0:
        return used_length(seq_lens, topk, s)  # L' = L
    return used_length([clipped_length(L, window_size, sink_size) for L in seq_lens], topk, s)


def rail_used(seq_lens: Sequence[int], positions: Sequence[int], topk: int, s: int, window: int) -> int:
    """Entries of step row ``s`` the window rail writes: ``B(s, bs) = sum(min(positions[i] + n, w))``, or one
    more when a graph-padding branch (``L = 1``, position 0) is last: its window keeps ``min(1 + n, w)``
    tokens but its base advances by ``min(n, w)``, so it ends one past ``B(s, bs)`` (see
    ``expected_window_rail``)."""
    n = s + 1
    base, end = 0, 0
    for z, p in enumerate(positions):
        end = max(end, base + min(seq_lens[z // topk] + n, window))
        base += min(p + n, window)
    return max(base, end)


def expected_writes_family(seq_lens: Sequence[int], req_pool_indices: Sequence[int], positions: Sequence[int],
                           req_to_token: Sequence[Sequence[int]], topk: int, num_steps: int, page_size: int, *,
                           window_size: int = 0, sink_size: int = 0, entry_page_size: int = 1,
                           v2p: Optional[Sequence[int]] = None) -> WriteSet:
    """The write set of the 0.5.2x draft kernel (§6): §2 with every length clipped to the window and its
    sinks, and every token read through ``read_token``. With every default it is ``expected_writes``."""
    num_seqs = len(seq_lens)
    bs = num_seqs * topk
    clipped = [clipped_length(L, window_size, sink_size) for L in seq_lens]
    cap = window_size + sink_size
    out = WriteSet()
    for s in range(num_steps):
        n = s + 1
        for b in range(num_seqs):
            L, Lc = seq_lens[b], clipped[b]
            row = req_to_token[req_pool_indices[b]]
            sinks = min(sink_size, L)
            recent = L - (Lc - sinks)  # first recent position kept after the sinks

            def token(p, row=row):
                return read_token(row, p, entry_page_size=entry_page_size, v2p=v2p, page_size=page_size)

            for k in range(topk):
                start = topk * sum(clipped[:b]) + b * n * topk + k * (Lc + n)
                for t in range(Lc):
                    out.kv_indices[(s, start + t)] = token(t if t < sinks else recent + t - sinks)
                e_k = draft_slot_start(L, k, topk, num_steps, page_size)  # from the full length
                for j in range(n):
                    out.kv_indices[(s, start + Lc + j)] = token(e_k + j)
                out.segments.append(ProgramSegment(s, b, k, start, start + Lc + n))
                z = b * topk + k or bs
                clip = (lambda x: min(x, cap)) if window_size > 0 else (lambda x: x)
                out.kv_indptr[(s, z)] = sum(clip(x) for x in positions[:z]) + z * n
    return out


def expected_window_rail(seq_lens: Sequence[int], req_pool_indices: Sequence[int], positions: Sequence[int],
                         req_to_token: Sequence[Sequence[int]], topk: int, num_steps: int, page_size: int, *,
                         window: int, entry_page_size: int = 1, v2p: Optional[Sequence[int]] = None) -> WriteSet:
    """The write set of ``generate_draft_decode_window_kv_indices`` (§6, the window rail): step ``s`` of
    branch ``(b, k)`` keeps the last ``min(L + n, w)`` of the ``L + n`` tokens it sees (committed prefix,
    then its own draft chain), at ``B(s, z) = sum(min(positions[i] + n, w) for i < z)``.

    Bases come from ``positions`` and lengths from ``L``: for a graph-padding branch (``L = 1``, position
    0) they disagree and, when ``n < w``, its segment overlaps the next one's first element. Programs
    are taken in grid order ``z = 0, 1, ...`` and a later write wins (the interpreter's order); on a GPU
    the overlap is a race in the padding, which nothing reads, so ``either`` lists both values and the
    verdict accepts any of them."""
    num_seqs = len(seq_lens)
    bs = num_seqs * topk
    out = WriteSet()
    for s in range(num_steps):
        n = s + 1
        bases = [sum(min(p + n, window) for p in positions[:z]) for z in range(bs + 1)]
        for b in range(num_seqs):
            L = seq_lens[b]
            row = req_to_token[req_pool_indices[b]]
            for k in range(topk):
                z = b * topk + k
                kept = min(L + n, window)
                first = L + n - kept  # position of the first kept token in prefix-then-chain order
                prefix_from = min(first, L)
                prefix_len = L - prefix_from
                chain_from = max(first - L, 0)
                base = bases[z]
                e_k = draft_slot_start(L, k, topk, num_steps, page_size)
                tokens = [read_token(row, prefix_from + t, entry_page_size=entry_page_size, v2p=v2p,
                                     page_size=page_size) for t in range(prefix_len)]
                tokens += [read_token(row, e_k + chain_from + j, entry_page_size=entry_page_size, v2p=v2p,
                                      page_size=page_size) for j in range(n - chain_from)]
                for t, value in enumerate(tokens):
                    key = (s, base + t)
                    earlier = out.kv_indices.get(key)
                    if earlier is not None and earlier != value:
                        out.either.setdefault(key, {earlier}).add(value)
                    out.kv_indices[key] = value
                out.segments.append(ProgramSegment(s, b, k, base, base + kept))
                column = z or bs
                out.kv_indptr[(s, column)] = bases[column]
    return out
