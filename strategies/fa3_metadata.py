"""Hypothesis strategies for the FA3 decode-metadata contract (docs/contract.md §9).

``fa3_metadata_cases(domain, page_sizes, block_tokens)`` draws one launch as the fields of the contract's case.
It first draws a scenario (``SCENARIOS``), one in three each, because the contract's two edges need opposite
switches and a few examples must reach both:

* ``any``: the page-table configs of ``kvfence.strategies.page_table`` (page size, context, the delta the
  kernel adds: draft tokens in target verify), the context moved to a page boundary in half the draws with
  a delta, committed lengths up to the context (edges at the wall and at pages), ``ZERO_TAIL`` in one draw
  in three and ``SKIP_PAGE_TABLE`` in one in eight;
* ``wall``: a delta of at least 1, the context at a page boundary and the last request at the context: its
  published length needs a page past a context-sized row, and the last row's spill lands in the guard after
  the table (an earlier row's lands in the next row, whose own program may overwrite it first);
  ``ZERO_TAIL`` off, since its mask hides a missing row clamp;
* ``zero_tail``: ``ZERO_TAIL`` on with two requests or more where they fit (it shows only on a row shorter
  than the table).

Shrinks toward ``any``, page 1, context 1, delta 0, one request of length 1, both switches off.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvfence.strategies.page_table import DOMAINS, page_table_configs


#: What a draw aims at (see the module docstring); the first is where shrinking goes.
SCENARIOS = ("any", "wall", "zero_tail")


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
    spare = draw(st.integers(0, 2))
    rows = draw(st.permutations(range(num_seqs + spare)))[:num_seqs]
    skip = scenario == "any" and draw(st.integers(0, 7)) == 7
    return dict(page_size=page, ctx=ctx, delta=delta, seq_lens=lens, req_pool_indices=tuple(rows),
                pool_rows=num_seqs + spare, zero_tail=zero_tail, skip_page_table=skip,
                seed=draw(st.integers(0, 2 ** 16)))


@st.composite
def fa3_metadata_configs(draw, domain: str, page_sizes, block_tokens: int, wall: bool = False):
    """``page_table_configs``, with the context moved up to a page boundary in half the draws that carry a
    delta (in every draw with ``wall``, which also makes the delta at least 1): the committed lengths stop
    at the context and the kernel adds the delta, so a published length needs a page past ``ceil(ctx / P)``
    only when the context ends within ``delta`` of a page boundary (the wall this contract's sizing bugs sit
    at). Shrinks toward the unmoved context."""
    page, ctx, delta = draw(page_table_configs(domain, tuple(page_sizes), block_tokens))
    if wall:
        delta = max(delta, 1)
    if delta and (wall or draw(st.booleans())):
        ctx = min(DOMAINS[domain][0], -(-ctx // page) * page)
    return page, ctx, delta


def fa3_metadata_cases(domain: str, page_sizes, block_tokens: int):
    """A scenario of ``SCENARIOS``, a config for it and one launch of that config, as the case's fields."""
    def launch(scenario: str):
        return fa3_metadata_configs(domain, page_sizes, block_tokens, wall=scenario == "wall").flatmap(
            lambda cfg: _batch(*cfg, domain=domain, scenario=scenario))

    return st.sampled_from(SCENARIOS).flatmap(launch)
