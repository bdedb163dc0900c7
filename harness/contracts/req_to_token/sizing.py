"""Row-width policies of the request-row writer contract (docs/contract.md §10, "Sizing"): ``(case, mode) -> W``,
the width of every ``req_to_token`` row (positions).

Named policies (kvfence's own code): ``safe``, ``pr33581`` (the headroom SGLang's open fix #33581 describes),
and four planted sizing bugs, ``release-page1``, ``context``, and on the decode-context-parallel axis
``scheduled-page`` and ``safe-scheduled-page`` (headrooms taken at the scheduled page ``P`` where the allocator
pages at ``A = P * dcp_size``, SGLang 0.5.18's shape, sglang#35424). On lookup also a release's shipped sizing,
``sglang==V:ALGORITHM`` (``DFLASH``, ``DSPARK``, ``EAGLE``, ``EAGLE3``, ``UNO``): the release's own row width for
that ``--speculative-algorithm``, read from its wheel (``release_read``) and evaluated at the case's config.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Optional, Tuple

from kvfence.contracts.req_to_token.case import ReqToTokenCase
from kvfence.errors import BadInput, require

RELEASE = re.compile(r"^sglang==([0-9A-Za-z.+-]+):([A-Za-z0-9_]+)$")


def alloc_len_0523(D: int, steps: int, topk: int, P: int) -> int:
    """Tokens one decode step may allocate per request in SGLang 0.5.23 for an algorithm with draft KV other than
    UNO (``get_alloc_len_per_decode``, ``mem_cache/allocation_sizing.py:28-61``): ``max(steps * topk, D)``, or at
    ``P > 1`` with ``topk > 1`` the page-rounded footprint of every branch."""
    if P == 1 or topk == 1:
        return max(steps * topk, D)
    pages = (2 * (P - 1) + steps) // P
    return max(pages * P * topk, D)


def _safe(case: ReqToTokenCase, mode: str) -> int:
    """``ctx + reserve + A - 1``: room for a request committed at the context length plus the step's
    reservation, rounded up to the allocator's page ``A = P * dcp_size``."""
    return case.ctx + case.reserve + case.alloc_page - 1


def _headroom(case: ReqToTokenCase, page: int) -> int:
    """``max(4 + D, 2 * alloc_len + page - 1)`` with ``alloc_len`` as ``alloc_len_0523`` at ``page``."""
    reserve = 2 * alloc_len_0523(case.draft_tokens, case.steps, case.topk, page)
    return max(4 + case.draft_tokens, reserve + page - 1)


def _pr33581(case: ReqToTokenCase, mode: str) -> int:
    """``ctx + max(4 + D, 2 * alloc_len + A - 1)``: 0.5.23's widened headroom taken at every page size, as
    SGLang's open fix #33581 describes it (the double-buffer reserve applies at every page size, only the
    ``A - 1`` alignment is page-specific), at the allocator's page ``A = P * dcp_size`` as 0.5.19's
    ``get_alloc_page_size`` takes it (the fix of sglang#35424); ``alloc_len`` as ``alloc_len_0523``."""
    return case.ctx + _headroom(case, case.alloc_page)


def _scheduled_page(case: ReqToTokenCase, mode: str) -> int:
    """``pr33581``'s headroom at the scheduled page ``P``, not the allocator's ``P * dcp_size`` (SGLang 0.5.18's
    ``get_req_to_token_extra_context_len`` reads ``get_schedule().page_size``): a planted bug of the DCP axis,
    the same rows as ``pr33581`` without DCP."""
    return case.ctx + _headroom(case, case.page_size)


def _safe_scheduled_page(case: ReqToTokenCase, mode: str) -> int:
    """``ctx + reserve + P - 1``: ``safe`` rounded to the scheduled page instead of the allocator's (a planted bug
    of the DCP axis)."""
    return case.ctx + case.reserve + case.page_size - 1


def _release_page1(case: ReqToTokenCase, mode: str) -> int:
    """``ctx + 4 + D``: 0.5.23's row at page size 1 for every algorithm but UNO
    (``get_req_to_token_extra_context_len``, ``mem_cache/allocation_sizing.py:105``), at every page size: a
    planted bug that needs no wheel; the release's own sizing is ``sglang==0.5.23:ALGORITHM``."""
    return case.ctx + 4 + case.draft_tokens


def _context(case: ReqToTokenCase, mode: str) -> int:
    """``ctx``: rows as wide as the context, no headroom for the step's reservation (a planted bug)."""
    return case.ctx


POLICIES = {"safe": _safe, "pr33581": _pr33581, "release-page1": _release_page1, "context": _context,
            "scheduled-page": _scheduled_page, "safe-scheduled-page": _safe_scheduled_page}


def parse_release(spec) -> Optional[Tuple[str, str]]:
    """``(version, algorithm)`` of a ``sglang==V:ALGORITHM`` spec (syntax only), else None."""
    match = RELEASE.match(spec) if isinstance(spec, str) else None
    return (match.group(1), match.group(2).upper()) if match else None


def check_release(spec: str) -> Tuple[str, str]:
    from kvfence.contracts.req_to_token.release_read import ALGORITHMS
    from kvfence.release.wheels import check_version

    parsed = parse_release(spec)
    if parsed is None:
        raise BadInput(f"sizing {spec!r}: expected sglang==VERSION:ALGORITHM")
    version, algorithm = parsed
    check_version(version)
    require(algorithm in ALGORITHMS, f"sizing {spec!r}: kvfence reads the row sizing of "
                                     f"{', '.join(ALGORITHMS)}, not {algorithm}")
    return version, algorithm


def _config(algorithm: str, D: int, steps: int, topk: int, P: int, dcp: int):
    from kvfence.contracts.req_to_token.release_read import Config

    return Config(algorithm, D, steps, topk, P, dcp)


@functools.lru_cache(maxsize=4096)
def release_extra(version: str, algorithm: str, D: int, steps: int, topk: int, P: int, dcp: int = 1) -> int:
    """The release's row headroom past the context length for one config (``BadInput`` when not readable)."""
    from kvfence.contracts.req_to_token.release_read import load, row_width_extra

    return row_width_extra(load(version), _config(algorithm, D, steps, topk, P, dcp)).value


@functools.lru_cache(maxsize=4096)
def release_reserve(version: str, algorithm: str, D: int, steps: int, topk: int, P: int, dcp: int = 1) -> int:
    """The tokens the release's decode step reserves past the committed length for one config."""
    from kvfence.contracts.req_to_token.release_read import load, reservation

    return reservation(load(version), _config(algorithm, D, steps, topk, P, dcp)).value


@functools.lru_cache(maxsize=256)
def release_alloc_page(version: str, algorithm: str, D: int, steps: int, topk: int, P: int, dcp: int) -> int:
    """The page the release's decode step aligns its end to (its KV allocator's) for one config."""
    from kvfence.contracts.req_to_token.release_read import alloc_page, load

    return alloc_page(load(version), _config(algorithm, D, steps, topk, P, dcp)).value


@functools.lru_cache(maxsize=64)
def release_reads_dcp(version: str, algorithm: str) -> bool:
    """Whether the release's rows, reservation and allocator page are read at a DCP size above 1, its allocator
    paging at ``P * dcp`` as the case model aligns (a release kvfence cannot read there is drawn at ``dcp_size`` 1
    only)."""
    try:
        for P in (1, 16):
            release_extra(version, algorithm, 4, 3, 1, P, 2)
            release_reserve(version, algorithm, 4, 3, 1, P, 2)
            if release_alloc_page(version, algorithm, 4, 3, 1, P, 2) != 2 * P:
                return False
    except BadInput:
        return False
    return True


def release_admission(version: str) -> Optional[int]:
    """``K`` of the scheduler's bound ``committed <= ctx - K`` read from the release, or None where not read."""
    from kvfence.contracts.req_to_token.release_read import load

    return load(version)["admission"].get("minus")


def release_policy(spec: str):
    version, algorithm = check_release(spec)
    release_extra(version, algorithm, 2, 1, 1, 1)  # BadInput now when the release cannot be read
    release_reserve(version, algorithm, 2, 1, 1, 1)

    def width(case: ReqToTokenCase, mode: str) -> int:
        return case.ctx + release_extra(version, algorithm, case.draft_tokens, case.steps, case.topk,
                                        case.page_size, case.dcp_size)

    width.__doc__ = f"the row width sglang=={version} gives under --speculative-algorithm {algorithm}"
    return width


class Sizings(Mapping):
    """The named policies, and on lookup a release's shipped sizing ``sglang==V:ALGORITHM``."""

    def __iter__(self):
        return iter(POLICIES)

    def __len__(self) -> int:
        return len(POLICIES)

    def __contains__(self, spec) -> bool:
        return isinstance(spec, str) and (spec in POLICIES or parse_release(spec) is not None)

    def __getitem__(self, spec):
        if not (isinstance(spec, str) and spec in self):
            raise KeyError(spec)
        if spec in POLICIES:
            return POLICIES[spec]
        try:
            return release_policy(spec)
        except RecursionError:
            raise BadInput(f"sizing {spec!r}: the release's code nests too deep to read") from None
