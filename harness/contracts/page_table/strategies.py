"""Hypothesis strategies for the page-table builder contracts (docs/contract.md §9).

``page_table_cases(abi, domain, page_sizes, block_tokens)`` draws one launch, as the keyword arguments of the
contract's case (``kvfence.contracts.page_table.record.PageTableCase``, which validates it): a config (``page_table_configs``: page size, the model's
context length, draft tokens) and a batch for it (``page_table_batches``: lengths, pool rows, start offsets,
SWA). The edges are where these kernels break: lengths at the context wall (``ctx``, ``ctx + draft``), at
page boundaries (``k*P``, ``k*P + 1``) and at page-block boundaries (4096 tokens per program); contexts
that are not multiples of the page size. Everything shrinks toward page 1, context 1, no draft tokens,
one request of length 1 in pool row 0.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvfence.errors import require

#: Domain bounds: (largest context, most requests, most elements one output table may hold).
DOMAINS = {"cpu": (640, 4, 1 << 14), "gpu": (262144, 256, 1 << 18)}
MAX_DRAFT_TOKENS = 16


def _edge_or(draw, lo: int, hi: int, edges) -> int:
    """Half the time an edge inside ``[lo, hi]``, else any value; shrinks toward ``lo``."""
    inside = sorted({e for e in edges if lo <= e <= hi})
    if inside and draw(st.booleans()):
        return draw(st.sampled_from(inside))
    return draw(st.integers(lo, hi))


@st.composite
def page_table_configs(draw, domain: str, page_sizes, block_tokens: int):
    """``(page_size, ctx, draft_tokens)``: page 1 first, then the sizes SGLang serves; contexts near powers of
    two, their neighbours and values that are no multiple of the page size; up to 16 draft tokens."""
    require(domain in DOMAINS, f"domain={domain!r}: choose from {', '.join(DOMAINS)}")
    max_ctx = DOMAINS[domain][0]
    page = draw(st.sampled_from(page_sizes))
    wall = [page, page + 1, 2 * page - 1, block_tokens, block_tokens + page, 4000, 32768 - 1, 131072 + 7, 200000,
            max_ctx] + [1 << e for e in range(4, 19)] + [(1 << e) - 1 for e in range(4, 19)]
    ctx = _edge_or(draw, 1, max_ctx, wall)
    draft = _edge_or(draw, 0, MAX_DRAFT_TOKENS, (1, 2, 4, 8, MAX_DRAFT_TOKENS))
    return page, ctx, draft


@st.composite
def page_table_batches(draw, abi: str, page: int, ctx: int, draft: int, domain: str, block_tokens: int):
    """A batch for the config: 1 .. the domain's request count (fewer where a table would exceed the
    domain's element budget), each length an edge (1, page boundaries, the context wall with and without
    draft tokens) or any value in ``[1, ctx + draft]``; distinct pool rows (shuffled, with spare rows);
    ``kv_start`` (flashmla) and SWA (trtllm_mha) in half the draws."""
    _, most, max_elements = DOMAINS[domain]
    longest = ctx + draft
    width = -(-longest // page)
    most = max(1, min(most, max_elements // max(1, width)))
    num_seqs = draw(st.integers(1, most))
    edges = (1, page, page + 1, ctx - 1, ctx, ctx + 1, longest, longest - page, (ctx // page) * page + 1,
             block_tokens, block_tokens + 1)
    lens = tuple(_edge_or(draw, 1, longest, edges) for _ in range(num_seqs))
    spare = draw(st.integers(0, 2))
    rows = draw(st.permutations(range(num_seqs + spare)))[:num_seqs]
    kv_start = None
    if abi == "flashmla" and draw(st.booleans()):
        kv_start = tuple(draw(st.integers(0, 2 * page)) for _ in range(num_seqs))
    swa = abi == "trtllm_mha" and draw(st.booleans())
    seed = draw(st.integers(0, 2 ** 16))
    return dict(page_size=page, ctx=ctx, draft_tokens=draft, seq_lens=lens, req_pool_indices=tuple(rows),
                pool_rows=num_seqs + spare, kv_start=kv_start, swa=swa, seed=seed)


def page_table_cases(abi: str, domain: str, page_sizes, block_tokens: int):
    """One launch of the ``abi`` kernel (``flashmla`` or ``trtllm_mha``) on ``domain``, as case fields."""
    require(abi in ("flashmla", "trtllm_mha"), f"abi={abi!r}: choose flashmla or trtllm_mha")
    require(domain in DOMAINS, f"domain={domain!r}: choose from {', '.join(DOMAINS)}")
    require(page_sizes and all(isinstance(p, int) and p >= 1 for p in page_sizes), "page_sizes: positive integers")
    return page_table_configs(domain, tuple(page_sizes), block_tokens).flatmap(
        lambda cfg: page_table_batches(abi, *cfg, domain=domain, block_tokens=block_tokens))
