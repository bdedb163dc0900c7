"""Hypothesis strategies for kvfence: ``configs()``, ``batches(config)`` and ``cases()``.

They compose: ``cases()`` draws a config, then a batch for it. Every argument is validated up front
(``BadInput``), as Hypothesis validates its own. Draws are biased toward the edges where sizing and
layout bugs live, and everything shrinks toward small, readable cases (topk 1, one step, page 1,
one request of length 1, pool rows in order, token seed 0).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

from hypothesis import strategies as st

from harness.case import Batch, Case, Config, MODES, LAYOUTS
from harness.errors import require

PAGE_SIZES = (1, 2, 4, 16, 64)
#: The topk and num_steps values ``configs()`` draws (``harness.campaign`` deals them to shards).
TOPKS = tuple(range(1, 9))
NUM_STEPS = tuple(range(1, 9))
SEQ_LEN_LIMITS = ("ctx", "ctx-steps")
#: Interpreter-sized defaults: a launch is num_steps*bucket*topk programs of ~2 ms each on CPU.
DEFAULT_MAX_CTX = 48
DEFAULT_MAX_BS = 4


def _fixed_or(value, strategy, name, ok, what):
    """``strategy`` unless the caller pinned ``value`` (validated now, with a one-line error)."""
    if value is None:
        return strategy
    require(ok(value), f"configs({name}={value!r}): {name} must be {what}")
    return st.just(value)


def configs(*, topk: Optional[int] = None, num_steps: Optional[int] = None, page_size: Optional[int] = None,
            ctx: Optional[int] = None, max_bs: Optional[int] = None, sizing: str = "safe", layout: str = "redzone",
            mode: str = "graph", max_ctx: int = DEFAULT_MAX_CTX, max_max_bs: int = DEFAULT_MAX_BS):
    """A ``Config``: topk 1-8 (any integer, not only powers of two), num_steps 1-8, a page size from
    {1, 2, 4, 16, 64}, ``ctx`` above ``num_steps`` (so ``ctx-steps`` batches exist) and a small
    ``max_bs``. Pin any field by passing it. Shrinks toward topk 1, one step, page 1, the smallest ctx.
    """
    require(layout in LAYOUTS, f"configs(layout={layout!r}): choose {', '.join(LAYOUTS)}")
    require(mode in MODES, f"configs(mode={mode!r}): choose {', '.join(MODES)}")
    require(isinstance(sizing, str) and sizing, f"configs(sizing={sizing!r}) must name a sizing policy")
    require(isinstance(max_ctx, int) and max_ctx >= 2, f"configs(max_ctx={max_ctx!r}) must be an integer >= 2")
    require(isinstance(max_max_bs, int) and max_max_bs >= 1, f"configs(max_max_bs={max_max_bs!r}) must be >= 1")
    positive = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
    topks = _fixed_or(topk, st.integers(TOPKS[0], TOPKS[-1]), "topk", positive, "a positive integer")
    steps = _fixed_or(num_steps, st.integers(NUM_STEPS[0], NUM_STEPS[-1]), "num_steps", positive, "a positive integer")
    pages = _fixed_or(page_size, st.sampled_from(PAGE_SIZES), "page_size",
                      lambda v: positive(v) and v & (v - 1) == 0, "a power of two")
    _fixed_or(ctx, None, "ctx", positive, "a positive integer")
    sizes = _fixed_or(max_bs, st.integers(1, max_max_bs), "max_bs", positive, "a positive integer")
    if None not in (topk, num_steps, page_size, ctx, max_bs):
        # Fully pinned: one config, no draws (the GPU fuzzes one captured config at a time).
        return st.just(Config(topk=topk, num_steps=num_steps, page_size=page_size, ctx=ctx, max_bs=max_bs,
                              sizing=sizing, layout=layout, mode=mode))
    return _configs(topks, steps, pages, ctx, sizes, sizing, layout, mode, max_ctx)


@st.composite
def _configs(draw, topks, steps, pages, ctx, sizes, sizing, layout, mode, max_ctx):
    t, n, p = draw(topks), draw(steps), draw(pages)
    lo = min(n + 1, max_ctx)
    c = ctx if ctx is not None else draw(st.integers(lo, max(lo, max_ctx)))
    m = draw(sizes)
    return Config(topk=t, num_steps=n, page_size=p, ctx=c, max_bs=m, sizing=sizing, layout=layout, mode=mode)


def seq_len_bound(config: Config, seq_len_limit: str) -> int:
    """Largest request length a batch may hold: ``ctx``, or ``ctx - num_steps`` to keep draft headroom."""
    require(seq_len_limit in SEQ_LEN_LIMITS, f"seq_len_limit={seq_len_limit!r}: choose {', '.join(SEQ_LEN_LIMITS)}")
    if seq_len_limit == "ctx":
        return config.ctx
    bound = config.ctx - config.num_steps
    require(bound >= 1, f"seq_len_limit='ctx-steps' needs ctx > num_steps, got ctx={config.ctx}, num_steps={config.num_steps}")
    return bound


def edge_lengths(config: Config, bound: int):
    """Lengths where bugs live: 1, page boundaries +-1, ``ctx - num_steps`` +-1, and the bound itself."""
    edges = {1, 2, bound, bound - 1, config.ctx - config.num_steps - 1, config.ctx - config.num_steps,
             config.ctx - config.num_steps + 1}
    p = config.page_size
    for page in {p, 2 * p, (bound // p) * p}:
        edges.update({page - 1, page, page + 1})
    return sorted(x for x in edges if 1 <= x <= bound)


@functools.lru_cache(maxsize=256)
def _length_codes(config: Config, bound: int):
    # One draw per length (draws dominate generation cost): codes [0, bound) pick an edge length,
    # codes [bound, 2*bound) a uniform one, so edges get half the mass. Code 0 is edge 1, the
    # shrink target; edges are sorted, so a failing edge shrinks to the smallest failing edge.
    return st.integers(0, 2 * bound - 1), tuple(edge_lengths(config, bound))


def _draw_lengths(draw, config: Config, bound: int, count: int):
    codes, edges = _length_codes(config, bound)

    def length(code: int) -> int:
        return edges[code % len(edges)] if code < bound else code - bound + 1

    if draw(BOOLEANS):
        return [length(draw(codes))] * count
    return [length(draw(codes)) for _ in range(count)]


@st.composite
def seq_lens(draw, config: Config, count: int, seq_len_limit: str = "ctx"):
    """``count`` request lengths in ``[1, bound]``. Half the time one length shared by the whole batch
    (a full bucket at the context limit is what overflows the fixed policy), otherwise each length is
    an edge value or uniform. Shrinks toward all-ones.
    """
    return _draw_lengths(draw, config, seq_len_bound(config, seq_len_limit), count)


BOOLEANS = st.booleans()
TOKEN_SEEDS = st.integers(0, 2**30 - 1)


@functools.lru_cache(maxsize=256)
def _integers(lo: int, hi: int):
    return st.integers(lo, hi)


@functools.lru_cache(maxsize=64)
def _multipliers(pool_rows: int):
    # Affine permutations i -> (a*i + c) mod pool_rows need gcd(a, pool_rows) == 1; a = 1 comes first,
    # so rows shrink toward 0, 1, 2, ...
    return st.sampled_from([a for a in range(1, pool_rows + 1) if math.gcd(a, pool_rows) == 1])


def batches(config: Config, seq_len_limit: str = "ctx", min_requests: int = 1):
    """A ``Batch`` for ``config``: 1..max_bs requests (graph mode pads to a bucket), lengths as in
    ``seq_lens``, distinct pool rows in a permuted order, and a token-table seed.

    Pool rows come from an affine permutation ``(a*i + c) mod pool_rows`` (rotated, strided, reversed
    orders): two draws instead of one per request, which keeps generation cheap enough for the GPU's
    thousand cases a second while still catching any mix-up of requests and their rows.
    """
    require(isinstance(config, Config), f"batches(config={config!r}) needs a Config")
    seq_len_bound(config, seq_len_limit)
    require(isinstance(min_requests, int) and 1 <= min_requests <= config.max_bs,
            f"batches(min_requests={min_requests}) must be in 1..max_bs")
    return _batches(config, seq_len_limit, min_requests)


@functools.lru_cache(maxsize=256)
def _batches(config: Config, seq_len_limit: str, min_requests: int):
    # Cached per (config, limit): Hypothesis validates a strategy object once, on its first draw.
    return _draw_batch(config, seq_len_bound(config, seq_len_limit), min_requests)


@st.composite
def _draw_batch(draw, config: Config, bound: int, min_requests: int):
    raw_bs = draw(_integers(min_requests, config.max_bs))
    lens = _draw_lengths(draw, config, bound, raw_bs)
    rows_total = config.pool_rows
    a, c = draw(_multipliers(rows_total)), draw(_integers(0, rows_total - 1))
    rows = [(a * i + c) % rows_total for i in range(raw_bs)]
    return Batch(tuple(lens), tuple(rows), draw(TOKEN_SEEDS))


def cases(config_strategy=None, *, kernel: str = "reference", seq_len_limit: str = "ctx", canary_seed: int = 0):
    """A ``Case``: a config (from ``config_strategy``, default ``configs()``), then a batch for it."""
    require(seq_len_limit in SEQ_LEN_LIMITS, f"cases(seq_len_limit={seq_len_limit!r}): choose {', '.join(SEQ_LEN_LIMITS)}")
    require(isinstance(kernel, str) and kernel, f"cases(kernel={kernel!r}) must name a kernel")
    require(isinstance(canary_seed, int) and 0 <= canary_seed < 2**31, f"cases(canary_seed={canary_seed!r}) out of range")
    return _cases(config_strategy if config_strategy is not None else configs(), kernel, seq_len_limit, canary_seed)


@st.composite
def _cases(draw, config_strategy, kernel: str, seq_len_limit: str, canary_seed: int):
    config = draw(config_strategy)
    batch = draw(_batches(config, seq_len_limit, 1))
    return Case(config, batch, kernel, canary_seed)


def case_runs(config_strategy=None, *, kernel: str = "reference", seq_len_limit: str = "ctx", canary_seed: int = 0,
              max_batches: int = 8):
    """A list of 1..``max_batches`` ``Case``s sharing one config: successive replays of one captured
    configuration, as a server replays its graphs. One Hypothesis example then checks several batches,
    which spreads the engine's per-example cost (the GPU's throughput mode). Shrinks toward one batch.
    """
    cases(config_strategy, kernel=kernel, seq_len_limit=seq_len_limit, canary_seed=canary_seed)  # validates
    require(isinstance(max_batches, int) and max_batches >= 1, f"case_runs(max_batches={max_batches!r}) must be >= 1")
    return _case_runs(config_strategy if config_strategy is not None else configs(), kernel, seq_len_limit,
                      canary_seed, max_batches)


@st.composite
def _case_runs(draw, config_strategy, kernel: str, seq_len_limit: str, canary_seed: int, max_batches: int):
    config = draw(config_strategy)
    batches_ = draw(st.lists(_batches(config, seq_len_limit, 1), min_size=1, max_size=max_batches))
    return [Case(config, batch, kernel, canary_seed) for batch in batches_]
