"""The oracle against examples worked by hand from docs/contract.md §2, and the contract's invariants.

In the hand-worked examples ``req_to_token[r][t] = 100*r + t`` so every expected value can be read
back to the (row, token) it came from.
"""

from hypothesis import given
from hypothesis import strategies as st

from kvfence.contracts.draft import oracle
from kvfence.contracts.draft.case import Batch, Config, launch_batch
from kvfence.contracts.draft.strategies import batches, configs

TABLE = [[100 * r + t for t in range(64)] for r in range(8)]


def row(ws, s):
    """Step row ``s`` of a write set as a dense list (the written prefix)."""
    cols = sorted(e for (r, e) in ws.kv_indices if r == s)
    assert cols == list(range(len(cols))), "segments must tile the row with no gaps"
    return [ws.kv_indices[(s, e)] for e in cols]


def indptr(ws, s):
    return {z: v for (r, z), v in ws.kv_indptr.items() if r == s}


def test_topk1_two_requests_two_steps():
    # seq_lens [2, 1] in pool rows [1, 0]; positions = seq_lens. Step 0 (n=1):
    #   b=0: O = 0: prefix row1[0:2] = 100, 101; draft e = L = 2 -> 102.
    #   b=1: O = topk*C_1 + b*n*topk = 2 + 1 = 3: prefix row0[0] = 0; draft e = 1 -> 1.
    # Step 1 (n=2): b=1 starts at 2 + 1*2*1 = 4 and gets two draft tokens row0[1:3].
    ws = oracle.expected_writes([2, 1], [1, 0], [2, 1], TABLE, topk=1, num_steps=2, page_size=1)
    assert row(ws, 0) == [100, 101, 102, 0, 1]
    assert row(ws, 1) == [100, 101, 102, 103, 0, 1, 2]
    # kv_indptr[s, z] = sum(positions[:z]) + z*n; z == 0 is moved to bs = 2, column 0 never written.
    assert indptr(ws, 0) == {1: 2 + 1, 2: 3 + 2}
    assert indptr(ws, 1) == {1: 2 + 2, 2: 3 + 4}
    assert oracle.need([2, 1], 1, 2) == 7


def test_topk3_page1_branch_major_draft_slots():
    # One request of length 2, topk 3, two steps. Branch k's drafts start at e_k = L + k*num_steps
    # = 2, 4, 6; its segment starts at O = k*(L + n).
    ws = oracle.expected_writes([2], [0], [2, 2, 2], TABLE, topk=3, num_steps=2, page_size=1)
    assert row(ws, 0) == [0, 1, 2, 0, 1, 4, 0, 1, 6]
    assert row(ws, 1) == [0, 1, 2, 3, 0, 1, 4, 5, 0, 1, 6, 7]
    assert indptr(ws, 0) == {1: 2 + 1, 2: 4 + 2, 3: 6 + 3}
    assert indptr(ws, 1) == {1: 2 + 2, 2: 4 + 4, 3: 6 + 6}


def test_topk2_page4_branches_own_fresh_pages():
    # L = 5, page 4: last = 1, pages_per_branch = ceil((1+2)/4) = 1, base = 4,
    # e_k = 4 + k*1*4 + 1 = 5, 9: branch 1 copies from its own page, offset by the partial page.
    assert [oracle.draft_slot_start(5, k, 2, 2, 4) for k in range(2)] == [5, 9]
    ws = oracle.expected_writes([5], [0], [5, 5], TABLE, topk=2, num_steps=2, page_size=4)
    assert row(ws, 0) == [0, 1, 2, 3, 4, 5] + [0, 1, 2, 3, 4, 9]
    assert row(ws, 1) == [0, 1, 2, 3, 4, 5, 6] + [0, 1, 2, 3, 4, 9, 10]
    # L = 6, three steps: last = 2, pages_per_branch = ceil(5/4) = 2, e_k = 4 + 8k + 2.
    assert [oracle.draft_slot_start(6, k, 3, 3, 4) for k in range(3)] == [6, 14, 22]
    # topk == 1 keeps the flat layout even with pages.
    assert oracle.draft_slot_start(6, 0, 1, 3, 4) == 6


def test_padded_batch_follows_positions_for_indptr_and_seq_lens_for_indices():
    config = Config(topk=2, num_steps=1, max_bs=4, ctx=8, mode="graph")
    lb = launch_batch(config, Batch((3, 1, 2), (2, 0, 3)))
    # Bucket 4: the runner pads one request with seq_len 1, position 0, pool index 0.
    assert lb.seq_lens == (3, 1, 2, 1)
    assert lb.req_pool_indices == (2, 0, 3, 0)
    assert lb.positions == (3, 3, 1, 1, 2, 2, 0, 0)
    ws = oracle.expected_writes(lb.seq_lens, lb.req_pool_indices, lb.positions, TABLE, 2, 1, 1)
    r = row(ws, 0)
    # Padded request b=3: C_3 = 6, O = 2*6 + 3*1*2 + k*(1+1) = 18 + 2k; it copies pool row 0.
    assert r[18:22] == [0, 1, 0, 2]
    assert len(r) == oracle.used_length(lb.seq_lens, 2, 0) == 22
    # Its indptr comes from positions (0 for padding): z = 6, 7 and z = 0 -> 8.
    assert indptr(ws, 0)[6] == 12 + 6 and indptr(ws, 0)[7] == 12 + 7 and indptr(ws, 0)[8] == 12 + 8
    # ... so the last column (20) no longer equals the used length (22): padded rows are inconsistent.
    assert indptr(ws, 0)[8] != len(r)


def test_eager_mode_does_not_pad():
    config = Config(topk=2, num_steps=1, max_bs=4, ctx=8, mode="eager")
    lb = launch_batch(config, Batch((3, 1, 2), (2, 0, 3)))
    assert lb.seq_lens == (3, 1, 2) and lb.num_seqs == 3


@given(st.data())
def test_segments_tile_rows_and_indptr_marks_branch_starts(data):
    """Contract invariants on unpadded (eager) launches: the segments of row s tile [0, U(s)) in
    request-major, branch-minor order, and with production positions kv_indptr[s, z] is where branch
    z starts (kv_indptr[s, bs] = U(s))."""
    config = data.draw(configs(mode="eager"))
    batch = data.draw(batches(config))
    lb = launch_batch(config, batch)
    table = [[1000 * r + t for t in range(config.pool_len)] for r in range(config.pool_rows)]
    ws = oracle.expected_writes(lb.seq_lens, lb.req_pool_indices, lb.positions, table, config.topk,
                                config.num_steps, config.page_size)
    bs = lb.num_seqs * config.topk
    for s in range(config.num_steps):
        segs = [g for g in ws.segments if g.s == s]
        assert [(g.b, g.k) for g in segs] == [(b, k) for b in range(lb.num_seqs) for k in range(config.topk)]
        assert segs[0].start == 0 and segs[-1].stop == oracle.used_length(lb.seq_lens, config.topk, s)
        assert all(a.stop == b.start for a, b in zip(segs, segs[1:]))
        cols = indptr(ws, s)
        assert sorted(cols) == list(range(1, bs + 1))
        for z in range(1, bs):
            assert cols[z] == segs[z].start
        assert cols[bs] == segs[-1].stop
        # Reads stay inside the pool row: the config's pool_len covers every draft slot.
        for g in segs:
            L = lb.seq_lens[g.b]
            assert (oracle.draft_slot_start(L, g.k, config.topk, config.num_steps, config.page_size) + s + 1
                    <= config.pool_len)
