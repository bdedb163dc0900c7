"""The write set built with torch ops on the buffers' device: the fast twin of the plain oracle.

``expected_writes_torch(obs)`` returns the same ``ExpectedWrites`` as
``kvfence.contracts.draft.verdict.expected_from_oracle(obs)`` (tests/test_fastcheck.py checks equality on drawn cases),
without a Python loop over elements: on a GPU it runs where the buffers are, so a large batch's
expected contents never cross to the host. The formulas are docs/contract.md §2's and §6's (window with
sinks, page-granular rows, page-table translation, the window rail), vectorised over programs
``z = b*topk + k`` and over the elements of each program's segment.
"""

from __future__ import annotations

import torch

from kvfence.contracts.draft.verdict import ExpectedWrites, contended


def draft_slot_starts(L: torch.Tensor, k: torch.Tensor, topk: int, num_steps: int, page_size: int) -> torch.Tensor:
    """``e_k`` for lengths ``L`` and branches ``k`` (int64 tensors of one shape); see ``oracle.draft_slot_start``."""
    if page_size == 1 or topk == 1:
        return L + k * num_steps
    last = L % page_size
    pages_per_branch = torch.div(last + num_steps + page_size - 1, page_size, rounding_mode="floor")
    return (L - last) + k * pages_per_branch * page_size + last


def read_tokens(table: torch.Tensor, rows: torch.Tensor, p: torch.Tensor, config, v2p) -> torch.Tensor:
    """``token_b(p)`` (docs/contract.md §6; ``oracle.read_token``) of pool rows ``rows`` at positions ``p``."""
    E, cols = config.entry_page_size, config.pool_cols
    if E == 1:
        token = table[rows * cols + p]
    else:
        token = table[rows * cols + torch.div(p, E, rounding_mode="floor")] * E + p % E
    if v2p is None:
        return token
    ps = config.page_size
    safe = token.clamp(min=0)
    phys = v2p[torch.div(safe, ps, rounding_mode="floor")] * ps + safe % ps
    return torch.where(token < 0, torch.zeros_like(token), phys.clamp(min=0))


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
    from kvfence.contracts.draft.runner import slot_table, v2p_tensor

    table = slot_table(case.batch.token_seed, c.pool_rows, c.pool_cols, device, c).view(-1).to(torch.int64)
    v2p = v2p_tensor(c, case.batch.v2p_seed, device).to(torch.int64) if c.translate else None

    z = torch.arange(bs, device=device)
    b, k = torch.div(z, topk, rounding_mode="floor"), z % topk
    Lz, rowz = L[b], rpi[b]
    e_k = draft_slot_starts(Lz, k, topk, steps, c.page_size)
    w = c.window_size
    if c.is_rail:
        segment_source = _rail_source
    else:
        segment_source = _draft_source
        if w > 0:  # §6: lengths and positions clipped to the window and its sinks
            positions = positions.clamp(max=w + c.sink_size)
    used_rows = case.used()

    idx_pos, idx_val, ptr_pos, ptr_val, segments = [], [], [], [], []
    # Stores that may contend with an element's in-row value (``verdict.contended``): every store of an
    # element several programs write, and every store past the row width.
    other_pos, other_val = [], []
    for s in range(steps):
        n = s + 1
        starts, seg_len, src_of, column_value = segment_source(c, Lz, e_k, positions, n, bs)
        end = int((starts + seg_len).max())
        total = int(seg_len.sum())
        owner = torch.repeat_interleave(z, seg_len, output_size=total)
        t = torch.arange(total, device=device) - (torch.cumsum(seg_len, 0) - seg_len)[owner]
        e = starts[owner] + t
        value = read_tokens(table, rowz[owner], src_of(owner, t), c, v2p)
        flat = kvi.front + s * kvi.stride + e
        past = e >= kvi.width
        if end > kvi.width:  # a row overflow: where its stores land in storage
            other_pos.append(flat[past])
            other_val.append(value[past])
        if end > int(seg_len.sum()) or not bool((e[1:] > e[:-1]).all()):
            # Overlapping segments (the rail's graph padding): the later program's write wins, as the oracle.
            last = torch.full((end,), -1, dtype=torch.int64, device=device)
            last.scatter_reduce_(0, e, torch.arange(total, device=device), reduce="amax")
            keep = last[e] == torch.arange(total, device=device)
            # Elements written by several programs: any of their values is right.
            shared = (torch.bincount(e, minlength=end)[e] > 1) & ~past
            other_pos.append(flat[shared])
            other_val.append(value[shared])
            e, value = e[keep], value[keep]
        inside = e < kvi.width
        idx_pos.append(kvi.front + s * kvi.stride + e[inside])
        idx_val.append(value[inside])
        # Column z of kv_indptr, with z == 0 written as column bs (column 0 is never written).
        cols = torch.where(z == 0, torch.full_like(z, bs), z)
        ptr_pos.append(kvp.front + s * kvp.stride + cols)
        ptr_val.append(column_value(cols))
        segments.append(torch.stack([torch.full_like(z, s), b, k, starts, starts + seg_len], 1))

    indices_pos, indices_val = torch.cat(idx_pos), torch.cat(idx_val)
    return ExpectedWrites(
        indices_pos, indices_val.to(torch.int32), torch.cat(ptr_pos), torch.cat(ptr_val).to(torch.int32),
        [tuple(row) for row in torch.cat(segments).tolist()],
        used_rows,
        used_rows[-1],
        bs,
        _contended(indices_pos, indices_val, other_pos, other_val) or None,
    )


def _contended(in_pos: torch.Tensor, in_val: torch.Tensor, other_pos, other_val) -> dict:
    """``verdict.contended`` of the in-row write set ``in_pos -> in_val``, with the stores that hit it
    with another value found on the device: only those elements cross to the host."""
    if not other_pos or in_pos.numel() == 0:
        return {}
    pos, val = torch.cat(other_pos), torch.cat(other_val)
    order = torch.argsort(in_pos)
    sorted_pos, sorted_val = in_pos[order], in_val[order]
    at = torch.searchsorted(sorted_pos, pos).clamp(max=sorted_pos.numel() - 1)
    hit = (sorted_pos[at] == pos) & (sorted_val[at] != val)
    in_row = dict(zip(pos[hit].tolist(), sorted_val[at][hit].tolist()))
    return contended(in_row, zip(pos[hit].tolist(), val[hit].tolist()))


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """``out[z] = x[0] + ... + x[z-1]``, with one more element at the end: the total."""
    return torch.cat([torch.zeros(1, dtype=x.dtype, device=x.device), torch.cumsum(x, 0)])


def _draft_source(c, Lz, e_k, positions, n, bs):
    """The draft kernel (§2, §6): segments tile the row in ``z`` order, each ``L' + n`` long; element ``t``
    reads a sink (``t < S_b``), a recent token (``R_b + t - S_b``), or draft slot ``e_k + t - L'``."""
    w, S = c.window_size, c.sink_size
    Lc = Lz.clamp(max=w + S) if w > 0 else Lz
    sinks = Lz.clamp(max=S)
    recent = Lz - (Lc - sinks)
    seg_len = Lc + n
    starts = _exclusive_cumsum(seg_len)[:-1]
    before = _exclusive_cumsum(positions)

    def src_of(owner, t):
        Lo = Lc[owner]
        prefix = torch.where(t < sinks[owner], t, recent[owner] + t - sinks[owner])
        return torch.where(t < Lo, prefix, e_k[owner] + (t - Lo))

    return starts, seg_len, src_of, lambda cols: before[cols] + cols * n


def _rail_source(c, Lz, e_k, positions, n, bs):
    """The window rail (§6): branch ``z`` keeps the last ``min(L + n, w)`` of prefix-then-chain at
    ``B(s, z) = sum(min(positions[i] + n, w))``; element ``t < PL`` is prefix ``P0 + t``, the rest chain."""
    w = c.window_size
    kept = (Lz + n).clamp(max=w)
    first = Lz + n - kept
    p0 = first.clamp(max=Lz)
    pl = Lz - p0
    c0 = (first - Lz).clamp(min=0)
    bases = _exclusive_cumsum((positions + n).clamp(max=w))

    def src_of(owner, t):
        return torch.where(t < pl[owner], p0[owner] + t, e_k[owner] + c0[owner] + (t - pl[owner]))

    return bases[:-1], kept, src_of, lambda cols: bases[cols]
