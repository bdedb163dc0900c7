"""Hypothesis strategies for the FA3 decode-metadata contract (docs/contract.md §9).

``fa3_metadata_cases(domain, page_sizes, block_tokens)`` draws one launch as the fields of the contract's case.
It first draws a scenario (``SCENARIOS``, at the domain's ``SCENARIO_ODDS``), because the contract's edges need
opposite switches and a few examples must reach each (each scenario reaches its edge in every draw):

* ``wall``: a delta of at least 1, the context at a page boundary and the last request at the context: its
  published length needs a page past a context-sized row, and the last row's spill lands in the guard after
  the table (an earlier row's lands in the next row, whose own program may overwrite it first);
  ``ZERO_TAIL`` off, since its mask hides a missing row clamp;
* ``any``: the page-table configs of ``kvfence.contracts.page_table.strategies`` (page size, context, the delta the
  kernel adds: draft tokens in target verify), the context moved to a page boundary in half the draws with
  a delta, committed lengths up to the context (edges at the wall, at pages and at column blocks), ``ZERO_TAIL``
  in one draw in three and ``SKIP_PAGE_TABLE`` in one in eight;
* ``zero_tail``: ``ZERO_TAIL`` on, a context of two pages or more and the first request of length 1 (a row
  shorter than the table, where the tail shows), with two requests or more where they fit;
* ``block`` (the CPU domain's odds): a delta of at least 1 and the last request's *published* length at a
  boundary of the kernel's column blocks (``BLOCK_COLS`` pages, 256 at page 1 and 128 above: 256, 2048, 4096 and
  8192 tokens; the page size lowered to one whose block the domain holds): in half the draws the committed
  length at ``k * BLOCK_COLS * P`` (the delta carries its published length into the next block), else the
  published length at that boundary plus an offset of ``BOUNDARY_OFFSETS``; the context at most one block
  longer (the table's last blocks are the boundary's); ``ZERO_TAIL`` in half the draws, with the first request
  of length 1 where there are two or more (Hypothesis generates long runs of one scenario, mutating its later
  choices: this one carries the ``zero_tail`` edge too).

``wall`` comes first, so Hypothesis's first example of every run is the simplest launch at the context wall
(page 1, context 1, delta 1, one request of length 1: a published length of 2 against a 1-page row), and a
failure shrinks toward the wall: the scenario a run must not miss, whatever its draws after the first
(they are correlated: a run of 8 examples on the GPU domain could draw no ``wall`` one). Shrinks toward
``wall``, page 1, context 1, delta 1, one request at the context, both switches off. The slot layout's seed is a
digest of the other fields (``kvfence.contracts.page_table.strategies.layout_seed``), no choice of its own.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvfence.contracts.page_table.strategies import BOUNDARY_OFFSETS, DOMAINS, layout_seed, page_table_configs
from kvfence.errors import require

#: What a draw aims at (see the module docstring); the first is where shrinking goes.
SCENARIOS = ("wall", "any", "zero_tail", "block")
#: The scenario draw, by domain. GPU: ``zero_tail`` in one draw in two, ``wall`` in one in three, ``any`` in one in
#: six; the first example of a run is a ``wall`` one already; ``zero_tail``'s edge needs ZERO_TAIL on, which no
#: ``wall`` draw has, and at one draw in three a run of 8 examples on the GPU domain missed it in about 1 seed in
#: 40 (``tests/test_contracts.py``); with ``wall`` at one in four, 300 draws spilled in 15 % of them. CPU: ``block``
#: in three draws of seven, ``zero_tail`` in two, ``wall`` and ``any`` in one each (the column blocks past the
#: first are where the CPU domain reaches the kernel's block arithmetic).
SCENARIO_ODDS = {"gpu": ("wall", "any", "zero_tail", "wall", "zero_tail", "zero_tail"),
                 "cpu": ("wall", "block", "zero_tail", "block", "any", "zero_tail", "block")}


def block_columns(page: int) -> int:
    """Pages one program of the kernel covers (``BLOCK_COLS``, as the launcher picks it for a page table)."""
    from kvfence.kernels.fa3_metadata.fa3_decode_metadata import block_cols

    return block_cols(page, False)


def column_block_edges(page: int, delta: int, ctx: int):
    """Committed lengths in ``[1, ctx]`` at a column-block boundary (their published length crosses it by the
    delta) or whose published length (plus ``delta``) sits at one of its offsets."""
    block = block_columns(page) * page
    return sorted({k * block + d - delta for k in range(1, (ctx + delta) // block + 2)
                   for d in (delta,) + BOUNDARY_OFFSETS(page) if 1 <= k * block + d - delta <= ctx})


@st.composite
def _batch(draw, page: int, ctx: int, delta: int, domain: str, scenario: str = "any", pinned=None):
    """One launch of this config: as many requests as the domain's element budget allows at this width,
    lengths biased to the page, column-block and context edges, pool rows permuted with up to two spare, the
    switches as ``scenario`` sets them; ``pinned``: the last request's length."""
    _, most, max_elements = DOMAINS[domain]
    width = -(-(ctx + delta) // page)
    most = max(1, min(most, max_elements // max(1, width)))
    zero_tail = scenario == "zero_tail" or (scenario == "any" and draw(st.integers(0, 2)) == 2) \
        or (scenario == "block" and draw(st.booleans()))
    num_seqs = draw(st.integers(min(2, most) if zero_tail else 1, most))
    edges = sorted({e for e in (1, page, page + 1, ctx - 1, ctx, (ctx // page) * page + 1) if 1 <= e <= ctx}
                   | set(column_block_edges(page, delta, ctx)))
    lens = tuple(draw(st.sampled_from(edges) | st.integers(1, ctx)) for _ in range(num_seqs))
    if scenario == "wall":
        lens = lens[:-1] + (ctx,)
    if pinned is not None:
        lens = lens[:-1] + (pinned,)
    if scenario == "zero_tail" or (zero_tail and scenario == "block" and num_seqs > 1):
        lens = (1,) + lens[1:]  # a row shorter than the table (the context spans two pages or more)
    spare = draw(st.integers(0, 2))
    rows = draw(st.permutations(range(num_seqs + spare)))[:num_seqs]
    skip = scenario == "any" and draw(st.integers(0, 7)) == 7
    return dict(page_size=page, ctx=ctx, delta=delta, seq_lens=lens, req_pool_indices=tuple(rows),
                pool_rows=num_seqs + spare, zero_tail=zero_tail, skip_page_table=skip)


@st.composite
def fa3_metadata_configs(draw, domain: str, page_sizes, block_tokens: int, scenario: str = "any"):
    """``page_table_configs``, with the context moved up to a page boundary in half the draws that carry a
    delta (in every ``wall`` draw, which also makes the delta at least 1): the committed lengths stop at the
    context and the kernel adds the delta, so a published length needs a page past ``ceil(ctx / P)`` only
    when the context ends within ``delta`` of a page boundary (the wall this contract's sizing bugs sit at).
    A ``zero_tail`` draw's context spans two pages or more. Shrinks toward the unmoved context."""
    require(scenario in SCENARIOS, f"scenario={scenario!r}: choose from {', '.join(SCENARIOS)}")
    wall = scenario == "wall"
    page, ctx, delta = draw(page_table_configs(domain, tuple(page_sizes), block_tokens))
    if wall or scenario == "block":
        delta = max(delta, 1)
    if delta and (wall or draw(st.booleans())):
        ctx = min(DOMAINS[domain][0], -(-ctx // page) * page)
    if scenario == "zero_tail":
        ctx = min(DOMAINS[domain][0], max(ctx, 2 * page))
    return page, ctx, delta


@st.composite
def _launch(draw, domain: str, page_sizes, block_tokens: int, scenario: str):
    page, ctx, delta = draw(fa3_metadata_configs(domain, page_sizes, block_tokens, scenario))
    pinned = None
    if scenario == "block":
        max_ctx = DOMAINS[domain][0]
        # A page size whose second column block the domain holds (the CPU's: below 128), drawn here, after the
        # config (the runs of one scenario Hypothesis generates vary its later choices): page 1 in half the draws,
        # the only one whose blocks are 256 columns, and the cheapest (256 tokens a block).
        fitting = [p for p in page_sizes if block_columns(p) * p < max_ctx]
        page = fitting[0] if draw(st.booleans()) else draw(st.sampled_from(fitting))
        block = block_columns(page) * page
        k = draw(st.integers(1, max(1, (max_ctx + delta) // block)))
        # In half the draws the committed length at the boundary (its published length crosses it by the delta),
        # else the published length at one of the boundary's offsets.
        crossing = draw(st.booleans())
        offset = delta if crossing else draw(st.sampled_from(BOUNDARY_OFFSETS(page)))
        pinned = max(1, min(max_ctx, k * block + offset - delta))
        ctx = min(max_ctx, pinned + draw(st.integers(0, block)))  # the table's last block holds the boundary's
    fields = draw(_batch(page, ctx, delta, domain, scenario, pinned))
    return dict(fields, seed=layout_seed(fields))


def fa3_metadata_cases(domain: str, page_sizes, block_tokens: int):
    """A scenario of the domain's ``SCENARIO_ODDS``, a config for it and one launch of that config, as the case's
    fields."""
    require(domain in SCENARIO_ODDS, f"domain={domain!r}: choose from {', '.join(SCENARIO_ODDS)}")
    return st.sampled_from(SCENARIO_ODDS[domain]).flatmap(
        lambda scenario: _launch(domain, tuple(page_sizes), block_tokens, scenario))
