"""Hypothesis strategies for the dsv4-topk-indices contract (docs/contract.md §12).

``topk_cases(domain)`` draws one launch as the keyword arguments of ``kvfence.contracts.dsv4_topk.case.TopkCase``
(which validates it). A valid token's indices are what the indexer gives: -1 (fewer candidates than topk) or a
compressed position below the context, at its edges (0, the context's last position, a block's last and first).
A padding token's indices are what a shared ``torch.empty`` buffer can hold in its row: -1, an index another layer
or request left (below the context), the row's wall ``W * B`` and its neighbours ``W * B - 1``, ``W * B + 1``, a
block further (the next row), and uninitialised memory (any int32, its extremes included). Padding tokens map to
row 0 as vLLM maps them (``compute_token_to_req_indices``: tokens past the batch's map to request 0), or to any
row. Everything shrinks toward one valid token of block size 16 in row 0 of a one-row table, topk 1, index -1.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvfence.draws import edge_or
from kvfence.errors import require

#: Per domain: (largest compressed context, most tokens, largest topk, most rows).
DOMAINS = {"cpu": (512, 6, 40, 4), "gpu": (32768, 64, 512, 64)}
#: Indices a token's row draws one by one (shrinkable); the rest of a wider row come from a seeded generator of
#: the same kinds (Hypothesis cannot draw a GPU-sized row element by element).
EXPLICIT = {"cpu": 40, "gpu": 8}
#: Compressed block sizes, simplest first: c4 and c128 layers at vLLM's cache block sizes (64 / 4, 256 / 4, 256 /
#: 128) and others.
BLOCK_SIZES = (16, 64, 2, 1, 4, 8)
TILES = {"cpu": (1024, 16), "gpu": (1024,)}
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


def _valid_index(draw, ctx: int, bs: int) -> int:
    if draw(st.sampled_from((False, False, True))):
        return -1
    return edge_or(draw, 0, ctx - 1, (0, ctx - 1, bs - 1, bs, ctx // bs * bs, ctx // bs * bs - 1))


def _stale_index(draw, ctx: int, bs: int, blocks: int) -> int:
    """What a padding token's row of the shared buffer can hold."""
    wall = blocks * bs
    what = draw(st.sampled_from(("minus_one", "wall", "stale", "garbage")))
    if what == "minus_one":
        return -1
    if what == "wall":
        return draw(st.sampled_from((wall, wall - 1, wall + 1, wall + bs, 2 * wall, wall + bs - 1)))
    if what == "stale":
        return draw(st.integers(0, max(0, 4 * wall)))
    return edge_or(draw, INT32_MIN, INT32_MAX, (INT32_MIN, INT32_MAX, -2, 1 << 20, 1 << 30))


def _filled(valid: bool, ctx: int, bs: int, count: int, seed: int) -> tuple:
    """``count`` more indices of a row past its explicit ones, of the kinds the explicit ones are drawn from."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if valid:
        return tuple(int(i) for i in rng.integers(-1, ctx, count))
    wall = -(-ctx // bs) * bs
    kinds = rng.integers(0, 4, count)
    stale = rng.integers(0, 4 * wall + 1, count)
    garbage = rng.integers(INT32_MIN, INT32_MAX, count, endpoint=True)
    return tuple(int(v) for v in np.choose(kinds, [np.full(count, -1), np.full(count, wall), stale, garbage]))


@st.composite
def _token(draw, ctx: int, bs: int, topk: int, rows: int, explicit: int):
    """One token: ``(row, valid, indices)``; a padding token in row 0 two times in three, as vLLM maps it."""
    shown = min(topk, explicit)
    if draw(st.sampled_from((True, True, False))):
        row, valid = draw(st.integers(0, rows - 1)), True
        head = tuple(_valid_index(draw, ctx, bs) for _ in range(shown))
    else:
        row = 0 if draw(st.sampled_from((True, True, False))) else draw(st.integers(0, rows - 1))
        valid, head = False, tuple(_stale_index(draw, ctx, bs, -(-ctx // bs)) for _ in range(shown))
    tail = _filled(valid, ctx, bs, topk - shown, draw(st.integers(0, 2 ** 16))) if topk > shown else ()
    return row, valid, head + tail


@st.composite
def topk_cases(draw, domain: str):
    require(domain in DOMAINS, f"domain={domain!r}: choose from {', '.join(DOMAINS)}")
    max_ctx, most_tokens, max_topk, most_rows = DOMAINS[domain]
    bs = draw(st.sampled_from(BLOCK_SIZES))
    ctx = edge_or(draw, 1, max_ctx, [k * bs + d for k in (1, 2, 3, 8) for d in (-1, 0, 1)] + [max_ctx])
    topk = edge_or(draw, 1, max_topk, (1, 2, 16, 17, max_topk))
    rows = draw(st.integers(1, most_rows))
    # A list, so that shrinking can drop any token (the one that reads past its row need not come first).
    tokens = draw(st.lists(_token(ctx, bs, topk, rows, EXPLICIT[domain]), min_size=1, max_size=most_tokens))
    return dict(block_size=bs, ctx=ctx, topk=topk, table_rows=rows, reqs=tuple(t[0] for t in tokens),
                valid=tuple(t[1] for t in tokens), indices=tuple(t[2] for t in tokens),
                tile=draw(st.sampled_from(TILES[domain])), seed=draw(st.integers(0, 2 ** 16)))
