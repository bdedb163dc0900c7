"""Hypothesis strategies for kvfence: ``configs()``, ``batches(config)``, ``cases()`` and ``case_runs()``.

They compose: ``cases()`` draws a config, then a batch for it; ``case_runs()`` draws a config, then
several batches for it (one captured configuration replayed many times, as a server does). Every
argument is validated up front (``BadInput``), as Hypothesis validates its own.

Where the draws come from is a ``DraftSpace`` (``kvfence.contracts.draft.domain``): ``cpu`` keeps interpreter-sized
launches, ``gpu`` reaches production sizes. Draws are biased toward the edges where bugs live (copy
blocks, lane widths, pages, the context limit, full and padded buckets) while small cases stay the most
frequent, and everything shrinks toward small, readable cases (topk 1, one step, page 1, one request of
length 1, pool rows in order, token seed 0).

The batch draw code (``draw_batch`` and what it calls) takes any ``draw``: Hypothesis's, or a
``FastDraw`` that answers each strategy it meets from a seeded PRNG and records the Hypothesis choice
that gives the same value. ``case_runs(bulk=N)`` uses the second for the bulk of an example's batches
(new structures at a fraction of a Hypothesis draw's cost, Hypothesis still choosing the config), and
the recorded choices splice any bulk case back into a Hypothesis example (``CaseRun.splice``), which is
how a failure found in the bulk is shrunk. The batch draws live in ``kvfence.contracts.draft.batch_draws``, the
fast source in ``kvfence.contracts.draft.fastdraw``; this module is their public face.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
from typing import Any, Dict, List, Optional, Sequence, Union

from hypothesis import strategies as st

from kvfence.contracts.draft.batch_draws import SEQ_LEN_LIMITS, batches, cached_batches, draw_batch, seq_len_bound
from kvfence.contracts.draft.case import LAYOUTS, MODES, Batch, Case, Config
from kvfence.contracts.draft.domain import (
    COMMON_SHARE,
    COMMON_STEPS,
    COMMON_TOPK,
    COPY_BLOCKS,
    CPU,
    FAMILY_MAX_BATCHES,
    LANE_WIDTHS,
    LARGEST_PAGE_SHARE,
    PAGE1_SHARE,
    DraftSpace,
    domain_named,
)
from kvfence.contracts.draft.fastdraw import (
    BOOLEANS,
    TIERS,
    FastDraw,
    integers,
    sampled,
    sized,
)
from kvfence.contracts.draft.runner_buffers import config_bytes
from kvfence.contracts.draft.tokens import SLOT_BITS
from kvfence.engine.budget import fit
from kvfence.errors import require

__all__ = ["batches", "case_runs", "cases", "configs", "seq_len_bound"]

PAGE_SIZES = CPU.page_sizes
#: The CPU domain's bounds (interpreter-sized: a launch is num_steps*bucket*topk programs of ~2 ms each).
DEFAULT_MAX_CTX = CPU.max_ctx
DEFAULT_MAX_BS = CPU.max_bs

def _positive(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _fixed_or(value, strategy, name, ok, what):
    """``strategy`` unless the caller pinned ``value`` (validated now, with a one-line error)."""
    if value is None:
        return strategy
    require(ok(value), f"configs({name}={value!r}): {name} must be {what}")
    return st.just(value)


def _domain(domain: Union[str, DraftSpace]) -> DraftSpace:
    if isinstance(domain, DraftSpace):
        return domain
    require(isinstance(domain, str), f"domain={domain!r} must be a DraftSpace or one of cpu, gpu")
    return domain_named(domain)




# -- configs --------------------------------------------------------------------------------------------
def configs(*, topk: Optional[int] = None, num_steps: Optional[int] = None, page_size: Optional[int] = None,
            ctx: Optional[int] = None, max_bs: Optional[int] = None, sizing: str = "safe", layout: str = "redzone",
            mode: str = "graph", max_ctx: Optional[int] = None, max_max_bs: Optional[int] = None,
            domain: Union[str, DraftSpace] = "cpu", max_bytes: Optional[int] = None, family: Union[bool, str] = False,
            window_size: Optional[int] = None, sink_size: Optional[int] = None,
            entry_page_size: Optional[int] = None, translate: Optional[bool] = None, contract: str = "draft"):
    """A ``Config`` from ``domain`` (``cpu``: topk 1-8, steps 1-8, pages 1-64, ctx <= 48, max_bs <= 4;
    ``gpu``: topk 1-16, steps 1-16, pages 1-128, ctx <= 131072, max_bs <= 256 with SGLang's capture
    buckets; small contexts there start past one page). ``max_ctx`` / ``max_max_bs`` narrow the domain.
    Pin any field by passing it.

    ``family=True`` also draws the §6 fields (docs/contract.md §6; for a kernel that takes them, see
    ``_family``) in every example: a window shorter or longer than the requests, sinks longer than them,
    page-granular rows, page-table translation. ``family="auto"`` draws them in the domain's share of
    examples (``DraftSpace.family_share``: every example on the CPU domain, one in four on the GPU domain),
    one draw per example that shrinks toward none; such a config is fitted to ``DraftSpace.family_max_bytes``
    (16 MiB on the GPU domain: the host verdict checks it) as well as to ``max_bytes``. Off, they stay at
    their defaults unless pinned. ``contract`` picks the draft kernel or the window rail (whose window is
    then always drawn, >= 1).

    ``max_bytes`` bounds the device memory a config costs (``runner_buffers.config_bytes``: the engine's
    ``launch_bytes`` of its widest launch): a draw over it is halved in its unpinned fields, ctx first, until it fits
    (``kvfence.engine.budget.fit``). Shrinks toward topk 1, one step, page 1,
    the smallest ctx and max_bs, no window, no sinks, E = 1, no translation.
    """
    dom = _domain(domain)
    from kvfence.contracts.draft.case import CONTRACTS

    require(contract in CONTRACTS, f"configs(contract={contract!r}): choose {', '.join(CONTRACTS)}")
    require(isinstance(family, bool) or family == "auto", f"configs(family={family!r}) must be true, false or 'auto'")
    for name, value in (("window_size", window_size), ("sink_size", sink_size)):
        require(value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0),
                f"configs({name}={value!r}): {name} must be a non-negative integer")
    require(translate is None or isinstance(translate, bool), f"configs(translate={translate!r}) must be true or false")
    _fixed_or(entry_page_size, None, "entry_page_size", lambda v: _positive(v) and v & (v - 1) == 0, "a power of two")
    family_pins = tuple(sorted((k, v) for k, v in dict(window_size=window_size, sink_size=sink_size,
                                                        entry_page_size=entry_page_size, translate=translate).items()
                               if v is not None))
    require(layout in LAYOUTS, f"configs(layout={layout!r}): choose {', '.join(LAYOUTS)}")
    require(mode in MODES, f"configs(mode={mode!r}): choose {', '.join(MODES)}")
    require(isinstance(sizing, str) and sizing, f"configs(sizing={sizing!r}) must name a sizing policy")
    if max_ctx is not None:
        require(isinstance(max_ctx, int) and max_ctx >= 2, f"configs(max_ctx={max_ctx!r}) must be an integer >= 2")
        dom = dataclasses.replace(dom, max_ctx=max_ctx)
    if max_max_bs is not None:
        require(isinstance(max_max_bs, int) and max_max_bs >= 1, f"configs(max_max_bs={max_max_bs!r}) must be >= 1")
        dom = dataclasses.replace(dom, max_bs=max_max_bs)
    require(max_bytes is None or (isinstance(max_bytes, int) and max_bytes >= 1),
            f"configs(max_bytes={max_bytes!r}) must be a positive number of bytes")
    for name, value, what in (("topk", topk, "a positive integer"), ("num_steps", num_steps, "a positive integer"),
                              ("ctx", ctx, "a positive integer"), ("max_bs", max_bs, "a positive integer")):
        _fixed_or(value, None, name, _positive, what)
    _fixed_or(page_size, None, "page_size", lambda v: _positive(v) and v & (v - 1) == 0, "a power of two")
    pins: Dict[str, Any] = dict(topk=topk, num_steps=num_steps, page_size=page_size, ctx=ctx, max_bs=max_bs)
    fixed: Dict[str, Any] = dict(sizing=sizing, layout=layout, mode=mode, contract=contract)
    from kvfence.contracts.draft.sizing import WINDOW_POLICIES

    smallest_window = 1 if (contract == "window-rail" or sizing in WINDOW_POLICIES) else 0
    least: Dict[str, Any] = dict(window_size=smallest_window, sink_size=0, entry_page_size=1, translate=False)
    least.update(family_pins)
    if None not in pins.values() and (len(family_pins) == 4 or not (family or smallest_window)):
        # Fully pinned: one config, no draws (a pinned GPU run replays one captured config).
        config = Config(**pins, buckets=dom.buckets_for(pins["max_bs"]), **fixed, **least)
        _require_fits(config, max_bytes)
        return st.just(config)
    # The smallest config the pins allow must fit the budget, or no draw ever could.
    smallest = Config(topk=topk or 1, num_steps=num_steps or 1, page_size=page_size or 1,
                      ctx=ctx or (num_steps or 1) + 1, max_bs=max_bs or 1,
                      buckets=dom.buckets_for(max_bs or 1), **fixed, **least)
    _require_fits(smallest, max_bytes)
    share, family_bytes = (dom.family_share, dom.family_max_bytes) if family == "auto" else (float(family), None)
    if family_bytes is not None:
        # Pins larger than the bound keep the share: its configs are then the smallest the pins allow.
        family_bytes = max(family_bytes, config_bytes(smallest))
        family_bytes = family_bytes if max_bytes is None else min(max_bytes, family_bytes)
    return _configs(dom, tuple(sorted((k, v) for k, v in pins.items() if v is not None)), tuple(sorted(fixed.items())),
                    max_bytes, family_pins, share, smallest_window, family_bytes)


def _require_fits(config: Config, max_bytes: Optional[int]) -> None:
    if max_bytes is None:
        return
    need = config_bytes(config)
    require(need <= max_bytes, f"memory budget {max_bytes} bytes is below the smallest config allowed "
                               f"({need} bytes for {config.to_dict()}); raise --max-gpu-mem or pin smaller fields")


def _ctx_edges(dom: DraftSpace, lo: int):
    return {lo, lo + 1, *COPY_BLOCKS, *(b + 1 for b in COPY_BLOCKS), 1024, 4096, 32768, 65536, dom.max_ctx}


def _page_edges(page_size: int):
    """Contexts that end just before, at and after the first few page boundaries."""
    return {k * page_size + d for k in (1, 2, 4) for d in (-1, 0, 1)} - {0}


#: One draw picks the share of a page-size draw: codes below ``_PAGE1_CODES`` are page 1, the next
#: ``_LARGEST_CODES`` the largest page (GPU domain), the rest uniform over the other pages
#: (kvfence.contracts.draft.domain: ``PAGE1_SHARE``, ``LARGEST_PAGE_SHARE``). Code 0 is page 1, the shrink target.
_SHARE_CODES = 12
_PAGE1_CODES = round(PAGE1_SHARE * _SHARE_CODES)
_LARGEST_CODES = round(LARGEST_PAGE_SHARE * _SHARE_CODES)
PAGE_SHARES = st.integers(0, _SHARE_CODES - 1)


def _page_size(draw, dom: DraftSpace) -> int:
    """A page size of the domain: page 1 a third of the time (SGLang's default), on the GPU domain the
    largest page a quarter on top of its uniform share (arithmetic that assumes small pages breaks only
    there), else uniform over the pages above 1. Shrinks toward page 1."""
    code = draw(PAGE_SHARES)
    if code < _PAGE1_CODES or dom.page_sizes == (1,):
        return 1 if 1 in dom.page_sizes else dom.page_sizes[0]
    if dom.name != "cpu" and code < _PAGE1_CODES + _LARGEST_CODES:
        return dom.page_sizes[-1]
    return draw(sampled(tuple(p for p in dom.page_sizes if p != 1)))


def _weighted(draw, common: tuple, hi: int) -> int:
    """An integer in ``1..hi``: ``COMMON_SHARE`` of the time one of ``common`` (those up to ``hi``),
    otherwise uniform, so rare large values stay reachable. Shrinks toward ``common[0]`` (1)."""
    inside = tuple(v for v in common if v <= hi)
    if inside and draw(integers(0, round(1 / COMMON_SHARE) - 1)) == 0:
        return draw(sampled(inside))
    return draw(integers(1, hi))


def _bs_edges(dom: DraftSpace):
    buckets = dom.buckets_for(dom.max_bs)
    return {*buckets, *(lanes + 1 for lanes in LANE_WIDTHS), dom.max_bs}


#: ``entry_page_size`` draws: 1 first (the shrink target), then page-granular rows.
ENTRY_PAGE_SIZES = (1, 2, 4, 8)


def _family_example(draw, share: float) -> bool:
    """Whether this example draws the §6 fields: always at share 1, never at 0, else one draw of
    ``1/share`` codes whose last code says yes, so it shrinks toward "no §6 fields" (code 0)."""
    if share >= 1 or share <= 0:
        return share >= 1
    codes = round(1 / share)
    return draw(integers(0, codes - 1)) == codes - 1


def family_batches(config: Config, max_batches: int) -> int:
    """Batches of one example for ``config``: ``max_batches``, or at most ``FAMILY_MAX_BATCHES`` for a §6
    config, whose cases the host verdict checks one by one (kvfence.contracts.draft.domain)."""
    return min(max_batches, FAMILY_MAX_BATCHES) if config.is_family else max_batches


#: Odds that a §6 path (sinks beside a window, translation) is on in a §6 config where §6 examples are only a
#: share of the domain's (``DraftSpace.family_share`` < 1: the GPU domain); half where every example is §6's. On the
#: H200 the translation and sink mutants were the slowest kills at one in two
#: (``h200_kill_time_path_on_half.json``); ``benchmarks/prior_reach.py --examples-to-trigger --gpu-path-on 0.5``
#: draws as ``fuzz --device cuda`` draws (no kernel) and counts the examples to each trigger at these odds beside
#: one in two (BENCHMARKS.md). A fraction ``1 - 1/k``: one draw of ``k`` codes, code 0 (off) the shrink target.
RARE_PATH_ON = 3 / 4


def _path_on(draw, rare: bool) -> bool:
    """Whether a §6 path is on in a §6 config: half the time, or ``RARE_PATH_ON`` where §6 examples are rare."""
    if not rare:
        return draw(BOOLEANS)
    codes = round(1 / (1 - RARE_PATH_ON))
    return draw(integers(0, codes - 1)) > 0


def _family(draw, n: int, c: int, pinned: dict, family: bool, min_window: int, rail: bool,
            rare: bool = False) -> dict:
    """The §6 fields of one config (docs/contract.md §6), each pinned or, with ``family`` (this example
    draws them, ``_family_example``), drawn.

    * ``window_size``: none (a quarter of the time, and the shrink target) or ``1 .. num_steps+1`` (inside the draft
      chain) or ``1 .. ctx+num_steps+1``, so windows shorter than, equal to and longer than the requests
      (and the rail's ``L + n``) all occur; always
      ``>= 1`` for the rail and the ``window-*`` sizings (``min_window``), drawn then even without ``family``;
    * ``sink_size`` (draft only, beside a window): none half the time, else short (``1 .. 4``) or
      ``1 .. ctx+1``, so requests longer than window plus sinks and sinks longer than a request both occur;
    * ``entry_page_size``: 1, 2, 4 or 8, dividing neither ctx nor the pool row in particular;
    * ``translate``: off or on (the page table itself is drawn per batch, ``v2p_seed``).
    Nothing is drawn for a §2 run (``family`` off, no window needed): its draws are exactly as before.

    ``rare``: §6 examples are a share of the domain's (``DraftSpace.family_share`` < 1, the GPU domain), so sinks
    (beside a window) and translation are on at ``RARE_PATH_ON`` rather than half the time.
    """
    if "window_size" in pinned:
        w = pinned["window_size"]
    elif min_window == 0 and (not family or draw(TIERS) == 0):
        w = 0
    else:
        # Half the windows within the draft chain (w <= num_steps + 1: the rail's window then starts past
        # the prefix at the last steps), half anywhere up to past the longest request.
        w = draw(integers(1, n + 1)) if draw(BOOLEANS) else draw(integers(1, c + n + 1))
    if "sink_size" in pinned:
        sink = pinned["sink_size"]
    else:
        # Short sinks (1-4, a request then outruns window and sinks) or any up to past the longest request.
        sink = ((draw(integers(1, min(4, c + 1))) if draw(BOOLEANS) else draw(integers(1, c + 1)))
                if family and w and not rail and _path_on(draw, rare) else 0)
    e = pinned.get("entry_page_size") or (draw(sampled(ENTRY_PAGE_SIZES)) if family else 1)
    translate = pinned["translate"] if "translate" in pinned else (_path_on(draw, rare) if family else False)
    return dict(window_size=w, sink_size=sink, entry_page_size=e, translate=translate)


@st.composite
def _configs(draw, dom: DraftSpace, pins: tuple, fixed: tuple, max_bytes: Optional[int], family_pins: tuple = (),
             family_share: float = 0.0, min_window: int = 0, family_bytes: Optional[int] = None):
    pinned = dict(pins)
    # The production-weighted prior (kvfence.contracts.draft.domain): common topk and depths more often.
    t = pinned["topk"] if "topk" in pinned else _weighted(draw, COMMON_TOPK, dom.max_topk)
    n = pinned["num_steps"] if "num_steps" in pinned else _weighted(draw, COMMON_STEPS, dom.max_steps)
    p = pinned["page_size"] if "page_size" in pinned else _page_size(draw, dom)
    lo = min(n + 1, dom.max_ctx)
    if "ctx" in pinned:
        c = pinned["ctx"]
    elif dom.name == "cpu":
        c = draw(integers(lo, max(lo, dom.max_ctx)))
    else:
        # A small context still spans a page and more: a page-size bug needs requests that fill and
        # cross pages (edges and log-uniform draws still reach contexts below one page).
        c = sized(draw, lo, max(lo, dom.max_ctx), _ctx_edges(dom, lo) | _page_edges(p), small=max(64, 2 * p),
                  small_from=p + 1 if p > 1 else None)
    if "max_bs" in pinned:
        m = pinned["max_bs"]
    elif dom.name == "cpu":
        # The largest max_bs (its full bucket pads and sums over the most requests) a quarter of the time.
        # The tier first, then a count drawn whatever the tier: shrinking the tier leaves a count that
        # shrinks on its own, and a failure that needs more than one lets the shrinker trade the tier's
        # value for the count's (a lower tier, a higher count), so "the largest" shrinks to "just enough".
        full = draw(TIERS) == 3
        m = draw(integers(1, dom.max_bs))
        m = dom.max_bs if full else m
    else:
        m = sized(draw, 1, dom.max_bs, _bs_edges(dom))
    fixed_d = dict(fixed)
    rail = fixed_d["contract"] == "window-rail"
    family = _family_example(draw, family_share)
    if family and family_bytes is not None:
        return _bounded_family_config(draw, dom, pinned, fixed_d, (t, n, p, c, m), family_pins, min_window, rail,
                                      max_bytes, family_bytes, rare=family_share < 1)
    fields = _family(draw, n, c, dict(family_pins), family, min_window, rail, rare=family_share < 1)
    config = Config(topk=t, num_steps=n, page_size=p, ctx=c, max_bs=m, buckets=dom.buckets_for(m), **fixed_d, **fields)
    if max_bytes is not None:
        # configs() checked that the smallest config the pins allow fits; one whose drawn §6 fields cannot shrink to
        # fit stays as drawn, and its launch is refused in one line (kvfence.engine.checking.require_fits)
        config = _fit_bounded(config, (max_bytes,), _fit_order(draw, pinned))
    return config


def _fit_order(draw, pinned: dict) -> list:
    """The unpinned fields in the order they give way to a memory budget. The order is drawn too: long
    contexts and large batches both survive the budget (ctx first is the shrink target)."""
    order = ("ctx", "max_bs", "topk", "num_steps") if not draw(BOOLEANS) else ("max_bs", "topk", "num_steps", "ctx")
    return [name for name in order if name not in pinned]


def fit_config(config: Config, max_bytes: Optional[int], free: Sequence[str] = ("ctx", "max_bs", "topk", "num_steps")
               ) -> Optional[Config]:
    """``config`` fitted to ``max_bytes`` by the engine's ``fit``, priced by ``config_bytes`` (the engine's number
    for its widest launch), halving the ``free`` fields in order (ctx first: long contexts cost memory); None
    when even the smallest does not fit."""
    return fit(config, max_bytes, free, config_bytes, _halve)


def _halve(config: Config, name: str) -> Optional[Config]:
    """``config`` with field ``name`` halved (ctx stays above num_steps, the buckets end at max_bs), or None when
    it is at its floor already (``kvfence.engine.budget.fit``'s ``halve``)."""
    value = getattr(config, name)
    floor = config.num_steps + 1 if name == "ctx" else 1
    if value <= floor:
        return None
    changes: Dict[str, Any] = {name: max(floor, value // 2)}
    if name == "max_bs":
        changes["buckets"] = tuple(b for b in config.capture_buckets if b < changes[name]) + (changes[name],)
    return dataclasses.replace(config, **changes)


def _bounded_family_config(draw, dom: DraftSpace, pinned: dict, fixed: dict, sizes: tuple, family_pins: tuple,
                           min_window: int, rail: bool, max_bytes: Optional[int], family_bytes: int,
                           rare: bool) -> Config:
    """A §6 config of a share example (``DraftSpace.family_max_bytes``): the drawn sizes fitted to the bound
    first, then the §6 fields drawn against the fitted ``num_steps`` and ``ctx`` (so windows and sinks
    fall shorter and longer than the requests this config really holds), then fitted again (a page
    table adds bytes). What the bound cannot hold (pins with a large page) is fitted to ``max_bytes``."""
    t, n, p, c, m = sizes
    free = _fit_order(draw, pinned)
    least: Dict[str, Any] = dict(window_size=min_window, sink_size=0, entry_page_size=1, translate=False)
    least.update(dict(family_pins))
    base = _fit_bounded(Config(topk=t, num_steps=n, page_size=p, ctx=c, max_bs=m, buckets=dom.buckets_for(m),
                               **fixed, **least), (family_bytes, max_bytes), free)
    fields = _family(draw, base.num_steps, base.ctx, dict(family_pins), True, min_window, rail, rare=rare)
    return _fit_bounded(dataclasses.replace(base, **fields), (family_bytes, max_bytes), free)


def _fit_bounded(config: Config, bounds: tuple, free: list) -> Config:
    """``config`` fitted to the first of ``bounds`` that can hold it (``None``: no bound, as it is)."""
    for bound in bounds:
        if bound is None:
            return config
        fitted = fit_config(config, bound, free)
        if fitted is not None:
            return fitted
    return config


# -- cases ----------------------------------------------------------------------------------------------
def _check_case_args(kernel: str, seq_len_limit: str, canary_seed: int, where: str) -> None:
    require(seq_len_limit in SEQ_LEN_LIMITS,
            f"{where}(seq_len_limit={seq_len_limit!r}): choose {', '.join(SEQ_LEN_LIMITS)}")
    require(isinstance(kernel, str) and kernel, f"{where}(kernel={kernel!r}) must name a kernel")
    require(isinstance(canary_seed, int) and 0 <= canary_seed < 2**31,
            f"{where}(canary_seed={canary_seed!r}) out of range")


def cases(config_strategy=None, *, kernel: str = "reference", seq_len_limit: str = "ctx", canary_seed: int = 0):
    """A ``Case``: a config (from ``config_strategy``, default ``configs()``), then a batch for it."""
    _check_case_args(kernel, seq_len_limit, canary_seed, "cases")
    return _cases(config_strategy if config_strategy is not None else configs(), kernel, seq_len_limit, canary_seed)


@st.composite
def _cases(draw, config_strategy, kernel: str, seq_len_limit: str, canary_seed: int):
    config = draw(config_strategy)
    batch = draw(cached_batches(config, seq_len_limit, 1))
    return Case(config, batch, kernel, canary_seed)


def case_runs(config_strategy=None, *, kernel: str = "reference", seq_len_limit: str = "ctx", canary_seed: int = 0,
              max_batches: int = 8, bulk: int = 0, bulk_after: float = 0.0):
    """A list of 1..``max_batches`` ``Case``s sharing one config: successive replays of one captured
    configuration, as a server replays its graphs. One Hypothesis example then checks many batches,
    which spreads the engine's per-example cost and the config's compile and capture (the GPU's
    config-major mode). The count is drawn uniformly (not list-shrinking's short average), and
    shrinks toward one batch: the failing batch is always the last one checked.

    ``bulk=N`` (default 0: exactly the draws above) adds, after those batches and one more Hypothesis
    choice that turns it on (15 times in 16; it shrinks to off), up to ``N`` batches drawn by the same
    code from a ``FastDraw`` seeded by a digest of the example, distinct in structure (lengths and pool
    rows) from each other and from the Hypothesis-drawn ones. The list is then a ``CaseRun``: which
    cases are bulk, and the Hypothesis choices that replay each of them alone (``CaseRun.splice``).

    ``bulk_after=T`` seconds (default 0: from the first example) keeps the bulk off until ``T`` seconds
    after this strategy's first draw: until then an example is exactly what ``bulk=0`` draws (no switch
    choice, no bulk), so the bugs that die within ``T`` die as fast as without the bulk, and the bulk adds
    depth (new structures per config) to the rest of a long run. A wall-clock gate: two runs of one seed
    may open it at different examples (a failure among the bulk is replayed through its splice, not
    through the example).
    """
    _check_case_args(kernel, seq_len_limit, canary_seed, "case_runs")
    require(isinstance(max_batches, int) and not isinstance(max_batches, bool) and max_batches >= 1,
            f"case_runs(max_batches={max_batches!r}) must be >= 1")
    require(isinstance(bulk, int) and not isinstance(bulk, bool) and bulk >= 0,
            f"case_runs(bulk={bulk!r}) must be a non-negative integer")
    require(isinstance(bulk_after, (int, float)) and not isinstance(bulk_after, bool) and 0 <= bulk_after < 1e9,
            f"case_runs(bulk_after={bulk_after!r}) must be a number of seconds >= 0")
    return _case_runs(config_strategy if config_strategy is not None else configs(), kernel, seq_len_limit,
                      canary_seed, max_batches, bulk, BulkGate(bulk_after) if bulk else None)


class BulkGate:
    """When the bulk of a ``case_runs`` strategy opens: ``after`` seconds past the strategy's first draw."""

    __slots__ = ("after", "start")

    def __init__(self, after: float):
        self.after = float(after)
        self.start: Optional[float] = None

    def open(self) -> bool:
        now = time.monotonic()
        if self.start is None:
            self.start = now
        return now - self.start >= self.after


#: The Hypothesis choice that turns a ``case_runs`` example's bulk on: mostly on while generating,
#: index 0 (off) is the shrink target, so a shrunk failure is one Hypothesis-drawn batch.
BULK_SWITCH = st.sampled_from((False,) + (True,) * 15)
#: The choice index of ``BULK_SWITCH`` that turns the bulk off (what a spliced example ends with).
BULK_OFF = 0
#: Bulk draws in a row that repeat a structure before the bulk of an example stops early.
BULK_PATIENCE = 64


class CaseRun(list):
    """The ``Case``s of one ``case_runs(bulk=N)`` example: the Hypothesis-drawn ones first, then from
    ``bulk_start`` the bulk. ``bulk_choices[i]`` are the recorded choices of case ``bulk_start + i``;
    ``prefix`` the example's Hypothesis choices up to and including its config (None when this
    Hypothesis does not expose them). Kept beside the cases, so a ``Case`` compares and hashes as ever."""

    __slots__ = ("bulk_start", "bulk_choices", "prefix")
    bulk_start: int
    bulk_choices: List[List[Any]]
    prefix: Optional[tuple]

    def splice(self, index: int) -> Optional[tuple]:
        """The choice sequence of an example of the same strategy that holds only case ``index`` (a bulk
        one): its config's choices, one batch, that batch's recorded choices, the bulk off."""
        if self.prefix is None or index < self.bulk_start:
            return None
        return self.prefix + (1,) + tuple(self.bulk_choices[index - self.bulk_start]) + (BULK_OFF,)


def _choices_so_far() -> Optional[tuple]:
    """The choices the running Hypothesis example has made so far (internal: its ``ConjectureData``),
    or None outside Hypothesis or where its internals differ."""
    try:
        from hypothesis.control import _current_build_context

        context = _current_build_context.value
        if context is None:  # outside Hypothesis
            return None
        return tuple(node.value for node in context.data.nodes)
    except Exception:  # noqa: BLE001 - any other Hypothesis: the bulk still runs, a failure stays unshrunk
        return None


def _structure(batch: Batch) -> tuple:
    return batch.seq_lens, batch.req_pool_indices


def _example_key(config: Config, drawn: list) -> int:
    """A digest of an example's config and Hypothesis-drawn batches, the same in every process: it keys
    the batches' token tables and seeds the bulk, so a replay of the example gives the same cases."""
    shape = repr((config, [(b.seq_lens, b.req_pool_indices, b.token_seed) for b in drawn]))
    return int.from_bytes(hashlib.blake2b(shape.encode(), digest_size=8).digest(), "little")


@st.composite
def _case_runs(draw, config_strategy, kernel: str, seq_len_limit: str, canary_seed: int, max_batches: int,
               bulk: int = 0, gate: Optional[BulkGate] = None):
    if bulk and gate is not None and not gate.open():
        bulk = 0  # before the gate opens: exactly bulk=0's draws
    config = draw(config_strategy)
    prefix = _choices_so_far() if bulk else None
    count = draw(integers(1, family_batches(config, max_batches)))
    batch = cached_batches(config, seq_len_limit, 1)
    drawn = [draw(batch) for _ in range(count)]
    key = None
    if count == 1:
        cases = [Case(config, drawn[0], kernel, canary_seed)]  # keeps its drawn seed, which shrinks to 0
    else:
        # Hypothesis builds new examples from earlier ones, so the batches of different examples coincide
        # most of the time (9 in 10 cases of a GPU run were repeats). Each batch's token table is keyed by a
        # digest of the whole example and its index: two examples that differ anywhere share no case, the
        # batches of one example differ from each other, and replaying an example (shrinking) gives the same
        # cases. Lengths and pool rows stay exactly as drawn, so structure still shrinks as usual.
        key = _example_key(config, drawn)
        cases = [Case(config, Batch(b.seq_lens, b.req_pool_indices,
                                    (b.token_seed + key + i * 0x9E3779B1) % 2**SLOT_BITS, b.v2p_seed),
                      kernel, canary_seed) for i, b in enumerate(drawn)]
    if not bulk:
        return cases
    run = CaseRun(cases)
    run.bulk_start, run.bulk_choices, run.prefix = len(cases), [], prefix
    if not draw(BULK_SWITCH):
        return run
    if key is None:
        key = _example_key(config, drawn)
    # The bulk: the same draw code from a PRNG seeded by the example (a replay gives the same batches),
    # each structure once: a repeat would only re-draw its token table.
    source = FastDraw(random.Random(key))
    bound = seq_len_bound(config, seq_len_limit)
    seen = {_structure(b) for b in drawn}
    repeats = 0
    # A §6 config is verified on the host (kvfence.contracts.draft.domain.GPU_FAMILY_SHARE): no bulk for it.
    for _ in range(0 if config.is_family else bulk):
        source.choices = []
        b = draw_batch(source, config, bound, 1)
        shape = _structure(b)
        if shape in seen:
            repeats += 1
            if repeats >= BULK_PATIENCE:
                break  # a config with few structures (one request, a short context): they are all drawn
            continue
        repeats = 0
        seen.add(shape)
        run.append(Case(config, b, kernel, canary_seed))
        run.bulk_choices.append(source.choices)
    return run
