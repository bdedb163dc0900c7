"""The §6 oracle (docs/contract.md §6), worked by hand: sliding window with sinks, page-granular rows,
page-table translation, and the window rail. Expected values below are computed from the contract's
words in the comments, not from the code. Rows of req_to_token hold 10, 11, 12, ... so ``token(p)`` is
``10 + p`` unless the example says otherwise."""

from hypothesis import given
from hypothesis import strategies as st

from kvfence.contracts.draft import oracle
from kvfence.contracts.draft.case import launch_batch
from kvfence.contracts.draft.strategies import batches, configs
from kvfence.contracts.draft.tokens import req_to_token_rows

ROW = list(range(10, 40))


def row_of(ws, s, length):
    return [ws.kv_indices[(s, e)] for e in range(length)]


def test_window_shorter_than_the_request_keeps_sinks_then_the_most_recent():
    # L=6, w=2, S=1: cap 3, L'=3, one sink (t=0), recent from R = 6 - (3-1) = 4: tokens 0, 4, 5;
    # then the draft token e_0 = L = 6. kv_indptr column bs=1: min(6, 3) + 1*1 = 4.
    ws = oracle.expected_writes_family([6], [0], [6], [ROW], 1, 1, 1, window_size=2, sink_size=1)
    assert row_of(ws, 0, 4) == [10, 14, 15, 16] and len(ws.kv_indices) == 4
    assert ws.kv_indptr == {(0, 1): 4}


def test_window_longer_than_the_request_is_the_classic_contract():
    # L=2, w=8: nothing clipped; tokens 0, 1, draft e_0 = 2. Indptr min(2, 8) + 1 = 3.
    ws = oracle.expected_writes_family([2], [0], [2], [ROW], 1, 1, 1, window_size=8)
    assert row_of(ws, 0, 3) == [10, 11, 12] and ws.kv_indptr == {(0, 1): 3}


def test_sink_longer_than_the_request_keeps_the_whole_request():
    # L=3, w=1, S=4: cap 5, L'=3, S_b = min(4, 3) = 3 sinks, so tokens 0, 1, 2; draft e_0 = 3.
    ws = oracle.expected_writes_family([3], [0], [3], [ROW], 1, 1, 1, window_size=1, sink_size=4)
    assert row_of(ws, 0, 4) == [10, 11, 12, 13] and ws.kv_indptr == {(0, 1): 4}


def test_window_clips_the_offsets_of_later_requests_and_branches():
    # Two requests L=(5, 1), topk=2, one step, w=2, S=0: L'=(2, 1). Request 0, branch 0 at 0 (2 tokens
    # 3, 4 + draft e_0 = 5), branch 1 at L'+n = 3 (tokens 3, 4 + draft e_1 = 5 + 1 = 6); request 1 starts at
    # topk*C'_1 + 1*n*topk = 2*2 + 2 = 6: branch 0 token 0 of row 1 + draft e_0 = 1, branch 1 at 6 + 2 = 8.
    rows = [ROW, [50 + i for i in range(30)]]
    ws = oracle.expected_writes_family([5, 1], [0, 1], [5, 5, 1, 1], rows, 2, 1, 1, window_size=2)
    assert row_of(ws, 0, 10) == [13, 14, 15, 13, 14, 16, 50, 51, 50, 52]
    # kv_indptr[0, z] = sum(min(positions[:z], 2)) + z: z=1: 2+1, z=2: 4+2, z=3: 5+3, column bs=4: 6+4.
    assert ws.kv_indptr == {(0, 1): 3, (0, 2): 6, (0, 3): 8, (0, 4): 10}


def test_page_granular_rows():
    # E=2: the row holds one entry per 2 tokens, row = [5, 9, ...]: token(p) = row[p // 2]*2 + p % 2.
    # L=3: tokens 10, 11, 18; draft e_0 = 3 -> 9*2 + 1 = 19.
    ws = oracle.expected_writes_family([3], [0], [3], [[5, 9, 4]], 1, 1, 1, entry_page_size=2)
    assert row_of(ws, 0, 4) == [10, 11, 18, 19]


def test_translated_pages():
    # TRANSLATE, page_size 2, v2p = [3, -1, 7], row = [0, 1, 4, 2]: id 0 -> 3*2 + 0 = 6, id 1 -> 7,
    # id 4 -> 7*2 + 0 = 14, draft (topk 1: e_0 = L = 3) id 2 -> max(-1*2 + 0, 0) = 0.
    ws = oracle.expected_writes_family([3], [0], [3], [[0, 1, 4, 2]], 1, 1, 2, v2p=[3, -1, 7])
    assert row_of(ws, 0, 4) == [6, 7, 14, 0]
    # A negative virtual id reads as 0.
    assert oracle.read_token([-5], 0, v2p=[3], page_size=2) == 0


def test_window_rail_start_inside_the_prefix():
    # L=5, w=3, two steps. s=0 (n=1): 6 tokens seen, keep 3 from position 3: prefix 3, 4 then chain
    # token e_0 = 5. s=1 (n=2): 7 seen, keep from 4: prefix 4, chain 5, 6. Indptr column bs=1:
    # min(positions[0] + n, w) = min(6, 3) = 3 and min(7, 3) = 3.
    ws = oracle.expected_window_rail([5], [0], [5], [ROW], 1, 2, 1, window=3)
    assert row_of(ws, 0, 3) == [13, 14, 15] and row_of(ws, 1, 3) == [14, 15, 16]
    assert ws.kv_indptr == {(0, 1): 3, (1, 1): 3} and len(ws.kv_indices) == 6


def test_window_rail_start_past_the_prefix():
    # L=1, w=1, two steps: s=0 keeps the last of 2 tokens, chain token e_0 = 1 -> 11; s=1 keeps the last
    # of 3: start 2 > L, chain from c0 = 1: token e_0 + 1 = 2 -> 12. Indptr min(1 + n, 1) = 1.
    ws = oracle.expected_window_rail([1], [0], [1], [ROW], 1, 2, 1, window=1)
    assert row_of(ws, 0, 1) == [11] and row_of(ws, 1, 1) == [12]
    assert ws.kv_indptr == {(0, 1): 1, (1, 1): 1}


@given(data=st.data())
def test_the_family_with_every_default_is_the_classic_contract(data):
    """§6: with every new parameter at its default the output equals §2 exactly (drawn cases)."""
    config = data.draw(configs())
    batch = data.draw(batches(config))
    lb = launch_batch(config, batch)
    table = req_to_token_rows(config, batch.token_seed)
    args = (lb.seq_lens, lb.req_pool_indices, lb.positions, table, config.topk, config.num_steps, config.page_size)
    classic, family = oracle.expected_writes(*args), oracle.expected_writes_family(*args)
    assert family.kv_indices == classic.kv_indices and family.kv_indptr == classic.kv_indptr
    assert family.segments == classic.segments
