"""The draft kernel's records: ``draft`` (docs/contract.md §2-§4, §6) and ``window-rail`` (§6, the window rail).

A case is a ``kvfence.contracts.draft.case.Case``: a config (what a CUDA-graph runner fixes once: topk, steps, page size,
context, buckets, sizing, layout, mode, the §6 fields) and a batch (lengths, pool rows, the slot table's seed).
The record ties the pieces that check it to the engine's questions (``kvfence.contract.Contract``):

* draws: ``kvfence.contracts.draft.strategies`` (``configs`` with the run's pins, then ``cases``, or ``case_runs``: several
  batches of one config per example, and the bulk), on the domain of ``kvfence.contracts.draft.domain``;
* checking: ``kvfence.contracts.draft.session.Session`` (the CUDA-graph runner of §4, guarded buffers, the verdict;
  on CUDA the device verifier and the torch write-set builder), in a checking worker through ``DraftCodec``;
* data: case files of ``kvfence.engine.casefile``; the coverage row ``ExampleStat``; ``boundary_classes``;
* repro: another kernel, sizing, mode or layout on one case, and the need/width arithmetic written out.

Its planted bugs live in ``kernels/draft/mutants/`` (``kvfence.selftest.mutants``), its shipped sizing in
``kvfence.release.shipped``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Dict, List, NamedTuple, Optional, Sequence

from kvfence.contract import VERBOSE_PROGRAMS, Contract
from kvfence.errors import require
from kvfence.kernels import KERNELS_DIR

#: The config flags (``RunPlan.pins``) the draft kernel and the rail take.
PINS = ("topk", "num_steps", "page_size", "ctx", "max_bs", "window", "sink", "entry_page_size", "translate",
        "family", "layout", "seq_len_limit")
#: Config cells a ``--shard`` deals out (``kvfence.engine.campaign``): the fields that change the kernel's
#: specialization most.
SHARD_FIELDS = ("topk", "num_steps", "page_size")
#: Flags that change what a drawn choice sequence means: part of the example database's key.
DOMAIN_FLAGS = ("mode", "layout", "seq_len_limit", "topk", "num_steps", "page_size", "ctx", "max_bs", "shard")


class ExampleStat(NamedTuple):
    """What one explored case was: the coverage plot's point (reports/render.py)."""

    topk: int
    num_steps: int
    page_size: int
    num_seqs: int  # launched rows (the bucket, in graph mode)
    raw_bs: int
    need: int
    width: int
    failed: bool


def example_stat(case, failed: bool) -> ExampleStat:
    summary = case._sizing  # the case's own cached sizing (sizing_summary() is a copy of it, per case)
    c = case.config
    return ExampleStat(c.topk, c.num_steps, c.page_size, summary["num_seqs"], case.batch.raw_bs, summary["need"],
                       summary["width"], failed)


# -- the checking worker's wire --------------------------------------------------------------------------------
#: Elements that add one more ``case_timeout`` to a case's limit, and a program's fixed cost in elements
#: (``kvfence.engine.worker``: 256 programs per ``case_timeout``; the interpreter runs one in about 2 ms).
PROGRAM_ELEMENTS = 1 << 12


def case_elements(case) -> int:
    """Roughly how much work one check of ``case`` is, in elements: buffers, the pool, the write set,
    and ``PROGRAM_ELEMENTS`` per Triton program (the interpreter's fixed cost per program)."""
    c = case.config
    s = case.sizing_summary()
    programs = c.num_steps * s["num_seqs"] * c.topk
    return c.num_steps * (s["width"] + s["need"]) + c.pool_rows * c.pool_len + PROGRAM_ELEMENTS * programs


def encode_cases(cases: Sequence, config_dicts: Dict[object, dict]) -> dict:
    """The wire form of a case list: each distinct (config, kernel, canary seed) once under ``groups``,
    then per case ``[group, seq_lens, req_pool_indices, token_seed, v2p_seed]``. Plain JSON data, the fields of
    ``kvfence.engine.casefile.case_to_dict``; ``config_dicts`` caches ``Config.to_dict`` across calls."""
    groups: Dict[tuple, int] = {}
    rows = []
    for case in cases:
        key = (case.config, case.kernel, case.canary_seed)
        g = groups.get(key)
        if g is None:
            g = groups[key] = len(groups)
        b = case.batch
        rows.append([g, b.seq_lens, b.req_pool_indices, b.token_seed, b.v2p_seed])
    wire_groups = []
    for config, kernel, canary_seed in groups:
        d = config_dicts.get(config)
        if d is None:
            if len(config_dicts) > 256:
                config_dicts.clear()
            d = config_dicts[config] = config.to_dict()
        wire_groups.append({"config": d, "kernel": kernel, "canary_seed": canary_seed})
    return {"groups": wire_groups, "cases": rows}


class Decoder:
    """Worker side of ``encode_cases``: every case is validated like a case file's (``case_from_dict``); a
    group's config is built once and reused while the batches vary."""

    def __init__(self, case_from_dict):
        self._case_from_dict = case_from_dict
        self._templates: Dict[str, object] = {}

    def cases(self, message: dict):
        from kvfence.contracts.draft.case import Batch, Case

        templates = []
        for group in message["groups"]:
            key = json.dumps(group, sort_keys=True)
            template = self._templates.get(key)
            if template is None:
                if len(self._templates) > 256:
                    self._templates.clear()
                template = self._templates[key] = self._case_from_dict(
                    dict(group, batch={"seq_lens": [1], "req_pool_indices": [0]}))
            templates.append(template)
        for g, seq_lens, rows, token_seed, v2p_seed in message["cases"]:
            t = templates[g]
            yield Case(t.config, Batch(tuple(seq_lens), tuple(rows), token_seed, v2p_seed), t.kernel, t.canary_seed)


class DraftCodec:
    """The draft contract's cases on the checking worker's wire (``encode_cases``); a run the worker may check
    as one batch is one config and canary seed (``group``); ``elements`` sizes a case's time limit."""

    kinds = ()

    def __init__(self) -> None:
        self._config_dicts: Dict[object, dict] = {}

    def encode(self, cases) -> dict:
        return encode_cases(cases, self._config_dicts)

    @staticmethod
    def group(case):
        return case.config, case.canary_seed

    @staticmethod
    def elements(case) -> int:
        return case_elements(case)


# -- the record ------------------------------------------------------------------------------------------------
class DraftContract(Contract):
    """The draft kernel (``contract="draft"``) or the window rail (``"window-rail"``): one record class, the
    config's ``contract`` field picks the oracle and the kernel's launch."""

    pins = PINS
    coverage_fields = ExampleStat._fields
    case_map = "kvfence.contracts.draft.buffer_map:case_map_with_legend"
    planted_from_patches = False

    def __init__(self, name: str, section: str, kernel_file: str, attr: str):
        from kvfence.contracts.draft.sizing import POLICIES

        self.name, self.section = name, section
        self.reference_kernel, self.reference_attr = KERNELS_DIR / "draft" / kernel_file, attr
        self.sizings = dict(POLICIES)

    def sizing_applies(self, name: str) -> bool:
        """The rail is sized per window (``window-*`` policies, docs/contract.md §6); the draft kernel's rows by
        the other builtin policies."""
        from kvfence.contracts.draft.sizing import WINDOW_POLICIES

        return name in self.sizings and (name in WINDOW_POLICIES) == (self.name == "window-rail")

    def check_kernel(self, spec: str) -> None:
        """A classic-ABI ``@triton.jit`` function or a launcher (``kvfence.contracts.draft.targets.check_kernel_spec``)."""
        from kvfence.contracts.draft.targets import check_kernel_spec

        check_kernel_spec(spec)

    def sizing(self, spec: str):
        """A builtin policy, a release's shipped sizing (``sglang==V:BACKEND``) or a plug-in (``file.py:attr``,
        run in a child process)."""
        from kvfence.contracts.draft.targets import resolve_sizing

        return resolve_sizing(spec)

    # -- drawing ----------------------------------------------------------------------------------------
    def _capabilities(self, plan):
        from kvfence.contracts.draft.targets import kernel_capabilities

        return kernel_capabilities(plan.kernel)

    def family_draws(self, plan):
        """``kvfence.contracts.draft.strategies.configs(family=...)``: False when the kernel does not take the §6 fields or
        ``family`` is pinned off, True when pinned on (every example), ``"auto"`` otherwise (the domain's
        share of examples: every example on the CPU domain, one in four on the GPU domain)."""
        family = plan.pin("family", "auto")
        if family == "off" or not self._capabilities(plan).family:
            return False
        return True if family == "on" else "auto"

    def family_share(self, plan) -> float:
        from kvfence.contracts.draft.domain import domain_named

        family = self.family_draws(plan)
        return domain_named(plan.domain).family_share if family == "auto" else float(family)

    def _family_pins(self, plan) -> dict:
        translate = plan.pin("translate")
        return dict(window_size=plan.pin("window"), sink_size=plan.pin("sink"),
                    entry_page_size=plan.pin("entry_page_size"),
                    translate=None if translate is None else translate in (True, "on"))

    def check_plan(self, plan) -> None:
        """The pins against the kernel (one line, exit 2): the rail needs its window, a kernel must declare
        every §6 parameter a pin sets, ``--family on`` needs a kernel that takes them; the sizing on the
        smallest config the pins allow (a bool, non-int or huge width is refused now, not mid-run)."""
        from kvfence.contracts.draft.case import Config
        from kvfence.contracts.draft.sizing import WINDOW_POLICIES

        super().check_plan(plan)
        family = self._family_pins(plan)
        require(not (self.name == "window-rail" and not family["window_size"]),
                "--contract window-rail needs --window W (W >= 1): the rail's window is part of its ABI")
        caps = self._capabilities(plan)
        probe = Config(topk=1, num_steps=1, window_size=family["window_size"] or 0, sink_size=family["sink_size"] or 0,
                       entry_page_size=family["entry_page_size"] or 1, translate=bool(family["translate"]),
                       contract=self.name)
        caps.check_config(plan.kernel, probe)
        require(plan.pin("family", "auto") != "on" or caps.family,
                f"--family on: kernel {plan.kernel!r} does not take the §6 parameters (a classic-ABI kernel)")
        window = plan.pin("window")
        Config(topk=plan.pin("topk", 1), num_steps=plan.pin("num_steps", 1), page_size=plan.pin("page_size", 1),
               ctx=plan.pin("ctx", plan.pin("num_steps", 1) + 1), max_bs=plan.pin("max_bs", 1), sizing=plan.sizing,
               layout=plan.pin("layout", "redzone"), mode=plan.mode,
               window_size=window if window is not None else int(plan.sizing in WINDOW_POLICIES),
               sink_size=plan.pin("sink", 0), contract=self.name).row_width(1)

    def configs(self, plan):
        """The config strategy of ``plan`` (``kvfence.contracts.draft.strategies.configs`` with the plan's pins)."""
        from kvfence.contracts.draft.domain import domain_named
        from kvfence.contracts.draft.strategies import configs

        pin = plan.pin
        return configs(topk=pin("topk"), num_steps=pin("num_steps"), page_size=pin("page_size"), ctx=pin("ctx"),
                       max_bs=pin("max_bs"), sizing=plan.sizing, layout=plan.pin("layout", "redzone"), mode=plan.mode,
                       domain=domain_named(plan.domain), max_bytes=plan.max_bytes, family=self.family_draws(plan),
                       contract=self.name, **self._family_pins(plan))

    def draws(self, plan):
        from kvfence.contracts.draft.strategies import case_runs, cases

        config_strategy = self.configs(plan)
        seq_len_limit = plan.pin("seq_len_limit", "ctx")
        if plan.batches_per_example > 1 or plan.bulk_per_example:
            strategy = case_runs(config_strategy, kernel=plan.kernel, seq_len_limit=seq_len_limit,
                                 max_batches=plan.batches_per_example, bulk=plan.bulk_per_example,
                                 bulk_after=plan.bulk_after)
        else:
            strategy = cases(config_strategy, kernel=plan.kernel, seq_len_limit=seq_len_limit)
        strategy.validate()
        return strategy

    def shard_fields(self, plan) -> Dict[str, tuple]:
        """The values each of ``SHARD_FIELDS`` ranges over on the plan's domain, simplest first (a pinned
        field: its one value)."""
        from kvfence.contracts.draft.domain import domain_named

        domain = domain_named(plan.domain)
        values = {"topk": tuple(range(1, domain.max_topk + 1)), "num_steps": tuple(range(1, domain.max_steps + 1)),
                  "page_size": tuple(domain.page_sizes)}
        return {name: (plan.pin(name),) if plan.pin(name) is not None else values[name] for name in SHARD_FIELDS}

    def database_domain(self, plan, shard) -> dict:
        """The domain part of the example database's key: ``DOMAIN_FLAGS``, the resolved domain, batches per
        example and, when on, bulk batches per example (the keys of runs from before each of these existed are
        kept). Not the memory budget: its default follows free GPU memory."""
        from kvfence.contracts.draft.domain import domain_named

        values = dict(plan.pins, mode=plan.mode, layout=plan.pin("layout", "redzone"),
                      seq_len_limit=plan.pin("seq_len_limit", "ctx"))
        out = {flag: values.get(flag) for flag in DOMAIN_FLAGS}
        out["shard"] = str(shard) if shard is not None else None
        out["domain"] = domain_named(plan.domain).to_dict()
        out["batches_per_example"] = plan.batches_per_example
        if plan.bulk_per_example:
            out["bulk_per_example"] = plan.bulk_per_example
        return out

    def run_record(self, plan) -> dict:
        """What the run summary says of this contract's choices (docs/contract.md §6: the §6 fields pinned or
        drawn, and the share of examples that draw them)."""
        from kvfence.contracts.draft.domain import domain_named

        return {"mode": plan.mode, "layout": plan.pin("layout", "redzone"),
                "seq_len_limit": plan.pin("seq_len_limit", "ctx"), "domain_text": domain_named(plan.domain).describe(),
                "family_drawn": self.family_share(plan) > 0, "family_share": self.family_share(plan),
                "family_pins": {k: v for k, v in self._family_pins(plan).items() if v is not None}}

    # -- checking ---------------------------------------------------------------------------------------
    def session(self, plan, **options):
        from kvfence.contracts.draft.session import Session

        return Session(plan.device, plan.kernel, **dict(dict(audit=plan.audit, max_bytes=plan.max_bytes), **options))

    def codec(self, plan):
        return DraftCodec()

    def worker_options(self, plan) -> dict:
        return {"poison": True, "verifier": "auto", "audit": plan.audit, "absorb": True, "max_bytes": plan.max_bytes}

    def worker_side(self, options: dict, device: str):
        from kvfence.engine.casefile import case_from_dict
        from kvfence.contracts.draft.session import Session

        session = Session(device, options["kernel"], poison=options.get("poison", True),
                          verifier=options.get("verifier", "auto"), audit=options.get("audit"),
                          absorb=options.get("absorb", True), max_bytes=options.get("max_bytes"))
        return session, Decoder(case_from_dict).cases, DraftCodec.group

    # -- cases as data ----------------------------------------------------------------------------------
    def case_record(self, case) -> dict:
        from kvfence.engine.casefile import case_to_dict

        return case_to_dict(case)

    def case_from_record(self, data):
        from kvfence.engine.casefile import case_from_dict

        case = case_from_dict(data)
        require(case.config.contract == self.name,
                f"case: its config is of contract {case.config.contract}, not {self.name}")
        return case

    def case_sizing(self, case) -> str:
        return case.config.sizing

    def summary(self, case) -> dict:
        return dict(case.sizing_summary(), config=case.config.to_dict(), batch=case.batch.to_dict())

    def describe(self, case, full: bool = False) -> str:
        c, b = case.config, case.batch
        if not full:
            return (f"topk={c.topk} num_steps={c.num_steps} page_size={c.page_size} ctx={c.ctx} max_bs={c.max_bs} "
                    f"({len(b.seq_lens)} request(s))")
        return (f"topk={c.topk} num_steps={c.num_steps} page_size={c.page_size} ctx={c.ctx} max_bs={c.max_bs} "
                f"sizing={c.sizing} layout={c.layout} mode={c.mode}; seq_lens={list(b.seq_lens)} "
                f"req_pool_indices={list(b.req_pool_indices)} token_seed={b.token_seed}")

    # -- bookkeeping ------------------------------------------------------------------------------------
    def config_of(self, case):
        return case.config

    def config_record(self, config) -> dict:
        return config.to_dict()

    def config_bytes(self, config) -> int:
        from kvfence.contracts.draft.budget import estimate_bytes

        return estimate_bytes(config)

    def structure_of(self, case):
        """The lengths (and so positions, which follow from them): the kernel makes the same stores at the
        same addresses for two cases of one structure, whatever pool rows and token table they read."""
        return case.batch.seq_lens

    def read_variant_of(self, case):
        """The pool rows: which row of ``req_to_token`` each request reads (not where anything is written)."""
        return case.batch.req_pool_indices

    def utilisation(self, case) -> float:
        sizing = case._sizing  # computed once per case (sizing_summary() would copy it)
        return sizing["need"] / sizing["width"]

    def coverage_row(self, case, failed: bool) -> tuple:
        return example_stat(case, failed)

    def boundaries(self, case):
        from kvfence.contracts.draft.domain import boundary_classes

        return boundary_classes(case.config, case.batch.seq_lens, case.batch.raw_bs)

    # -- repro ------------------------------------------------------------------------------------------
    program_axes = "s,b,k"
    #: Rows contiguous (production's layout) and no tail guard: an overflow past the last row leaves the
    #: allocation, where memcheck sees it (``kvfence.sanitizer.tool``).
    sanitizer_flags = ("--layout", "production", "--no-absorb")

    def case_mode(self, case) -> str:
        return case.config.mode

    def kernel_name(self, spec: str):
        """The reference kernels' name (``reference-blocked`` is the same function); None for a plug-in."""
        return self.reference_attr if spec in ("reference", "reference-blocked") else None

    def repro_header(self, case) -> List[str]:
        c, b = case.config, case.batch
        lb = case.launch()
        return [f"config  topk={c.topk} num_steps={c.num_steps} page_size={c.page_size} ctx={c.ctx} max_bs={c.max_bs} "
                f"buckets={list(c.buckets)} mode={c.mode} layout={c.layout} canary_seed={case.canary_seed}",
                f"batch   seq_lens={list(b.seq_lens)} req_pool_indices={list(b.req_pool_indices)} "
                f"token_seed={b.token_seed} (launched as {lb.num_seqs} row{'s' * (lb.num_seqs != 1)}"
                f"{', padded' if lb.num_seqs > b.raw_bs else ''})"]

    def setting_changes(self, original, case):
        return [(name, getattr(case.config, name), getattr(original.config, name)) for name in ("mode", "layout")
                if getattr(case.config, name) != getattr(original.config, name)]

    def replay_detail(self, case, device: str, *, absorb: bool = True):
        """The case re-run in this process with its observation kept (``Session.observe``, then the verdict),
        so that each finding can show its elements and each expected owner its segment."""
        from kvfence.contracts.draft.session import Session
        from kvfence.contracts.draft.verdict import check, expected_from_oracle

        obs = Session(device, case.kernel, absorb=absorb).observe(case)
        expected_writes = expected_from_oracle(obs)
        findings = check(obs, expected_writes)

        def show(finding, verbose: bool) -> dict:
            if not verbose:
                return {}
            return {"elements": _element_rows(obs, expected_writes, finding, VERBOSE_ELEMENTS),
                    "segments": _segment_rows(expected_writes, finding)}

        return findings, show

    def override(self, case, *, kernel: Optional[str] = None, sizing: Optional[str] = None,
                 mode: Optional[str] = None, layout: Optional[str] = None):
        from kvfence.contracts.draft.case import Case
        from kvfence.contracts.draft.targets import resolve_sizing

        config = case.config
        if sizing is not None:
            resolve_sizing(sizing)
            config = dataclasses.replace(config, sizing=sizing)
        if mode is not None:
            config = dataclasses.replace(config, mode=mode)
        if layout is not None:
            config = dataclasses.replace(config, layout=layout)
        return Case(config, case.batch, kernel if kernel is not None else case.kernel, case.canary_seed)

    def explain(self, case) -> List[str]:
        """need vs width, with the arithmetic written out (``Case.sizing_summary`` plus the policy)."""
        from kvfence.contracts.draft.targets import resolve_sizing

        c = case.config
        s = case.sizing_summary()
        lens = case.launch().seq_lens
        policy = resolve_sizing(c.sizing)
        doc = (policy.__doc__ or "").strip().split("\n")[0]
        formula = doc.split(":")[0].strip("` ") if doc.startswith("``W") else ""
        n = c.sizing_n(s["num_seqs"])
        verdict = (f"need > width by {s['need'] - s['width']}: the buffer is too small" if s["need"] > s["width"]
                   else f"fits ({s['width'] - s['need']} spare)")
        lens_text = "+".join(map(str, lens)) if len(lens) <= 8 else f"sum of {len(lens)} lengths"
        return [
            f"need   = topk*sum(L) + num_seqs*topk*num_steps = {c.topk}*({lens_text}) + {s['num_seqs']}*{c.topk}*"
            f"{c.num_steps} = {s['need']}",
            f"width  = {c.sizing}(n={n}, topk={c.topk}, ctx={c.ctx}, num_steps={c.num_steps}) = {s['width']}"
            + (f"   [{formula}; n = {'max_bs' if c.mode == 'graph' else 'num_seqs'}]" if formula else ""),
            f"=> {verdict}",
        ]


# -- repro's element diff -----------------------------------------------------------------------------------
#: Elements shown per finding with ``--verbose`` (the finding itself keeps 3 samples).
VERBOSE_ELEMENTS = 64
_ROW = re.compile(r"^(?:slack of )?row (\d+)$")
_GUARD = re.compile(r"^guard after row (\d+)$")


def _flat_of(buf, region: str, offset: int) -> Optional[int]:
    """Inverse of ``GuardedBuffer.region_of`` for a finding's first region."""
    first = region.split(" .. ")[0]
    if first == "front guard":
        return offset
    if first == "tail":
        return buf.front + buf.rows * buf.stride + offset
    m = _ROW.match(first)
    if m:
        return buf.flat_index(int(m.group(1)), offset)
    m = _GUARD.match(first)
    if m:
        return buf.flat_index(int(m.group(1)), buf.width + offset)
    return None


def _element_rows(obs, expected_writes, finding, limit: int) -> List[str]:
    # By role: the window rail's buffers are named window_kv_indices / window_kv_indptr.
    role = {obs.kv_indices.name: "kv_indices", obs.kv_indptr.name: "kv_indptr"}.get(finding.buffer)
    buf = {"kv_indices": obs.kv_indices, "kv_indptr": obs.kv_indptr}.get(role)
    if buf is None or finding.count == 0:
        return []
    lo = _flat_of(buf, finding.region, finding.start)
    if lo is None:
        return []
    pos, val = ((expected_writes.indices_pos, expected_writes.indices_val) if role == "kv_indices"
                else (expected_writes.indptr_pos, expected_writes.indptr_val))
    before, after = obs.before[role], obs.after[role]
    expected = before.clone()
    expected[pos] = val
    hi = min(lo + finding.count, lo + limit, buf.length)
    rows = [f"      {'offset':>8} {'expected':>12} {'found':>12}"]
    for flat in range(lo, hi):
        e, f = int(expected[flat]), int(after[flat])
        rows.append(f"      {finding.start + flat - lo:>8} {e:>12} {f:>12}{'' if e == f else '   <-'}")
    if finding.count > hi - lo:
        rows.append(f"      ... {finding.count - (hi - lo)} more elements")
    return rows


def _segment_rows(expected_writes, finding) -> List[str]:
    """Where each expected owner of ``finding`` should write (its segment of the step row)."""
    wanted = set(map(tuple, finding.programs[:VERBOSE_PROGRAMS]))
    return [f"      ({s},{b},{k}) should write row {s} [{start}, {stop})"
            for s, b, k, start, stop in expected_writes.segments if (s, b, k) in wanted]


DRAFT = DraftContract("draft", "docs/contract.md §2-§4", "draft_kv_indices.py", "generate_draft_decode_kv_indices")
WINDOW_RAIL = DraftContract("window-rail", "docs/contract.md §6", "window_kv_indices.py",
                            "generate_draft_decode_window_kv_indices")
