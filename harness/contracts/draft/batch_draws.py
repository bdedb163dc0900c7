"""The draft's batch draws (``batches(config)``, ``draw_batch``): request counts, lengths biased to the edges where
bugs live (copy blocks, lane widths, pages, the context wall), pool rows and seeds, for any ``draw``: Hypothesis's,
or a ``FastDraw`` (``kvfence.contracts.draft.fastdraw``) for the bulk of an example's batches.
"""

from __future__ import annotations

import functools
import math

from hypothesis import strategies as st

from kvfence.contracts.draft.case import Batch, Config
from kvfence.contracts.draft.domain import COPY_BLOCKS, LANE_WIDTHS
from kvfence.contracts.draft.fastdraw import (
    AT_THE_WALL,
    BOOLEANS,
    LENGTH_MODES,
    TIERS,
    TOKEN_SEEDS,
    V2P_SEEDS,
    fast_integers,
    fast_sampled,
    integers,
    sampled,
    sized,
)
from kvfence.errors import require

SEQ_LEN_LIMITS = ("ctx", "ctx-steps")
# -- batches --------------------------------------------------------------------------------------------
def seq_len_bound(config: Config, seq_len_limit: str) -> int:
    """Largest request length a batch may hold: ``ctx``, or ``ctx - num_steps`` to keep draft headroom."""
    require(seq_len_limit in SEQ_LEN_LIMITS, f"seq_len_limit={seq_len_limit!r}: choose {', '.join(SEQ_LEN_LIMITS)}")
    if seq_len_limit == "ctx":
        return config.ctx
    bound = config.ctx - config.num_steps
    require(bound >= 1,
            f"seq_len_limit='ctx-steps' needs ctx > num_steps, got ctx={config.ctx}, num_steps={config.num_steps}")
    return bound


def edge_lengths(config: Config, bound: int):
    """Lengths where bugs live: 1, the first page boundaries +-1 and minus ``num_steps`` (drafts that
    just fill a page), copy blocks (128, 512, 1024) +-1, ``ctx - num_steps`` +-1, and the bound itself."""
    edges = {1, 2, bound, bound - 1, config.ctx - config.num_steps - 1, config.ctx - config.num_steps,
             config.ctx - config.num_steps + 1}
    p = config.page_size
    for page in {p, 2 * p, 3 * p, (bound // p) * p}:
        # page - num_steps: the drafts fill the page exactly; one more and they spill into the next.
        edges.update({page - config.num_steps, page - 1, page, page + 1})
    for block in COPY_BLOCKS + (1024,):
        edges.update({block - 1, block, block + 1})
    return sorted(x for x in edges if 1 <= x <= bound)


@functools.lru_cache(maxsize=256)
def _length_codes(config: Config, bound: int):
    # One draw per length (draws dominate generation cost): codes [0, bound) pick an edge length,
    # codes [bound, 2*bound) a uniform one, so edges get half the mass. Code 0 is edge 1, the
    # shrink target; edges are sorted, so a failing edge shrinks to the smallest failing edge.
    return fast_integers(st.integers(0, 2 * bound - 1), 0, 2 * bound - 1), _edge_tuple(config, bound)


def _small_domain_length(draw, codes, edges: tuple, bound: int) -> int:
    code = draw(codes)
    return edges[code % len(edges)] if code < bound else code - bound + 1


def _large_domain_length(draw, edges: tuple, bound: int) -> int:
    return sized(draw, 1, bound, edges, small=16)


@functools.lru_cache(maxsize=256)
def _edge_tuple(config: Config, bound: int) -> tuple:
    return tuple(edge_lengths(config, bound))


#: Bounds up to this draw lengths with one code (uniform is cheap and covers everything); above it,
#: ``sized`` (small / edge / log-uniform), so a 131072-token context is not mostly giant requests.
SMALL_BOUND = 256


def _draw_lengths(draw, config: Config, bound: int, count: int):
    """``count`` lengths: one shared length, one per request (up to 16 requests), a palette of 2-4
    lengths cycled over the batch (many distinct lengths in a large batch for a handful of draws), or
    every request at the context wall: one shared length in the last ``num_steps`` tokens below
    ``bound``, where a row sized without draft headroom overflows once the batch is full. The wall gets
    two codes of five because a bug there needs three draws to line up (no window, a full batch, the
    wall): the CPU self-test's 60 examples reach sizing_no_draft_headroom's trigger in 298 of 300 seeds
    (``python benchmarks/prior_reach.py --seeds 300``), in 35 of 40 without this mode."""
    # What a length draw needs is looked up once per batch, not once per length (the bulk's cost).
    if bound <= SMALL_BOUND:
        codes, edges = _length_codes(config, bound)
        one = functools.partial(_small_domain_length, draw, codes, edges, bound)
    else:
        one = functools.partial(_large_domain_length, draw, _edge_tuple(config, bound), bound)
    mode = draw(LENGTH_MODES)
    if mode >= AT_THE_WALL:
        return [bound - draw(integers(0, min(config.num_steps, bound) - 1))] * count
    if mode == 0 or count == 1:
        return [one()] * count
    if mode == 1 and count <= 16:
        return [one() for _ in range(count)]
    palette = [one() for _ in range(draw(integers(2, min(4, count))))]
    return [palette[i % len(palette)] for i in range(count)]


@st.composite
def seq_lens(draw, config: Config, count: int, seq_len_limit: str = "ctx"):
    """``count`` request lengths in ``[1, bound]`` (see ``_draw_lengths``). Shrinks toward all-ones."""
    return _draw_lengths(draw, config, seq_len_bound(config, seq_len_limit), count)


@functools.lru_cache(maxsize=64)
def _multipliers(pool_rows: int):
    # Affine permutations i -> (a*i + c) mod pool_rows need gcd(a, pool_rows) == 1; a = 1 comes first,
    # so rows shrink toward 0, 1, 2, ...
    units = tuple(a for a in range(1, pool_rows + 1) if math.gcd(a, pool_rows) == 1)
    return fast_sampled(st.sampled_from(units), units)


def _raw_batch_size(draw, config: Config, min_requests: int) -> int:
    """Requests in a batch. Small configs: a full batch a quarter of the time (bugs in sums over
    requests need several of them), else uniform. Large ones: half small; else a full capture bucket
    or a uniform count; else a count the runner must pad (one past a bucket, or just past a lane width:
    with SGLang's capture list every count up to 8 is a bucket, so padding lives in the gaps above).
    Shrinks toward ``min_requests``."""
    lo, hi = min_requests, config.max_bs
    if hi - lo < 8:
        # The tier first, then a count drawn whatever the tier (a tier deciding whether a draw happens at
        # all shrinks badly): shrinking the tier to 0 leaves a count that shrinks on its own, and a
        # failure that needs two requests shrinks from a full batch to two, the shrinker lowering the tier
        # and raising the count together (the count drawn first would have shrunk to 1 under a full tier).
        full = draw(TIERS) >= 2
        count = draw(integers(lo, hi))
        return hi if full else count
    tier = draw(TIERS)
    if tier <= 1:
        return draw(integers(lo, lo + 3))
    buckets = set(config.capture_buckets)
    if tier == 2:
        full = tuple(sorted(b for b in buckets if lo <= b <= hi))
        return draw(sampled(full)) if full and draw(BOOLEANS) else draw(integers(lo, hi))
    past = {b + 1 for b in buckets} | {w + 1 for w in LANE_WIDTHS}
    padded = tuple(sorted(x for x in past if lo <= x <= hi and x not in buckets))
    return draw(sampled(padded)) if padded else draw(integers(lo, hi))


def batches(config: Config, seq_len_limit: str = "ctx", min_requests: int = 1):
    """A ``Batch`` for ``config``: 1..max_bs requests (graph mode pads to a bucket), lengths as in
    ``seq_lens``, distinct pool rows in a permuted order, and a token-table seed.

    Pool rows come from an affine permutation ``(a*i + c) mod pool_rows`` (rotated, strided, reversed
    orders): two draws instead of one per request, which keeps generation cheap enough for the GPU's
    thousands of cases a second while still catching any mix-up of requests and their rows.
    """
    require(isinstance(config, Config), f"batches(config={config!r}) needs a Config")
    seq_len_bound(config, seq_len_limit)
    require(isinstance(min_requests, int) and 1 <= min_requests <= config.max_bs,
            f"batches(min_requests={min_requests}) must be in 1..max_bs")
    return cached_batches(config, seq_len_limit, min_requests)


@functools.lru_cache(maxsize=256)
def cached_batches(config: Config, seq_len_limit: str, min_requests: int):
    # Cached per (config, limit): Hypothesis validates a strategy object once, on its first draw.
    return composite_batch(config, seq_len_bound(config, seq_len_limit), min_requests)


def draw_batch(draw, config: Config, bound: int, min_requests: int) -> Batch:
    """One batch for ``config`` with lengths up to ``bound``, from ``draw``: Hypothesis's (``batches``)
    or a ``FastDraw`` (the bulk of ``case_runs``), one code path for both."""
    raw_bs = _raw_batch_size(draw, config, min_requests)
    lens = _draw_lengths(draw, config, bound, raw_bs)
    rows_total = config.pool_rows
    a, c = draw(_multipliers(rows_total)), draw(integers(0, rows_total - 1))
    rows = [(a * i + c) % rows_total for i in range(raw_bs)]
    token_seed = draw(TOKEN_SEEDS)
    # TRANSLATE: the page table's seed: a drawn table (negative, sink and far pages) 3 times in 4, the
    # identity (0) otherwise and as the shrink target.
    v2p_seed = draw(V2P_SEEDS) if config.translate and draw(TIERS) > 0 else 0
    return Batch(tuple(lens), tuple(rows), token_seed, v2p_seed)


composite_batch = st.composite(draw_batch)
