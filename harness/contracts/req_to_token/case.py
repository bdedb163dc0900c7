"""The case of the request-row writer contract (docs/contract.md §10) and its plain-Python oracle.

A case is one decode step's reservation for a batch: the config (the model's context length, the page size,
the speculative settings and the tokens the step reserves past each request's committed length) and, per
request, its committed length (``kv_committed_len``), what its row already holds (``kv_allocated_len``), its pool
row. The writer's inputs follow as SGLang's ``page_aligned_decode_alloc_lens`` computes them: request ``b``
writes positions ``[start_b, end_b)`` with ``start_b = allocated_b`` and
``end_b = max(allocated_b, ceil((committed_b + reserve) / A) * A)``, taking its slots from ``out_cache_loc`` after
those of the requests before it. ``A`` is the KV allocator's page, the step's alignment: the scheduled page size
``P`` times the decode-context-parallel size ``dcp_size`` (SGLang's ``attn_dcp_size``: under DCP its paged
allocator pages at ``page_size * attn_dcp_size``); 1 without DCP, the default a case file without the field gets.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Dict, List, NamedTuple, Tuple

from kvfence.errors import require

PAGE_SIZES = (1, 16, 32, 64, 128)
#: Decode-context-parallel sizes a case may have (SGLang's ``--dcp-size``; the draws take 1, 2, 4, 8).
MAX_DCP = 64
#: Bounds a case file may ask for (the GPU domain stays well inside them).
MAX_CTX = 1 << 20
MAX_REQUESTS = 1024
MAX_POOL_ROWS = 4096
MAX_SETTING = 64
MAX_RESERVE = 1 << 14
#: The first slot id ``out_cache_loc`` hands out: slots are positive, distinct, and none is the poison.
FIRST_SLOT = 1


def align(n: int, page: int) -> int:
    return -(-n // page) * page


@dataclass(frozen=True)
class ReqToTokenCase:
    ctx: int
    page_size: int
    draft_tokens: int
    steps: int
    topk: int
    reserve: int
    committed: Tuple[int, ...]
    allocated: Tuple[int, ...]
    req_pool_indices: Tuple[int, ...]
    pool_rows: int
    seed: int = 0
    dcp_size: int = 1

    @property
    def alloc_page(self) -> int:
        """The allocator's page, which the step's end is aligned to: ``page_size * dcp_size``."""
        return self.page_size * self.dcp_size

    @property
    def bs(self) -> int:
        return len(self.committed)

    def start(self, b: int) -> int:
        return self.allocated[b]

    def end(self, b: int) -> int:
        return max(self.allocated[b], align(self.committed[b] + self.reserve, self.alloc_page))

    def length(self, b: int) -> int:
        return self.end(b) - self.start(b)

    @property
    def total(self) -> int:
        return sum(self.length(b) for b in range(self.bs))

    def offset(self, b: int) -> int:
        """Where request ``b``'s slots begin in ``out_cache_loc``: the lengths of the requests before it."""
        return sum(self.length(i) for i in range(b))

    def validate(self) -> "ReqToTokenCase":
        require(1 <= self.ctx <= MAX_CTX, f"ctx must be in [1, {MAX_CTX}]")
        require(self.page_size in PAGE_SIZES, f"page_size {self.page_size} is not one of {PAGE_SIZES}")
        for name in ("draft_tokens", "steps", "topk"):
            require(1 <= getattr(self, name) <= MAX_SETTING, f"{name} must be in [1, {MAX_SETTING}]")
        require(0 <= self.reserve <= MAX_RESERVE, f"reserve must be in [0, {MAX_RESERVE}]")
        require(1 <= self.bs <= MAX_REQUESTS, f"a case has 1 .. {MAX_REQUESTS} requests")
        require(len(self.allocated) == self.bs and len(self.req_pool_indices) == self.bs,
                "committed, allocated and req_pool_indices: one entry per request")
        require(all(0 <= c <= self.ctx for c in self.committed), "every committed length must be in [0, ctx]")
        require(1 <= self.dcp_size <= MAX_DCP, f"dcp_size must be in [1, {MAX_DCP}]")
        top = self.ctx + self.reserve + self.alloc_page - 1
        require(all(0 <= a <= top for a in self.allocated),
                f"every allocated length must be in [0, ctx + reserve + page_size * dcp_size - 1] = [0, {top}]")
        require(1 <= self.pool_rows <= MAX_POOL_ROWS, f"pool_rows must be in [1, {MAX_POOL_ROWS}]")
        require(len(set(self.req_pool_indices)) == self.bs
                and all(0 <= r < self.pool_rows for r in self.req_pool_indices),
                "req_pool_indices: one distinct pool row per request, each below pool_rows")
        require(0 <= self.seed < 1 << 32, "seed must be in [0, 2**32)")
        return self


FIELDS = tuple(ReqToTokenCase.__dataclass_fields__)
#: Fields a case file may leave out, with their defaults (``dcp_size``: files written before the DCP axis).
OPTIONAL = {"seed": 0, "dcp_size": 1}


def to_json(case: ReqToTokenCase) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(case).items()}


def from_json(data) -> ReqToTokenCase:
    require(isinstance(data, dict), "case: expected an object")
    unknown = sorted(set(data) - set(FIELDS))
    require(not unknown, f"case: unknown field(s) {', '.join(map(str, unknown))[:200]}")
    missing = [k for k in FIELDS if k not in data and k not in OPTIONAL]
    require(not missing, f"case: missing field(s) {', '.join(missing)}")
    for key in ("ctx", "page_size", "draft_tokens", "steps", "topk", "reserve", "pool_rows", "seed", "dcp_size"):
        require(type(data.get(key, 0)) is int, f"case: {key} must be an integer")
    lists = {}
    for key in ("committed", "allocated", "req_pool_indices"):
        value = data[key]
        require(isinstance(value, list) and len(value) <= MAX_REQUESTS and all(type(v) is int for v in value),
                f"case: {key} must be a list of at most {MAX_REQUESTS} integers")
        lists[key] = tuple(value)
    return ReqToTokenCase(data["ctx"], data["page_size"], data["draft_tokens"], data["steps"], data["topk"],
                          data["reserve"], lists["committed"], lists["allocated"], lists["req_pool_indices"],
                          data["pool_rows"], data.get("seed", OPTIONAL["seed"]),
                          data.get("dcp_size", OPTIONAL["dcp_size"])).validate()


# -- the oracle ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def slots(case: ReqToTokenCase):
    """``out_cache_loc``: the step's new KV slots, request after request; distinct positive ids (a seeded shuffle),
    as a KV allocator hands them out."""
    import numpy as np

    return np.random.default_rng(case.seed).permutation(case.total).astype(np.int64) + FIRST_SLOT


def written(case: ReqToTokenCase) -> Dict[Tuple[int, int], int]:
    """Every element the launch defines: ``(pool row, position) -> slot``; positions at or past the row's width
    are the ones the row cannot hold."""
    out, loc = {}, slots(case)
    for b in range(case.bs):
        row, first, base = case.req_pool_indices[b], case.start(b), case.offset(b)
        for t in range(case.length(b)):
            out[(row, first + t)] = int(loc[base + t])
    return out


def need(case: ReqToTokenCase) -> int:
    """The row width the launch needs: the furthest position any request writes."""
    return max(case.end(b) for b in range(case.bs))


class Program(NamedTuple):
    """A program of the writer's grid ``(bs,)``, in findings ``request 2``."""

    request: int


def owner_of(case: ReqToTokenCase, row: int, column: int):
    for b in range(case.bs):
        if case.req_pool_indices[b] == row and case.start(b) <= column < case.end(b):
            return Program(b)
    return None


def past_row(case: ReqToTokenCase, width: int) -> List[Tuple[int, int, int]]:
    """``(request, first position past the row, end)`` of every request that writes past a row of ``width``."""
    return [(b, max(width, case.start(b)), case.end(b)) for b in range(case.bs) if case.end(b) > width]

