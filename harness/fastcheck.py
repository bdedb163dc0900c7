"""The write set built with torch ops on the buffers' device: the fast twin of the plain oracle.

``expected_writes_torch(obs)`` returns the same ``ExpectedWrites`` as
``harness.verdict.expected_from_oracle(obs)`` (tests/test_fastcheck.py checks equality on drawn cases),
without a Python loop over elements: on a GPU it runs where the buffers are, so a large batch's
expected contents never cross to the host. The formulas are docs/contract.md §2's, vectorised over programs
``z = b*topk + k`` and over the elements of each program's segment.
"""

from __future__ import annotations

import torch

from harness import oracle
from harness.verdict import ExpectedWrites


def draft_slot_starts(L: torch.Tensor, k: torch.Tensor, topk: int, num_steps: int, page_size: int) -> torch.Tensor:
    """``e_k`` for lengths ``L`` and branches ``k`` (int64 tensors of one shape); see ``oracle.draft_slot_start``."""
    if page_size == 1 or topk == 1:
        return L + k * num_steps
    last = L % page_size
    pages_per_branch = torch.div(last + num_steps + page_size - 1, page_size, rounding_mode="floor")
    return (L - last) + k * pages_per_branch * page_size + last


def expected_writes_torch(obs) -> ExpectedWrites:
    case, lb = obs.case, obs.launch
    c = case.config
    kvi, kvp = obs.kv_indices, obs.kv_indptr
    device = kvi.storage.device
    topk, steps = c.topk, c.num_steps
    m = lb.num_seqs
    bs = m * topk
    # The inputs as the kernel saw them (the runner's static tensors hold exactly these rows).
    L = torch.tensor(lb.seq_lens, dtype=torch.int64, device=device)
    rpi = torch.tensor(lb.req_pool_indices, dtype=torch.int64, device=device)
    positions = torch.tensor(lb.positions, dtype=torch.int64, device=device)
    from harness.runner import slot_table

    table = slot_table(case.batch.token_seed, c.pool_rows, c.pool_len, device).view(-1).to(torch.int64)

    z = torch.arange(bs, device=device)
    b, k = torch.div(z, topk, rounding_mode="floor"), z % topk
    Lz, rowz = L[b], rpi[b]
    e_k = draft_slot_starts(Lz, k, topk, steps, c.page_size)
    pos_prefix = torch.cumsum(positions, 0) - positions  # sum(positions[:z])
    total_positions = positions.sum()

    idx_pos, idx_val, ptr_pos, ptr_val, segments = [], [], [], [], []
    for s in range(steps):
        n = s + 1
        seg_len = Lz + n
        starts = torch.cumsum(seg_len, 0) - seg_len  # segments tile the row, request-major then branch
        used = oracle.used_length(lb.seq_lens, topk, s)
        owner = torch.repeat_interleave(z, seg_len, output_size=used)
        t = torch.arange(used, device=device) - starts[owner]
        Lo = Lz[owner]
        src = torch.where(t < Lo, t, e_k[owner] + (t - Lo))
        value = table[rowz[owner] * c.pool_len + src]
        e = torch.arange(used, device=device)
        inside = e < kvi.width
        idx_pos.append(kvi.front + s * kvi.stride + e[inside])
        idx_val.append(value[inside])
        # kv_indptr[s, z] = sum(positions[:z]) + z*n, with z == 0 written as column bs.
        cols = torch.where(z == 0, torch.full_like(z, bs), z)
        ptr_pos.append(kvp.front + s * kvp.stride + cols)
        ptr_val.append(torch.where(z == 0, total_positions, pos_prefix) + cols * n)
        segments.append(torch.stack([torch.full_like(z, s), b, k, starts, starts + seg_len], 1))

    return ExpectedWrites(
        torch.cat(idx_pos), torch.cat(idx_val).to(torch.int32), torch.cat(ptr_pos), torch.cat(ptr_val).to(torch.int32),
        [tuple(row) for row in torch.cat(segments).tolist()],
        [oracle.used_length(lb.seq_lens, topk, s) for s in range(steps)],
        oracle.need(lb.seq_lens, topk, steps),
        bs,
    )
