"""Hypothesis strategies for the FA3 decode-metadata contract (docs/contract.md §9).

``fa3_metadata_cases(domain, page_sizes, block_tokens)`` draws one launch as the fields of the contract's case.
It first draws a scenario (``SCENARIOS``, at ``SCENARIO_ODDS``), because the contract's two edges need opposite
switches and a few examples must reach both (each scenario reaches its edge in every draw):

* ``wall``: a delta of at least 1, the context at a page boundary and the last request at the context: its
  published length needs a page past a context-sized row, and the last row's spill lands in the guard after
  the table (an earlier row's lands in the next row, whose own program may overwrite it first);
  ``ZERO_TAIL`` off, since its mask hides a missing row clamp;
* ``any``: the page-table configs of ``kvfence.contracts.page_table.strategies`` (page size, context, the delta the
  kernel adds: draft tokens in target verify), the context moved to a page boundary in half the draws with
  a delta, committed lengths up to the context (edges at the wall and at pages), ``ZERO_TAIL`` in one draw
  in three and ``SKIP_PAGE_TABLE`` in one in eight;
* ``zero_tail``: ``ZERO_TAIL`` on, a context of two pages or more and the first request of length 1 (a row
  shorter than the table, where the tail shows), with two requests or more where they fit.

``wall`` comes first, so Hypothesis's first example of every run is the simplest launch at the context wall
(page 1, context 1, delta 1, one request of length 1: a published length of 2 against a 1-page row), and a
failure shrinks toward the wall: the scenario a run must not miss, whatever its draws after the first
(they are correlated: a run of 8 examples on the GPU domain could draw no ``wall`` one). Shrinks toward
``wall``, page 1, context 1, delta 1, one request at the context, both switches off.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvfence.errors import require
from kvfence.contracts.page_table.strategies import DOMAINS, page_table_configs


#: What a draw aims at (see the module docstring); the first is where shrinking goes.
SCENARIOS = ("wall", "any", "zero_tail")
#: The scenario draw: ``zero_tail`` in one draw in two, ``wall`` and ``any`` in one in four each. The first
#: example of a run is a ``wall`` one already; ``zero_tail``'s edge needs ZERO_TAIL on, which no ``wall``
#: draw has, and at one draw in three a run of 8 examples on the GPU domain missed it in about 1 seed in 40
#: (``tests/test_contracts.py``).
SCENARIO_ODDS = ("wall", "any", "zero_tail", "zero_tail")


@st.composite
def _batch(draw, page: int, ctx: int, delta: int, domain: str, scenario: str = "any"):
    """One launch of this config: as many requests as the domain's element budget allows at this width,
    lengths biased to the page and context edges, pool rows permuted with up to two spare, the switches
    as ``scenario`` sets them."""
    _, most, max_elements = DOMAINS[domain]
    width = -(-(ctx + delta) // page)
    most = max(1, min(most, max_elements // max(1, width)))
    zero_tail = scenario == "zero_tail" or (scenario == "any" and draw(st.integers(0, 2)) == 2)
    num_seqs = draw(st.integers(min(2, most) if zero_tail else 1, most))
    edges = sorted({e for e in (1, page, page + 1, ctx - 1, ctx, (ctx // page) * page + 1) if 1 <= e <= ctx})
    lens = tuple(draw(st.sampled_from(edges) | st.integers(1, ctx)) for _ in range(num_seqs))
    if scenario == "wall":
        lens = lens[:-1] + (ctx,)
    if scenario == "zero_tail":
        lens = (1,) + lens[1:]  # a row shorter than the table (the context spans two pages or more)
    spare = draw(st.integers(0, 2))
    rows = draw(st.permutations(range(num_seqs + spare)))[:num_seqs]
    skip = scenario == "any" and draw(st.integers(0, 7)) == 7
    return dict(page_size=page, ctx=ctx, delta=delta, seq_lens=lens, req_pool_indices=tuple(rows),
                pool_rows=num_seqs + spare, zero_tail=zero_tail, skip_page_table=skip,
                seed=draw(st.integers(0, 2 ** 16)))


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
    if wall:
        delta = max(delta, 1)
    if delta and (wall or draw(st.booleans())):
        ctx = min(DOMAINS[domain][0], -(-ctx // page) * page)
    if scenario == "zero_tail":
        ctx = min(DOMAINS[domain][0], max(ctx, 2 * page))
    return page, ctx, delta


def fa3_metadata_cases(domain: str, page_sizes, block_tokens: int):
    """A scenario of ``SCENARIOS``, a config for it and one launch of that config, as the case's fields."""
    def launch(scenario: str):
        return fa3_metadata_configs(domain, page_sizes, block_tokens, scenario).flatmap(
            lambda cfg: _batch(*cfg, domain=domain, scenario=scenario))

    return st.sampled_from(SCENARIO_ODDS).flatmap(launch)
