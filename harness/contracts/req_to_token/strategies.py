"""Hypothesis strategies of the request-row writer contract (docs/contract.md §10, "Draws").

``req_to_token_cases(domain, sizing, pins)`` draws one decode step's reservation as the fields of
``kvfence.contracts.req_to_token.case.ReqToTokenCase``. The config: a page size (1 first: the page size whose row
SGLang 0.5.23 does not widen), a context length, and an algorithm family's settings and reservation: the DFlash
family (steps and topk 1, ``2 * D`` reserved per step) or EAGLE's (steps, topk, ``D``; ``2 * alloc_len``), or
under a release's sizing ``sglang==V:ALGORITHM`` that algorithm's, read from the release; and a
decode-context-parallel size (1, 2, 4 or 8, shrinking to 1; ``--dcp-size`` pins it; under a release's
sizing 1 unless pinned, and pinned above 1 only where kvfence reads the release's rows, reservation and allocator
page at DCP), whose allocator
page ``P * dcp_size`` the step's end is aligned to. The batch: per request
a committed length, often at the wall (the longest the scheduler admits: ``ctx - K`` under a release's sizing,
whose ``K`` is read from it; ``ctx`` otherwise), what its row already holds (``committed`` up to the last step's
reservation, or less: a row rebuilt from a shorter prefix), and a distinct pool row among spare ones.

Each draw is one of two scenarios, the wall first (request 0 committed at the wall, so every run's first
example is the simplest wall launch and failures shrink toward it), or any lengths. Everything shrinks toward
page 1, a small context, one request with nothing allocated past its committed length, in pool row 0.
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvfence.contracts.req_to_token.case import MAX_DCP, PAGE_SIZES, align
from kvfence.contracts.req_to_token.sizing import alloc_len_0523, parse_release
from kvfence.draws import edge_or
from kvfence.errors import require

#: Domain bounds: (largest context, most requests, most elements of req_to_token).
DOMAINS = {"cpu": (384, 4, 1 << 14), "gpu": (262144, 256, 1 << 24)}
MAX_D = 32
D_EDGES = (1, 2, 4, 8, 9, 16, 17, 32)
#: The algorithms whose settings are the DFlash family's (steps and topk forced to 1 by SGLang's
#: ``_handle_dflash`` / ``_handle_dspark``, ``arg_groups/speculative_hook.py``).
DFLASH_FAMILY = ("DFLASH", "DSPARK")
#: Decode-context-parallel sizes drawn (SGLang's ``--dcp-size``), and the widest allocator page drawn (an EAGLE
#: reservation with topk > 1 grows with the page: past 256 it outgrows the case's bounds).
DCP_SIZES = (1, 2, 4, 8)
MAX_DRAWN_UNIT = 256



def _release(sizing: str):
    """``(version, algorithm, K)`` under a release's sizing (``K``: its admission bound, None unread), else None."""
    parsed = parse_release(sizing)
    if parsed is None:
        return None
    from kvfence.contracts.req_to_token.sizing import check_release, release_admission

    version, algorithm = check_release(sizing)
    return version, algorithm, release_admission(version)


def _dcp(draw, page: int, pins: dict, release) -> int:
    """The DCP size: pinned, else drawn under kvfence's own sizings; under a release's sizing 1 unless pinned (a
    deployment runs one DCP size, ``--dcp-size`` names it: the release's rows without DCP keep the whole budget)."""
    pinned = pins.get("dcp_size")
    if release:
        from kvfence.contracts.req_to_token.sizing import release_reads_dcp

        if pinned in (None, 1):
            return 1
        require(release_reads_dcp(release[0], release[1]), f"--dcp-size {pinned}: kvfence does not read "
                f"sglang=={release[0]}'s rows, reservation and allocator page under decode context parallelism")
    if pinned is not None:
        require(1 <= pinned <= MAX_DCP, f"--dcp-size {pinned}: must be in [1, {MAX_DCP}]")
        return pinned
    return draw(st.sampled_from([d for d in DCP_SIZES if page * d <= MAX_DRAWN_UNIT]))


@st.composite
def _settings(draw, family: str, page: int, dcp: int, pins: dict, release):
    """``(D, steps, topk, reserve)`` of one algorithm family at page ``page``."""
    steps_pin, topk_pin = pins.get("num_steps"), pins.get("topk")
    if family == "dflash":
        require(topk_pin in (None, 1) and steps_pin in (None, 1),
                "the DFlash family runs with --topk 1 and --num-steps 1 (SGLang forces both)")
        low = 2 if release and release[1] == "DSPARK" else 1  # DSPARK: gamma + 1 draft tokens, gamma >= 1
        D, steps, topk = edge_or(draw, low, MAX_D, D_EDGES), 1, 1
    else:
        steps = steps_pin or draw(st.integers(1, 8))
        topk = topk_pin or draw(st.integers(1, 8))
        D = steps + 1 if topk == 1 else edge_or(draw, 2, 64, (8, 16, 32, 64))
    if release:
        from kvfence.contracts.req_to_token.sizing import release_reserve

        reserve = release_reserve(release[0], release[1], D, steps, topk, page, dcp)
    else:
        reserve = 2 * (D if family == "dflash" else alloc_len_0523(D, steps, topk, page * dcp))
    return D, steps, topk, reserve


@st.composite
def req_to_token_cases(draw, domain: str, sizing: str, pins: dict):
    require(domain in DOMAINS, f"domain={domain!r}: choose from {', '.join(DOMAINS)}")
    max_ctx, most, max_elements = DOMAINS[domain]
    release = _release(sizing)
    wall_gap = (release[2] if release[2] is not None else 0) if release else 0
    page = pins.get("page_size") or draw(st.one_of(st.just(1), st.sampled_from(PAGE_SIZES)))
    require(page in PAGE_SIZES, f"--page-size {page}: choose from {', '.join(map(str, PAGE_SIZES))}")
    if release:
        family = "dflash" if release[1] in DFLASH_FAMILY else "eagle"
    elif pins.get("topk", 1) > 1 or pins.get("num_steps", 1) > 1:
        family = "eagle"
    else:
        family = draw(st.sampled_from(("dflash", "eagle")))
    dcp = _dcp(draw, page, pins, release)
    D, steps, topk, reserve = draw(_settings(family, page, dcp, pins, release))
    unit = page * dcp  # the allocator's page
    low = wall_gap + 1
    ctx = pins.get("ctx")
    if ctx is None:
        ctx = edge_or(draw, low, max(low, max_ctx), (unit, unit + 1, 2 * unit - 1, 32, 33, 64, 65, 100, 128, 255,
                                                       256, 4096, 32768, 131072, max_ctx))
    require(low <= ctx <= 1 << 20, f"--ctx {ctx}: must be in [{low}, 2**20] here")
    wall = ctx - wall_gap
    width = ctx + reserve + unit - 1 + 64
    most = max(1, min(most, max_elements // width))
    scenario = draw(st.sampled_from(("wall", "any")))
    n = draw(st.integers(1, most))
    committed, allocated = [], []
    for b in range(n):
        if scenario == "wall" and b == 0:
            c = wall - draw(st.integers(0, D))
        else:
            c = edge_or(draw, min(1, wall), wall, (wall, wall - 1, wall - D, 1))
        c = max(0, c)
        target = align(c + reserve, unit)
        if draw(st.integers(0, 3)) < 3:  # what the last step reserved: committed .. this step's end
            a = c + draw(st.integers(0, max(0, target - c)))
        else:  # a row rebuilt from a shorter prefix
            a = draw(st.integers(0, c))
        committed.append(c)
        allocated.append(a)
    spare = draw(st.integers(0, 2))
    rows = draw(st.permutations(range(n + spare)))[:n]
    seed = draw(st.integers(0, 2 ** 16))
    return dict(ctx=ctx, page_size=page, draft_tokens=D, steps=steps, topk=topk, reserve=reserve,
                committed=tuple(committed), allocated=tuple(allocated), req_pool_indices=tuple(rows),
                pool_rows=n + spare, seed=seed, dcp_size=dcp)
