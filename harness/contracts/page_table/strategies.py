"""Hypothesis strategies for the page-table builder contracts (docs/contract.md §9).

``page_table_cases(abi, domain, page_sizes, block_tokens)`` draws one launch, as the keyword arguments of the
contract's case (``kvfence.contracts.page_table.record.PageTableCase``, which validates it): a scenario
(``SCENARIOS``), a config for it (``page_table_configs``: page size, the model's context length, draft tokens), a
batch (``page_table_batches``: lengths, pool rows, start offsets, SWA) and the slot layout's seed. The edges are
where these kernels break:

* the page blocks: one program covers 4096 tokens (``block_tokens``) at every page size, ``4096 / P`` pages, so
  lengths at every block boundary ``k * 4096`` and ``k * 4096 + {-P, -P + 1, -1, 0, 1, P, P + 1}`` (the last
  page of block ``k - 1``, the first of block ``k``), up to the domain's longest: on the CPU the second and third
  blocks (lengths to ``CPU_LONGEST`` = 3 * 4096, cheap under the interpreter at every page size, a fourth block
  never), on the GPU every block of contexts up to 256k;
* the context wall: ``ctx``, ``ctx + draft`` and one token short of it, ``ctx - 1 + draft``, ``ctx + 1``, with
  contexts that are no multiple of the page size;
* the pages: ``1``, ``P``, ``P + 1``, ``k * P + 1``.

Scenarios: ``any`` (every field drawn, edges half the time), ``block`` (one request at a block boundary, the
page size drawn again after the config, the context raised to hold it), ``wall`` (draft tokens, the last request
at ``ctx - 1 + draft`` or ``ctx + draft``), ``any`` first: a failure shrinks toward page 1, context 1, no draft
tokens, one request of length 1 in pool row 0.

The slot layout's seed is no choice of Hypothesis's but a digest of the other fields (``layout_seed``): the
target phase walks the choices of its best example while need/width stays the same (under the ``safe`` sizing
every example at the wall scores 1.0), and a seed choice of its own gave it a walk without end that changed
only the slot layout (60 of 100 examples one case).
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvfence.draws import edge_or
from kvfence.errors import require

#: The longest length the CPU domain draws: three page blocks of 4096 tokens (the third never past its end).
CPU_LONGEST = 3 * 4096
MAX_DRAFT_TOKENS = 16
#: Domain bounds: (largest context, most requests, most elements one output table may hold).
DOMAINS = {"cpu": (CPU_LONGEST - MAX_DRAFT_TOKENS, 4, 1 << 15), "gpu": (262144, 256, 1 << 18)}
#: What a draw aims at (see the module docstring); the first is where shrinking goes.
SCENARIOS = ("any", "block", "wall")
#: The scenario draw: ``block`` in three draws of five, ``any`` and ``wall`` in one each.
SCENARIO_ODDS = ("any", "block", "wall", "block", "block")
#: Offsets of a block boundary a length sits at, by the page size ``P`` (the first is where shrinking goes).
BOUNDARY_OFFSETS = lambda P: (1, 0, -1, P, P + 1, 1 - P, -P)  # noqa: E731


def longest(domain: str) -> int:
    """The longest length ``domain`` draws (its largest context plus the most draft tokens)."""
    return DOMAINS[domain][0] + MAX_DRAFT_TOKENS


def block_edges(page: int, hi: int, block_tokens: int):
    """Lengths at each page-block boundary up to ``hi`` (``k * block_tokens`` plus ``BOUNDARY_OFFSETS``)."""
    return sorted({k * block_tokens + d for k in range(1, hi // block_tokens + 2) for d in BOUNDARY_OFFSETS(page)
                   if 1 <= k * block_tokens + d <= hi})



@st.composite
def page_table_configs(draw, domain: str, page_sizes, block_tokens: int):
    """``(page_size, ctx, draft_tokens)``: page 1 first, then the sizes SGLang serves; contexts near powers of
    two, block boundaries, their neighbours and values that are no multiple of the page size; up to 16 draft
    tokens."""
    require(domain in DOMAINS, f"domain={domain!r}: choose from {', '.join(DOMAINS)}")
    max_ctx = DOMAINS[domain][0]
    page = draw(st.sampled_from(page_sizes))
    wall = [page, page + 1, 2 * page - 1, 4000, 32768 - 1, 131072 + 7, 200000, max_ctx] \
        + [1 << e for e in range(4, 19)] + [(1 << e) - 1 for e in range(4, 19)] \
        + block_edges(page, max_ctx, block_tokens)
    ctx = edge_or(draw, 1, max_ctx, wall)
    draft = edge_or(draw, 0, MAX_DRAFT_TOKENS, (1, 2, 4, 8, MAX_DRAFT_TOKENS))
    return page, ctx, draft


@st.composite
def boundary_lengths(draw, page: int, hi: int, block_tokens: int):
    """A length at a page-block boundary in ``[1, hi]``: block ``k`` (the second first; in half the draws counted
    from the last) and an offset of ``BOUNDARY_OFFSETS``; ``hi`` when no boundary fits."""
    blocks = (hi + page) // block_tokens
    if blocks < 1:
        return hi
    k = draw(st.integers(1, blocks))
    if draw(st.booleans()):
        k = blocks + 1 - k  # counted from the last block: the deepest are as common as the first
    return min(hi, max(1, k * block_tokens + draw(st.sampled_from(BOUNDARY_OFFSETS(page)))))


@st.composite
def page_table_batches(draw, abi: str, page: int, ctx: int, draft: int, domain: str, block_tokens: int,
                       scenario: str = "any", pinned=None):
    """A batch for the config: 1 .. the domain's request count (fewer where a table would exceed the
    domain's element budget), each length an edge (1, page and block boundaries, the context wall with and
    without draft tokens) or any value in ``[1, ctx + draft]``; ``pinned``: the last request's length (the
    scenario's); distinct pool rows (shuffled, with spare rows); ``kv_start`` (flashmla) and SWA (trtllm_mha) in
    half the draws."""
    _, most, max_elements = DOMAINS[domain]
    top = ctx + draft
    width = -(-top // page)
    most = max(1, min(most, max_elements // max(1, width)))
    num_seqs = draw(st.integers(1, most))
    edges = [1, page, page + 1, ctx - 1, ctx, ctx + 1, ctx - 1 + draft, top, top - page, (ctx // page) * page + 1] \
        + block_edges(page, top, block_tokens)
    lens = [edge_or(draw, 1, top, edges) for _ in range(num_seqs)]
    if pinned is not None:
        lens[-1] = pinned
    spare = draw(st.integers(0, 2))
    rows = draw(st.permutations(range(num_seqs + spare)))[:num_seqs]
    kv_start = None
    if abi == "flashmla" and draw(st.booleans()):
        kv_start = tuple(draw(st.integers(0, 2 * page)) for _ in range(num_seqs))
    swa = abi == "trtllm_mha" and draw(st.booleans())
    return dict(page_size=page, ctx=ctx, draft_tokens=draft, seq_lens=tuple(lens), req_pool_indices=tuple(rows),
                pool_rows=num_seqs + spare, kv_start=kv_start, swa=swa)


@st.composite
def page_table_launches(draw, abi: str, domain: str, page_sizes, block_tokens: int, scenario: str):
    """One launch of ``scenario``: its config, then the batch (see the module docstring)."""
    require(scenario in SCENARIOS, f"scenario={scenario!r}: choose from {', '.join(SCENARIOS)}")
    page, ctx, draft = draw(page_table_configs(domain, tuple(page_sizes), block_tokens))
    pinned = None
    if scenario == "block":
        # The page size again, after the config: Hypothesis generates runs of one scenario, mutating their later
        # choices, and a block bug of one page size must not wait for a run that drew it first.
        page = draw(st.sampled_from(page_sizes))
        length = draw(boundary_lengths(page, longest(domain), block_tokens))
        ctx = min(DOMAINS[domain][0], max(ctx, length - draft))
        pinned = min(length, ctx + draft)
    elif scenario == "wall":
        draft = max(draft, 1)
        if draw(st.booleans()):  # the context at a page boundary: ctx - 1 + draft spills past ceil(ctx / P)
            ctx = min(DOMAINS[domain][0], -(-ctx // page) * page)
        pinned = ctx + draft - draw(st.sampled_from((1, 0)))
    return draw(page_table_batches(abi, page, ctx, draft, domain, block_tokens, scenario, pinned))


def page_table_cases(abi: str, domain: str, page_sizes, block_tokens: int):
    """One launch of the ``abi`` kernel (``flashmla`` or ``trtllm_mha``) on ``domain``, as case fields: the slot
    layout's seed first, then a scenario of ``SCENARIO_ODDS`` and its launch."""
    require(abi in ("flashmla", "trtllm_mha"), f"abi={abi!r}: choose flashmla or trtllm_mha")
    require(domain in DOMAINS, f"domain={domain!r}: choose from {', '.join(DOMAINS)}")
    require(page_sizes and all(isinstance(p, int) and p >= 1 for p in page_sizes), "page_sizes: positive integers")

    @st.composite
    def launch(draw):
        scenario = draw(st.sampled_from(SCENARIO_ODDS))
        fields = draw(page_table_launches(abi, domain, page_sizes, block_tokens, scenario))
        return dict(fields, seed=layout_seed(fields))

    return launch()


def layout_seed(fields: dict) -> int:
    """The slot layout's seed, a digest of the launch's other fields: no choice of its own, so no example differs
    from another by its slot layout alone (see the module docstring)."""
    import zlib

    return zlib.crc32(repr(sorted(fields.items())).encode()) & 0xFFFF
