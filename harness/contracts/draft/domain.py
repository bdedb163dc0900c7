"""The draft's config space on each of the engine's domains: ``CPU`` (interpreter-sized) or ``GPU``
(production-sized), by the name of the run's ``kvfence.contract.Domain`` (the one domain; this is only its bounds
for the draft kernel's configs).

A ``DraftSpace`` is data, defined once here and used by the strategies, the CLI (``--scale``), the run
summary (``domain``) and the boundary-coverage statistics. The GPU domain reaches what SGLang really
captures on an H200: up to 256 requests in speculative-decoding capture buckets, contexts up to
131072 tokens, topk and draft steps up to 16, every page size from 1 to 128. The CPU domain keeps
launches small enough for the Triton interpreter (milliseconds per program).

Draws follow a production-weighted prior (``kvfence.contracts.draft.strategies``), so the plain command spends most
of its time where SGLang deployments run while still reaching every value of the domain:

* ``page_size``: page 1 (SGLang's default page size) in a third of the draws (``PAGE1_SHARE``); on the
  GPU domain the largest page in a quarter (``LARGEST_PAGE_SHARE``: arithmetic that assumes small pages
  breaks only there); the rest uniform over the pages above 1 (the largest included).
* ``topk``: half the draws from ``COMMON_TOPK`` (1, 2, 4, 8: the values EAGLE deployments configure),
  half uniform over ``1..max_topk``, so topk above 8 stays reachable (a quarter of GPU draws).
* ``num_steps``: half from ``COMMON_STEPS`` (1-5: the usual draft depths), half uniform over
  ``1..max_steps`` (steps above 8: a quarter of GPU draws).

Each weighted draw shrinks toward its simplest value (page 1, topk 1, one step), and Hypothesis leans
further toward those, so measured shares of page 1 run above a third (``benchmarks/prior_reach.py``
counts them, and how often each mutant's trigger is drawn; docs/contract.md §5). The edge classes
(copy blocks, lane widths, pages, the context limit, padded buckets) keep their share of the length,
context and batch draws, which this prior does not touch.

The §6 fields (docs/contract.md §6: window, sinks, page-granular rows, translation) are drawn, for a
kernel that takes them, in a share of the examples (``DraftSpace.family_share``): every example on the CPU
domain; on the GPU domain one in four (``GPU_FAMILY_SHARE``), each such config fitted to
``HOST_VERDICT_MAX_BYTES`` (16 MiB) and replayed for at most ``FAMILY_MAX_BATCHES`` batches. The device
verifier checks §2 only, so a §6 case goes to the host verdict, one case at a time: small configs and
few batches keep a §6 example's checking about as cheap as a §2 one's, and the rest of the GPU prior is
untouched. A §6 config also compiles its own kernel variant (window and sinks are constexprs of the
kernel), which the run summary counts in ``compiles`` and ``compile_s``. The share is one draw per
example that shrinks toward "no §6 fields" (``fuzz --family auto``; ``on`` draws them in every
example, ``off`` in none).

``boundary_classes(case)`` names the size boundaries a case sits on (copy blocks, lane widths,
pages, the context limit, bucket padding); the coverage tests and the summary count them, so "the
GPU run reaches 513-token prefixes and 129-branch batches" is a measured statement, not a hope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Optional, Set, Tuple

from kvfence.contracts.draft.case import default_buckets as power_of_two_buckets  # 1, 2, 4, ... then max_bs
from kvfence.errors import require

#: Request counts SGLang captures graphs for when speculative decoding is on (its default list, as a
#: fact: 1-8, then every 2 up to 32, every 16 from 40 to 160, and on GPUs with more than 90 GB, every 8
#: from 160 to 256). A runner with ``max_bs`` captures those below it, then ``max_bs`` itself.
SPECULATIVE_CAPTURE_BS = tuple(sorted(set(
    list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 161, 16)) + list(range(160, 257, 8)))))

#: Prefix tokens copied per loop iteration by the kernels kvfence knows of (ours: 512; upstream's
#: token-block variant: 512; 128 is a common Triton tile): lengths around these are edges.
COPY_BLOCKS = (128, 512)
#: Lane widths of ``tl.arange`` reductions (prefix sums over requests, indptr sums over branches) that
#: a kernel might hard-code: request and branch counts just past these are edges.
LANE_WIDTHS = (16, 32, 64, 128)


#: Share of page-size draws that are page 1 (SGLang's default page size; bugs on its draft path, such as
#: a step-major draft-slot read, are reachable only there).
PAGE1_SHARE = 1 / 3
#: Share of GPU page-size draws that are the domain's largest page, on top of page 1's share.
LARGEST_PAGE_SHARE = 1 / 4
#: topk and draft-step values deployments configure most; half the draws of each come from these.
COMMON_TOPK = (1, 2, 4, 8)
COMMON_STEPS = (1, 2, 3, 4, 5)
COMMON_SHARE = 1 / 2

#: Share of GPU-domain examples that draw the §6 fields (``fuzz --family auto``, a kernel that takes
#: them). Every §6 bug of the shipped mutants shows at interpreter sizes (the CPU domain found each within
#: 40 examples in 20 seeds), but one fuzzing process checks only a few hundred examples a minute on the
#: GPU (each a config and up to a thousand cases), and Hypothesis leans toward "no §6 fields" and repeats
#: an example's config, so the share decides whether a small machine's default minute reaches a §6
#: trigger at all. Drawn as ``fuzz`` draws them, no kernel run (``benchmarks/prior_reach.py --seeds 10
#: --gpu-examples 300 --gpu-family-shares 0.125``, ``cpu_prior_reach.json``), one in eight reached the
#: triggers of the five §6 mutants that need a window, sinks or a translated page in 6-9 of 10 seeds
#: within 300 examples, one in four in 10 of 10; on the H200, eight plain runs sharing it (one job each),
#: one in eight missed those mutants in 1-2 of 6 seeds, one in four none in 20 (BENCHMARKS.md). Three in
#: four examples keep the production-sized §2 search. A fraction ``1/k``: one draw of ``k`` codes per example.
GPU_FAMILY_SHARE = 1 / 4
#: Device bytes a §6 config of a share example may take (``runner_buffers.config_bytes``). The host verdict
#: builds and compares the whole write set case by case (no batching, no device counters), so it is kept
#: to configs it checks in a fraction of a second (``kvfence.contracts.draft.compare`` bounds every config it
#: checks on both paths by it too, for the same reason). Requests of a few thousand
#: tokens, tens of requests or a hundred branches still fit: past a copy block, a lane width, a page.
HOST_VERDICT_MAX_BYTES = 16 << 20
#: Batches of one example whose config is §6's (``kvfence.contracts.draft.strategies.family_batches``): the device
#: verifier's 32 batches per example amortise one round trip and one capture; host-verified cases are
#: checked one by one, so more batches only make the example longer. Four keep a §6 example's cost near
#: a §2 example's (estimated, not measured on the H200: the run's summary counts ``host_verified_cases``).
FAMILY_MAX_BATCHES = 4


def capture_buckets(max_bs: int) -> Tuple[int, ...]:
    """SGLang's speculative capture list cut at ``max_bs``, which is always captured last."""
    return tuple([b for b in SPECULATIVE_CAPTURE_BS if b < max_bs] + [max_bs])


@dataclass(frozen=True)
class DraftSpace:
    """The draft's bounds on one domain (``name``: the ``kvfence.contract.Domain`` name). ``buckets`` names the
    capture-bucket rule (``power-of-two`` or ``capture-list``); ``family_share`` is the share of examples that draw
    the §6 fields under ``--family auto`` (each fitted to ``family_max_bytes`` when set); everything else is an
    inclusive upper bound or the set of page sizes."""

    name: str
    max_topk: int
    max_steps: int
    page_sizes: Tuple[int, ...]
    max_ctx: int
    max_bs: int
    buckets: str
    family_share: float = 1.0
    family_max_bytes: Optional[int] = None

    def __post_init__(self):
        require(self.buckets in ("power-of-two", "capture-list"),
                f"domain {self.name}: unknown bucket rule {self.buckets!r}")
        for field in ("max_topk", "max_steps", "max_ctx", "max_bs"):
            value = getattr(self, field)
            require(isinstance(value, int) and value >= 1, f"domain {self.name}: {field} must be >= 1, got {value!r}")
        require(self.max_ctx >= 2, f"domain {self.name}: max_ctx must be >= 2")
        share = self.family_share
        require(isinstance(share, (int, float)) and 0 < share <= 1 and (1 / share) == round(1 / share),
                f"domain {self.name}: family_share must be 1/k for an integer k >= 1, got {share!r}")
        require(self.family_max_bytes is None
                or (isinstance(self.family_max_bytes, int) and self.family_max_bytes >= 1),
                f"domain {self.name}: family_max_bytes must be a positive number of bytes, "
                f"got {self.family_max_bytes!r}")

    def buckets_for(self, max_bs: int) -> Tuple[int, ...]:
        return capture_buckets(max_bs) if self.buckets == "capture-list" else power_of_two_buckets(max_bs)

    def to_dict(self) -> dict:
        return {"name": self.name, "topk": [1, self.max_topk], "num_steps": [1, self.max_steps],
                "page_sizes": list(self.page_sizes), "ctx": [2, self.max_ctx], "max_bs": [1, self.max_bs],
                "buckets": self.buckets}

    def describe(self) -> str:
        return (f"{self.name}: topk 1-{self.max_topk}, steps 1-{self.max_steps}, pages "
                f"{'/'.join(map(str, self.page_sizes))}, ctx <= {self.max_ctx}, max_bs <= {self.max_bs} "
                f"({self.buckets} buckets)")


#: Interpreter-sized: a launch is ``num_steps*bucket*topk`` programs of ~2 ms each on the CPU.
CPU = DraftSpace("cpu", max_topk=8, max_steps=8, page_sizes=(1, 2, 4, 16, 64), max_ctx=48, max_bs=4,
             buckets="power-of-two")
#: Production-sized: what an H200 server captures.
GPU = DraftSpace("gpu", max_topk=16, max_steps=16, page_sizes=(1, 2, 4, 8, 16, 32, 64, 128), max_ctx=131072,
             max_bs=256, buckets="capture-list", family_share=GPU_FAMILY_SHARE,
             family_max_bytes=HOST_VERDICT_MAX_BYTES)
DOMAINS: Dict[str, DraftSpace] = {"cpu": CPU, "gpu": GPU}


def domain_named(name: str) -> DraftSpace:
    require(name in DOMAINS, f"unknown scale {name!r}: choose {', '.join(DOMAINS)}")
    return DOMAINS[name]


# -- boundary classes -----------------------------------------------------------------------------------
#: Every class ``boundary_classes`` can name, so a coverage table can list the ones never reached.
BOUNDARY_CLASSES: Tuple[str, ...] = (
    "len<=block128", "len=block128+-1", "len>block128", "len=block512+-1", "len>block512",
    "len=page-boundary+-1", "len=ctx-steps+-1", "len=ctx",
    "requests>16", "requests>32", "requests>64", "branches>64", "branches>128",
    "full-bucket", "padded-bucket", "page>=64-filled", "page=128", "ctx>=65536", "topk>8", "steps>8",
    "distinct-lengths",
)


#: Per copy block: the block, its "+-1" class and its "past" class (named once, not per length).
_BLOCK_CLASSES = tuple((block, f"len=block{block}+-1", f"len>block{block}") for block in COPY_BLOCKS)


def boundary_classes(config, seq_lens, raw_bs: int) -> FrozenSet[str]:
    """The boundary classes one launch sits on (``seq_lens`` are the real requests, before padding)."""
    out: Set[str] = set()
    bucket = next((b for b in config.buckets if b >= raw_bs), config.max_bs) if config.mode == "graph" else raw_bs
    for L in set(seq_lens):  # classes of a length, not counts: each distinct length once
        out |= _length_classes(config, L)
    for lanes in (16, 32, 64):
        if bucket > lanes:
            out.add(f"requests>{lanes}")
    for lanes in (64, 128):
        if bucket * config.topk > lanes:
            out.add(f"branches>{lanes}")
    if config.mode == "graph":
        out.add("full-bucket" if raw_bs == bucket else "padded-bucket")
    out |= _config_classes(config)
    if len(set(seq_lens)) >= 3:
        out.add("distinct-lengths")
    return frozenset(out)


def _length_classes(config: Any, L: int) -> Set[str]:
    """The boundary classes of one request length ``L`` under ``config``: copy blocks, pages, the context's end."""
    out = set()
    if L <= 128:
        out.add("len<=block128")
    for block, near, past in _BLOCK_CLASSES:
        if abs(L - block) <= 1:
            out.add(near)
        if L > block:
            out.add(past)
    p = config.page_size
    if p > 1 and (L % p in (0, 1, p - 1)) and L >= p - 1:
        out.add("len=page-boundary+-1")
    if p >= 64 and L >= p:
        out.add("page>=64-filled")
    if abs(L - (config.ctx - config.num_steps)) <= 1:
        out.add("len=ctx-steps+-1")
    if L == config.ctx:
        out.add("len=ctx")
    return out


def _config_classes(config: Any) -> Set[str]:
    """The boundary classes ``config`` alone decides: a full page, a long context, wide trees and deep steps."""
    flags = {"page=128": config.page_size == 128, "ctx>=65536": config.ctx >= 65536, "topk>8": config.topk > 8,
             "steps>8": config.num_steps > 8}
    return {name for name, on in flags.items() if on}
