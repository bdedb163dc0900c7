"""The fuzz run summary: built once from a ``FuzzResult`` and written as ``summary.json``.

``summary.json`` (and ``--json PATH``, same content) is what ``python -m kvfence report DIR`` re-renders
from, so it carries everything the report shows: the run, each finding with ``kind``, ``region`` and
``case`` (the path of its case file), a short record of each case file, and the coverage stats.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Tuple

from kvfence.contract import Launch
from kvfence.engine import launch as launches
from kvfence.engine import registry
from kvfence.engine.casefile import case_repro_command
from kvfence.engine.findings import Finding
from kvfence.errors import require

if TYPE_CHECKING:  # annotations only
    from kvfence.engine.result import FuzzResult

SUMMARY_VERSION = 1
MARKER = "kvfence_summary"
#: Columns of ``coverage.examples`` rows of a summary that does not say (one written before contracts were
#: plug-ins: the draft kernel's); a summary names its own (``kvfence.engine.launch.coverage_fields``).
COVERAGE_FIELDS = ("topk", "num_steps", "page_size", "num_seqs", "raw_bs", "need", "width", "failed")
#: The columns of a run that explored no example (so no contract named its panel).
NO_COVERAGE = ("panel",) + launches.COVERAGE


def coverage_fields(doc: dict[str, Any]) -> tuple[Any, ...]:
    """The columns of a summary's coverage rows (its own ``coverage.fields``, else the draft kernel's)."""
    fields = (doc.get("coverage") or {}).get("fields")
    return tuple(fields) if isinstance(fields, list) and fields else COVERAGE_FIELDS


def case_record(path: str, case: Launch[Any], findings: List[Finding], *, source: str) -> dict[str, Any]:
    """What the summary keeps about one case file (enough to plot, describe and map it without the file):
    the launch's summary (need, width, requests, config, its record as data), one line describing it and its
    coverage row."""
    record = registry.get(case.contract)
    return {"path": path, "source": source, "contract": record.name, "kernel": case.kernel,
            "sizing": case.sizing, **launches.summary(record, case),
            "describe": launches.describe(record, case, full=True),
            "coverage": list(launches.coverage_row(record, case, True)),
            "kinds": sorted({f.kind.value for f in findings}),
            "repro": case_repro_command(path, case)}


def max_example(result: FuzzResult, fields: tuple[Any, ...]) -> Optional[dict[str, Any]]:
    """The explored case with the highest need/width (the one "max need/width" comes from), as a dict of the
    contract's coverage ``fields`` (``FuzzResult.max_utilisation_stat``), or ``None`` before any case."""
    stat = getattr(result, "max_utilisation_stat", None)
    return dict(zip(fields, stat)) if stat is not None else None


#: What ended a fuzz run (``ended_by``): a signal, the time budget, a failure (then shrunk), another
#: ``--jobs`` job's failure (this job stopped exploring), the example budget. A merge of jobs reports
#: the first of these that any job ended by.
ENDINGS = ("signal", "time", "failure", "job_failure", "examples")


def ended_by(*, interrupted: Optional[str], time_cut: bool, failed: bool, keep_going: bool = False,
             job_failure_cut: bool = False) -> str:
    """Which of ``ENDINGS`` ended the run (``--keep-going`` goes on past failures: a budget ends it)."""
    if interrupted:
        return "signal"
    if time_cut:
        return "time"
    if job_failure_cut and not failed:
        return "job_failure"
    return "failure" if failed and not keep_going else "examples"


def build(result: FuzzResult, *, run: dict[str, Any], case_path: Optional[str], crashes: Iterable[Any] = (),
          versions: Optional[dict[str, Any]] = None, earlier: Optional[dict[str, Any]] = None,
          started_at: Optional[float] = None) -> dict[str, Any]:
    """The summary of one fuzz run. ``run`` holds the command's settings (device, kernel, sizing, ...);
    ``crashes`` are ``kvfence.engine.journal.Crash`` records recovered at the start of the run; ``earlier`` is
    where an earlier run's case files were moved (``kvfence.engine.outdir``), if any. ``started_at``
    (epoch seconds, the command's start) dates ``first_failure_s``; without it, it counts from the loop's start."""
    first_at = result.first_failure_at
    findings: List[dict[str, Any]] = []
    cases: Dict[str, dict[str, Any]] = {}
    for crash in crashes:
        p = str(crash.path)
        findings.append(dict(crash.finding.to_dict(), case=p))
        cases[p] = case_record(p, crash.case, [crash.finding], source="journal")
    if result.findings and case_path is not None:
        findings += [dict(f.to_dict(), case=case_path) for f in result.findings]
        cases[case_path] = case_record(case_path, result.case, result.findings, source="fuzz")
    stats = [list(s) for s in result.stats]
    session = result.session_stats or {}
    fields = tuple(result.coverage_fields or NO_COVERAGE)
    return {
        MARKER: SUMMARY_VERSION,
        "examples": result.examples,
        **{key: getattr(result, key) for key in COUNTS[1:]},
        "elapsed_s": round(result.elapsed_s, 3),
        "cases_per_s": round(result.cases_per_s, 3),
        "structural_cases_per_s": round(result.structural_cases_per_s, 3),
        "examples_per_s": round(result.examples_per_s, 3),
        "distinct_configs": result.distinct_configs,
        "distinct_configs_per_s": round(result.distinct_configs_per_s, 3),
        # The digests behind structural_cases, read_variant_cases and distinct_configs: a merge counts what
        # is distinct across jobs from them (sorted, so a summary is the same for the same run).
        "structure_keys": sorted(result.structure_keys),
        "read_keys": sorted(result.read_keys),
        "config_keys": sorted(result.config_keys),
        **{key: (round(session.get(key, 0), 3) if key.endswith("_s") else session.get(key, 0)) for key in SESSION_KEYS},
        **run,
        "largest_config": result.largest_config,
        "boundaries": dict(sorted(result.boundaries.items())),
        "max_need_over_width": round(result.max_utilisation, 4),
        "max_need_over_width_example": max_example(result, fields),
        "earlier_cases": earlier,
        "time_cut": result.time_cut,
        "ended_by": ended_by(interrupted=run.get("interrupted"), time_cut=result.time_cut,
                             failed=bool(result.findings), keep_going=result.keep_going is not None,
                             job_failure_cut=result.job_failure_cut),
        "first_failure_s": (round(first_at - started_at, 3) if first_at is not None and started_at is not None
                            else round(result.first_failure_s, 3) if result.first_failure_s is not None else None),
        "examples_to_failure": result.examples_to_failure,
        "first_failure_at": result.first_failure_at,
        "first_examples": result.first_examples,
        "shrink_cut": result.shrink_cut,
        "bulk_splice": result.bulk_splice,
        "findings": findings,
        "cases": cases,
        "coverage": {"fields": list(fields), "examples": stats,
                     "sampled": len(stats) < result.examples,
                     "failure": list(result.failure_stat) if result.failure_stat is not None else None},
        "versions": versions or {},
    }


#: The run's counts, in the order every output shows them (kvfence.engine.loop.FuzzResult defines each).
COUNTS = ("examples", "generated_cases", "verified_cases", "cached_cases", "shrink_cases", "launches",
          "structural_cases", "read_variant_cases", "token_variant_cases", "bulk_cases", "bulk_skipped")
#: Counts distinct across the jobs of a merge -> the digests each summary lists for them
#: (``read_variant_cases`` is the read keys less the structures: kvfence.engine.loop.FuzzResult).
DISTINCT = {"structural_cases": "structure_keys", "distinct_configs": "config_keys"}
#: Session counters copied into the summary (kvfence.contracts.draft.session.Session.stats).
SESSION_KEYS = ("compiles", "captures", "compile_s", "capture_s", "runner_s",
                # §6 cases verified on the host because the device verifier checks §2 only
                # (kvfence.contracts.draft.session)
                "host_verified_cases")


def merge(docs: List[dict[str, Any]], *, run: dict[str, Any], elapsed_s: float,
          started_at: Optional[float] = None) -> dict[str, Any]:
    """One summary from several (``--jobs`` workers, or runs of several hosts): counts and session
    counters add up, coverage rows are pooled (reservoir-capped like one run's), findings and case
    files are kept once per case file, and the rate is recomputed over ``elapsed_s`` of wall time
    (``started_at``, epoch seconds, dates the first failure from the merged run's start)."""
    import random

    out: Dict[str, Any] = {MARKER: SUMMARY_VERSION}
    for key in COUNTS + ("distinct_configs",) + SESSION_KEYS:
        out[key] = sum(d.get(key, 0) or 0 for d in docs)
        if key.endswith("_s"):
            out[key] = round(out[key], 3)
    for key, keys in DISTINCT.items():
        # Distinct across all jobs: the union of their digests (two jobs meeting one structure or config
        # count it once). A summary without digests (an older one) can only be added.
        if all(isinstance(d.get(keys), list) for d in docs):
            union = sorted(set().union(*(d[keys] for d in docs)))
            out[key], out[keys] = len(union), union
    if all(isinstance(d.get("read_keys"), list) for d in docs) and all(isinstance(d.get("structure_keys"), list)
                                                                       for d in docs):
        out["read_keys"] = sorted(set().union(*(d["read_keys"] for d in docs)))
        out["read_variant_cases"] = len(out["read_keys"]) - out["structural_cases"]
    out["elapsed_s"] = round(elapsed_s, 3)
    for key, count in (("cases_per_s", "verified_cases"), ("structural_cases_per_s", "structural_cases"),
                       ("examples_per_s", "examples"), ("distinct_configs_per_s", "distinct_configs")):
        out[key] = round(out[count] / elapsed_s, 3) if elapsed_s > 0 else 0.0
    out.update(run)
    sized = [d["largest_config"] for d in docs if d.get("largest_config")]
    out["largest_config"] = max(sized, key=lambda c: c.get("estimated_bytes", 0)) if sized else None
    boundaries: Dict[str, int] = {}
    for d in docs:
        for name, count in (d.get("boundaries") or {}).items():
            boundaries[name] = boundaries.get(name, 0) + count
    out["boundaries"] = dict(sorted(boundaries.items()))
    best = max(docs, key=lambda d: d.get("max_need_over_width", 0), default={})
    out["max_need_over_width"] = best.get("max_need_over_width", 0.0)
    out["max_need_over_width_example"] = best.get("max_need_over_width_example")
    out["time_cut"] = any(d.get("time_cut") for d in docs)
    # The first job whose worker was ready, and whose first cases went out (seconds from the command's start).
    for key in ("startup_s", "first_launch_s"):
        out[key] = min((d[key] for d in docs if d.get(key) is not None), default=None)
    endings = {d.get("ended_by") for d in docs}
    out["ended_by"] = next((e for e in ENDINGS if e in endings), None)
    # The earliest failure of any job, in seconds from the merged run's start (job start-up included).
    firsts = [d["first_failure_at"] for d in docs if d.get("first_failure_at") is not None]
    out["first_failure_at"] = min(firsts) if firsts else None
    out["first_failure_s"] = (round(min(firsts) - started_at, 3) if firsts and started_at is not None
                              else min((d["first_failure_s"] for d in docs if d.get("first_failure_s") is not None),
                                       default=None))
    out["shrink_cut"] = any(d.get("shrink_cut") for d in docs)
    # How a bulk first failure was shrunk: the first job's word that is not "replayed" (an unshrunk one is news).
    splices = [d["bulk_splice"] for d in docs if d.get("bulk_splice")]
    out["bulk_splice"] = next((t for t in splices if t != "replayed"), splices[0] if splices else None)
    findings, cases, seen = [], {}, set()
    for d in docs:
        for f in d.get("findings", []):
            identity = (f.get("case"), f.get("kind"), f.get("region"), f.get("start"), f.get("stop"))
            if identity not in seen:
                seen.add(identity)
                findings.append(f)
        cases.update(d.get("cases", {}))
    out["findings"], out["cases"] = findings, cases
    # One plot: the coverage rows of the runs whose contract has the first run's columns (a merge of runs of
    # contracts with other coverage fields keeps their findings and case files, and says whose rows it drew).
    fields = next((coverage_fields(d) for d in docs if d.get("coverage")), COVERAGE_FIELDS)
    plotted = [d for d in docs if coverage_fields(d) == fields]
    rows = [row for d in plotted for row in d.get("coverage", {}).get("examples", [])]
    sampled = any(d.get("coverage", {}).get("sampled") for d in plotted)
    if len(rows) > MAX_COVERAGE_ROWS:
        rows, sampled = random.Random(0).sample(rows, MAX_COVERAGE_ROWS), True
    failures = [d["coverage"]["failure"] for d in plotted if d.get("coverage", {}).get("failure")]
    out["coverage"] = {"fields": list(fields), "examples": rows, "sampled": sampled,
                       "failure": failures[0] if failures else None}
    if len(plotted) < len(docs):
        out["coverage"]["left_out_runs"] = len(docs) - len(plotted)
    out["versions"] = next((d.get("versions") for d in docs if d.get("versions")), {})
    return out


#: Coverage rows a merged summary keeps (each run keeps at most kvfence.engine.loop.MAX_STATS).
MAX_COVERAGE_ROWS = 20000


#: A field's check: whether a parsed JSON value has the type (and range) the field needs.
Check = Callable[[Any], bool]


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _count(v: Any) -> bool:
    return _int(v) and v >= 0


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _text(v: Any) -> bool:
    return isinstance(v, str)


def _optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


def _flag(v: Any) -> bool:
    return v is None or isinstance(v, bool)


def _list_of(check: Check) -> Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _dict_of(check: Check) -> Check:
    return lambda v: isinstance(v, dict) and all(isinstance(k, str) and check(x) for k, x in v.items())


#: Config fields a report shows, with their types (kvfence.contracts.draft.case.Config.to_dict).
_CONFIG_FIELDS = {"topk": _count, "num_steps": _count, "page_size": _count, "ctx": _count, "max_bs": _count,
                  "sizing": _text, "mode": _text, "layout": _text}
_SIZED_FIELDS = {"topk": _count, "num_steps": _count, "page_size": _count, "ctx": _count, "max_bs": _count}
#: ``coverage.examples`` row columns: counts (a width may be 0: a launch with no room), except failed and the panel
#: (the contract's own config field: any JSON scalar).
_COLUMN_CHECKS: Dict[str, Check] = {"failed": lambda v: isinstance(v, (bool, int))}


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def _column_check(field: str, panel: bool = False) -> Check:
    return _scalar if panel else _COLUMN_CHECKS.get(field, _count)
_FINDING_FIELDS = {"kind": _text, "region": _text, "case": _text, "buffer": _optional(_text), "start": _optional(_int),
                   "stop": _optional(_int), "detail": _optional(_text), "owner_names": _optional(_list_of(_text))}
_CASE_FIELDS = {"path": _text, "source": _text, "kernel": _text, "repro": _text, "kinds": _list_of(_text),
                "need": _count, "width": _count, "num_seqs": _count,
                "found_in": _optional(_list_of(_text)), "contract": _text, "sizing": _text, "describe": _text,
                "config": lambda v: isinstance(v, dict), "coverage": _list_of(_scalar)}
_RUN_ROW_FIELDS = {"dir": _text, "examples": _count, "elapsed_s": _number, "findings": _count, "cases": _count,
                   "host": _optional(_text), "device": _optional(_text), "seed": _optional(_int)}
#: Top-level fields besides the ones checked by hand below: each may be absent, else of this type.
_TOP_FIELDS = {
    **{key: _count for key in COUNTS + ("distinct_configs", "compiles", "captures", "host_verified_cases", "resumed")},
    **{key: _optional(_count) for key in ("jobs", "jobs_not_started", "batches_per_example", "max_gpu_mem")},
    "seq_len_limit": _optional(lambda v: _count(v) or _text(v)),  # a merge of runs that differ says "mixed: ..."
    **{key: _number for key in ("elapsed_s", "cases_per_s", "compile_s", "capture_s", "runner_s",
                                "max_need_over_width", "structural_cases_per_s", "examples_per_s",
                                "distinct_configs_per_s")},
    **{key: _optional(_text) for key in ("device", "kernel", "sizing", "mode", "layout", "domain", "domain_text",
                                         "contract", "seed_source", "checking", "interrupted", "bulk_splice")},
    "seed": _optional(_int), "family_drawn": _flag, "time_cut": _flag, "shrink_cut": _flag, "resume": _flag,
    "family_pins": _optional(_dict_of(lambda v: _int(v) or _text(v))),
    "first_failure_s": _optional(_number), "first_failure_at": _optional(_number),
    "boundaries": _optional(_dict_of(_count)), "versions": _optional(_dict_of(_text)),
    "job_problems": _optional(_list_of(_text)),
    "first_examples": _optional(_list_of(lambda v: isinstance(v, dict))),
    "family_share": _optional(_number),  # the share of examples that drew the §6 fields (docs/contract.md §5)
}


def _check_fields(obj: Any, fields: dict[str, Any], where: str, required: Iterable[str] = ()) -> None:
    require(isinstance(obj, dict), f"{where} must be an object")
    for key in required:
        require(key in obj, f"{where}.{key} is missing")
    for key, check in fields.items():
        if key in obj:
            require(check(obj[key]), f"{where}.{key} has the wrong type or value ({_short(obj[key])})")


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def validate(doc: Any, where: str) -> dict[str, Any]:
    """Check the type of every field of a parsed summary a report reads, so that rendering or merging it
    cannot fail; ``BadInput`` names the first problem (summaries are data: from another host, or
    written by hand)."""
    require(isinstance(doc, dict), f"{where}: top level must be a JSON object")
    require(doc.get(MARKER) == SUMMARY_VERSION,
            f"{where}: not a kvfence summary of version {SUMMARY_VERSION} "
            f"(field {MARKER!r} is {_short(doc.get(MARKER))})")
    for key in ("examples", "launches"):
        require(_count(doc.get(key)), f"{where}: {key} must be a non-negative integer")
    for key in ("elapsed_s", "cases_per_s"):
        require(_number(doc.get(key)), f"{where}: {key} must be a number")
    _check_fields(doc, _TOP_FIELDS, where)
    require(isinstance(doc.get("findings"), list), f"{where}: findings must be a list")
    for i, f in enumerate(doc["findings"]):
        require(isinstance(f, dict) and all(isinstance(f.get(k), str) for k in ("kind", "region", "case")),
                f"{where}: findings[{i}] needs string kind, region and case")
        _check_fields(f, _FINDING_FIELDS, f"{where}: findings[{i}]")
    require(isinstance(doc.get("cases", {}), dict), f"{where}: cases must be an object")
    for name, record in doc.get("cases", {}).items():
        at = f"{where}: cases[{_short(name)}]"
        _check_fields(record, _CASE_FIELDS, at, required=("path", "source", "repro", "kinds", "need", "width",
                                                          "num_seqs", "config"))
        # A record without its own description (a summary written before contracts were plug-ins: a draft
        # kernel's case) is described from its config's fields and its batch, so those must be there.
        legacy = "describe" not in record
        _check_fields(record["config"], _CONFIG_FIELDS, f"{at}.config",
                      required=tuple(_CONFIG_FIELDS) if legacy else ())
        if legacy or "batch" in record:
            _check_fields(record.get("batch"), {"seq_lens": _list_of(_count)}, f"{at}.batch", required=("seq_lens",))
    largest = doc.get("largest_config")
    if largest is not None:
        # Its config fields as a case record's are checked (a draft config's counts: the report formats them).
        _check_fields(largest, dict(_SIZED_FIELDS, estimated_bytes=_number), f"{where}: largest_config",
                      required=("estimated_bytes",))
    earlier = doc.get("earlier_cases")
    require(earlier is None or (isinstance(earlier, dict) and isinstance(earlier.get("folder"), str)
                                and _int(earlier.get("count"))),
            f"{where}: earlier_cases must be null or an object with folder (string) and count (integer)")
    cov = doc.get("coverage", {})
    require(isinstance(cov, dict) and isinstance(cov.get("examples", []), list),
            f"{where}: coverage.examples must be a list")
    fields = cov.get("fields")
    require(fields is None or (isinstance(fields, list) and all(isinstance(f, str) for f in fields)
                               and set(launches.COVERAGE) <= set(fields)),
            f"{where}: coverage.fields must be a list of names holding {', '.join(launches.COVERAGE)}")
    fields = coverage_fields(doc)
    panel = fields[0] not in launches.COVERAGE and fields != COVERAGE_FIELDS
    checks = [_column_check(f, panel and i == 0) for i, f in enumerate(fields)]
    ex = doc.get("max_need_over_width_example")
    require(ex is None or (isinstance(ex, dict) and set(fields) <= set(ex)
                           and all(check(ex[k]) for check, k in zip(checks, fields))),
            f"{where}: max_need_over_width_example must be null or an object of integers {', '.join(fields)}")
    require(_flag(cov.get("sampled")), f"{where}: coverage.sampled must be true or false")
    require(cov.get("left_out_runs") is None or _count(cov["left_out_runs"]),
            f"{where}: coverage.left_out_runs must be a non-negative integer")
    for row in cov.get("examples", []) + ([cov["failure"]] if cov.get("failure") is not None else []):
        require(isinstance(row, list) and len(row) == len(fields) and all(check(x) for check, x in zip(checks, row)),
                f"{where}: coverage rows must be lists of {len(fields)} values "
                f"({', '.join(fields)}); got {_short(row)}")
    campaign = doc.get("campaign")
    if campaign is not None:
        _check_fields(campaign, {"database": _optional(_text), "stored_failures_at_start": _optional(_count),
                                 "host": _optional(_text), "shard": _optional(lambda v: isinstance(v, dict))},
                      f"{where}: campaign")
    merged = doc.get("merged")
    if merged is not None:
        _check_fields(merged, {"runs": _list_of(lambda r: isinstance(r, dict)), "duplicate_cases": _count},
                      f"{where}: merged", required=("runs",))
        for i, row in enumerate(merged["runs"]):
            _check_fields(row, _RUN_ROW_FIELDS, f"{where}: merged.runs[{i}]")
    checked: dict[str, Any] = doc
    return checked


def merge_resumed(previous: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """``fuzz --resume`` into a folder: ``previous`` (its summary.json) plus the findings and case files
    of ``doc``, so resuming never replaces an earlier run's results. The earlier run's statistics and
    coverage stay; ``resumed`` counts how many times results were added."""
    def key(f: dict[str, Any]) -> Tuple[Any, ...]:
        return f["case"], f["kind"], f["region"], f.get("start", 0), f.get("stop", 0)


    seen = {key(f) for f in previous["findings"]}
    merged = dict(previous)
    merged["findings"] = list(previous["findings"]) + [f for f in doc["findings"] if key(f) not in seen]
    merged["cases"] = {**previous.get("cases", {}), **doc.get("cases", {})}
    merged["resumed"] = int(previous.get("resumed", 0)) + 1
    return merged
