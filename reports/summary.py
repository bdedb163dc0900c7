"""The fuzz run summary: built once from a ``FuzzResult`` and written as ``summary.json``.

``summary.json`` (and ``--json PATH``, same content) is what ``python -m kvfence report DIR`` re-renders
from, so it carries everything the report shows: the run, each finding with ``kind``, ``region`` and
``case`` (the path of its case file), a short record of each case file, and the coverage stats.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional

from kvfence.errors import require

SUMMARY_VERSION = 1
MARKER = "kvfence_summary"
#: Columns of ``coverage.examples`` rows (``kvfence.workflow.fuzz.ExampleStat`` fields).
COVERAGE_FIELDS = ("topk", "num_steps", "page_size", "num_seqs", "raw_bs", "need", "width", "failed")


def case_record(path: str, case, findings, *, source: str) -> dict:
    """What the summary keeps about one case file (enough to plot and describe it)."""
    s = case.sizing_summary()
    c, b = case.config, case.batch
    return {"path": path, "source": source, "kernel": case.kernel, "config": c.to_dict(), "batch": b.to_dict(),
            "need": s["need"], "width": s["width"], "num_seqs": s["num_seqs"],
            "kinds": sorted({f.kind.value for f in findings}), "repro": f"python -m kvfence repro {path}"}


def max_example(result) -> Optional[dict]:
    """The explored case with the highest need/width (the one "max need/width" comes from), as a
    ``COVERAGE_FIELDS`` dict (``FuzzResult.max_utilisation_stat``), or ``None`` before any case."""
    stat = getattr(result, "max_utilisation_stat", None)
    return dict(zip(COVERAGE_FIELDS, stat)) if stat is not None else None


def build(result, *, run: dict, case_path: Optional[str], crashes: Iterable = (), versions: Optional[dict] = None,
          earlier: Optional[dict] = None) -> dict:
    """The summary of one fuzz run. ``run`` holds the command's settings (device, kernel, sizing, ...);
    ``crashes`` are ``kvfence.running.journal.Crash`` records recovered at the start of the run; ``earlier`` is
    where an earlier run's case files were moved (``kvfence.workflow.outdir``), if any."""
    findings: List[dict] = []
    cases: Dict[str, dict] = {}
    for crash in crashes:
        p = str(crash.path)
        findings.append(dict(crash.finding.to_dict(), case=p))
        cases[p] = case_record(p, crash.case, [crash.finding], source="journal")
    if result.findings and case_path is not None:
        findings += [dict(f.to_dict(), case=case_path) for f in result.findings]
        cases[case_path] = case_record(case_path, result.case, result.findings, source="fuzz")
    stats = [list(s) for s in result.stats]
    session = result.session_stats or {}
    return {
        MARKER: SUMMARY_VERSION,
        "examples": result.examples,
        **{key: getattr(result, key) for key in COUNTS[1:]},
        "elapsed_s": round(result.elapsed_s, 3),
        "cases_per_s": round(result.cases_per_s, 3),
        "structural_cases_per_s": round(result.structural_cases_per_s, 3),
        "distinct_configs": result.distinct_configs,
        # The digests behind structural_cases and distinct_configs: a merge counts what is distinct
        # across jobs from them (sorted, so a summary is the same for the same run).
        "structure_keys": sorted(result.structure_keys),
        "config_keys": sorted(result.config_keys),
        **{key: (round(session.get(key, 0), 3) if key.endswith("_s") else session.get(key, 0)) for key in SESSION_KEYS},
        **run,
        "largest_config": result.largest_config,
        "boundaries": dict(sorted(result.boundaries.items())),
        "max_need_over_width": round(result.max_utilisation, 4),
        "max_need_over_width_example": max_example(result),
        "earlier_cases": earlier,
        "time_cut": result.time_cut,
        "first_failure_s": round(result.first_failure_s, 3) if result.first_failure_s is not None else None,
        "examples_to_failure": result.examples_to_failure,
        "first_failure_at": result.first_failure_at,
        "shrink_cut": result.shrink_cut,
        "findings": findings,
        "cases": cases,
        "coverage": {"fields": list(COVERAGE_FIELDS), "examples": stats,
                     "sampled": len(stats) < result.examples,
                     "failure": list(result.failure_stat) if result.failure_stat is not None else None},
        "versions": versions or {},
    }


#: The run's counts, in the order every output shows them (kvfence.workflow.fuzz.FuzzResult defines each).
COUNTS = ("examples", "generated_cases", "verified_cases", "cached_cases", "shrink_cases", "launches",
          "structural_cases", "token_variant_cases")
#: Counts distinct across the jobs of a merge -> the digests each summary lists for them.
DISTINCT = {"structural_cases": "structure_keys", "distinct_configs": "config_keys"}
#: Session counters copied into the summary (kvfence.verifying.session.Session.stats).
SESSION_KEYS = ("compiles", "captures", "compile_s", "capture_s", "runner_s",
                # §6 cases verified on the host because the device verifier checks §2 only (kvfence.verifying.session)
                "host_verified_cases")


def merge(docs: List[dict], *, run: dict, elapsed_s: float, started_at: Optional[float] = None) -> dict:
    """One summary from several (``--jobs`` workers, or runs of several hosts): counts and session
    counters add up, coverage rows are pooled (reservoir-capped like one run's), findings and case
    files are kept once per case file, and the rate is recomputed over ``elapsed_s`` of wall time
    (``started_at``, epoch seconds, dates the first failure from the merged run's start)."""
    import random

    out = {MARKER: SUMMARY_VERSION}
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
    out["elapsed_s"] = round(elapsed_s, 3)
    out["cases_per_s"] = round(out["verified_cases"] / elapsed_s, 3) if elapsed_s > 0 else 0.0
    out["structural_cases_per_s"] = round(out["structural_cases"] / elapsed_s, 3) if elapsed_s > 0 else 0.0
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
    # The earliest failure of any job, in seconds from the merged run's start (job start-up included).
    firsts = [d["first_failure_at"] for d in docs if d.get("first_failure_at") is not None]
    out["first_failure_at"] = min(firsts) if firsts else None
    out["first_failure_s"] = (round(min(firsts) - started_at, 3) if firsts and started_at is not None
                              else min((d["first_failure_s"] for d in docs if d.get("first_failure_s") is not None),
                                       default=None))
    out["shrink_cut"] = any(d.get("shrink_cut") for d in docs)
    findings, cases, seen = [], {}, set()
    for d in docs:
        for f in d.get("findings", []):
            key = (f.get("case"), f.get("kind"), f.get("region"), f.get("start"), f.get("stop"))
            if key not in seen:
                seen.add(key)
                findings.append(f)
        cases.update(d.get("cases", {}))
    out["findings"], out["cases"] = findings, cases
    rows = [row for d in docs for row in d.get("coverage", {}).get("examples", [])]
    sampled = any(d.get("coverage", {}).get("sampled") for d in docs)
    if len(rows) > MAX_COVERAGE_ROWS:
        rows, sampled = random.Random(0).sample(rows, MAX_COVERAGE_ROWS), True
    failures = [d["coverage"]["failure"] for d in docs if d.get("coverage", {}).get("failure")]
    out["coverage"] = {"fields": list(COVERAGE_FIELDS), "examples": rows, "sampled": sampled,
                       "failure": failures[0] if failures else None}
    out["versions"] = next((d.get("versions") for d in docs if d.get("versions")), {})
    return out


#: Coverage rows a merged summary keeps (each run keeps at most kvfence.workflow.fuzz.MAX_STATS).
MAX_COVERAGE_ROWS = 20000


def validate(doc, where: str) -> dict:
    """Check a parsed summary enough to render it; ``BadInput`` names the first problem."""
    require(isinstance(doc, dict), f"{where}: top level must be a JSON object")
    require(doc.get(MARKER) == SUMMARY_VERSION,
            f"{where}: not a kvfence summary of version {SUMMARY_VERSION} (field {MARKER!r} is {doc.get(MARKER)!r})")
    for key in ("examples", "launches"):
        require(isinstance(doc.get(key), int) and doc[key] >= 0, f"{where}: {key} must be a non-negative integer")
    for key in ("elapsed_s", "cases_per_s"):
        require(isinstance(doc.get(key), (int, float)), f"{where}: {key} must be a number")
    require(isinstance(doc.get("findings"), list), f"{where}: findings must be a list")
    for i, f in enumerate(doc["findings"]):
        require(isinstance(f, dict) and all(isinstance(f.get(k), str) for k in ("kind", "region", "case")),
                f"{where}: findings[{i}] needs string kind, region and case")
    require(isinstance(doc.get("cases", {}), dict), f"{where}: cases must be an object")
    earlier = doc.get("earlier_cases")
    require(earlier is None or (isinstance(earlier, dict) and isinstance(earlier.get("folder"), str)
                                and isinstance(earlier.get("count"), int)),
            f"{where}: earlier_cases must be null or an object with folder (string) and count (integer)")
    ex = doc.get("max_need_over_width_example")
    require(ex is None or (isinstance(ex, dict) and set(COVERAGE_FIELDS) <= set(ex)),
            f"{where}: max_need_over_width_example must be null or an object with {', '.join(COVERAGE_FIELDS)}")
    cov = doc.get("coverage", {})
    require(isinstance(cov, dict) and isinstance(cov.get("examples", []), list), f"{where}: coverage.examples must be a list")
    for row in cov.get("examples", []):
        require(isinstance(row, list) and len(row) == len(COVERAGE_FIELDS),
                f"{where}: coverage rows must have {len(COVERAGE_FIELDS)} fields ({', '.join(COVERAGE_FIELDS)})")
    return doc


def table(rows: List[List[str]], header: List[str]) -> str:
    """A plain fixed-width text table."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def _seed_text(doc: dict) -> str:
    seed = doc.get("seed")
    return f"random ({seed})" if doc.get("seed_source") == "random" else str(seed)


def _largest_text(doc: dict) -> str:
    c = doc.get("largest_config")
    if not c:
        return "-"
    return (f"max_bs {c['max_bs']} x ctx {c['ctx']} x topk {c['topk']} x {c['num_steps']} steps, page {c['page_size']} "
            f"({c.get('estimated_bytes', 0) / 2**20:.1f} MiB)")


def _family_text(doc: dict) -> str:
    """Contract, whether the §6 fields were drawn (``--family``), what was pinned, and how many cases the
    host verdict judged because the device verifier checks only the classic contract."""
    pins = doc.get("family_pins") or {}
    text = f"contract {doc.get('contract', 'draft')}, {'drawn' if doc.get('family_drawn') else 'not drawn'}"
    if pins:
        text += ", pinned " + " ".join(f"{k}={v}" for k, v in sorted(pins.items()))
    host = doc.get("host_verified_cases")
    return text + (f"; {host} case(s) verified on the host" if host else "")


def run_rows(doc: dict) -> List[List[str]]:
    """The run table: the same words and numbers as the progress line and the JSON keys."""
    rows = [[key.replace("_", " "), str(doc.get(key, 0))] for key in COUNTS]
    rows += [["elapsed", f"{doc['elapsed_s']:.1f} s"],
             ["verified cases/s", f"{doc['cases_per_s']:.1f}"],
             ["structurally distinct cases/s", f"{doc.get('structural_cases_per_s', 0):.1f}"],
             ["distinct configs", str(doc.get("distinct_configs", "?"))],
             ["compiles / captures", f"{doc.get('compiles', 0)} / {doc.get('captures', 0)} "
                                     f"({doc.get('compile_s', 0):.1f} s compiling, {doc.get('capture_s', 0):.1f} s capturing)"],
             ["jobs", str(doc.get("jobs", 1))],
             ["domain", str(doc.get("domain_text") or doc.get("domain", "?"))],
             ["§6 fields", _family_text(doc)],
             ["largest config", _largest_text(doc)],
             ["device", str(doc.get("device", "?"))], ["kernel", str(doc.get("kernel", "?"))],
             ["sizing", str(doc.get("sizing", "?"))], ["mode / layout", f"{doc.get('mode', '?')} / {doc.get('layout', '?')}"],
             ["seed", _seed_text(doc)], ["max need/width", max_need_text(doc)],
             ["findings", str(len(doc["findings"]))]]
    return rows + campaign_rows(doc)


def campaign_rows(doc: dict) -> List[List[str]]:
    """The example database and shard of a run (``kvfence.workflow.campaign``), when it recorded them."""
    c = doc.get("campaign")
    if not isinstance(c, dict):
        return []
    rows = [["database", str(c.get("database"))]]
    if c.get("stored_failures_at_start"):
        rows.append(["replayed from database", f"{c['stored_failures_at_start']} stored failure(s)"])
    shard = c.get("shard")
    if isinstance(shard, dict):
        rows.append(["shard", f"{shard.get('shard')} ({shard.get('cells')} of {shard.get('of_cells')} config cells; "
                              f"{shard.get('partition')})"])
    return rows


def max_need_text(doc: dict) -> str:
    """"max need/width" with the example it came from (config, launched requests, need and width)."""
    text = f"{doc.get('max_need_over_width', 0):.2f}"
    ex = doc.get("max_need_over_width_example")
    if not ex:
        return text
    requests = f"{ex['raw_bs']} request{'s' if ex['raw_bs'] != 1 else ''}"
    if ex["num_seqs"] != ex["raw_bs"]:
        requests += f" padded to {ex['num_seqs']}"
    where = (f"topk={ex['topk']} num_steps={ex['num_steps']} page_size={ex['page_size']}, {requests}: "
             f"need {ex['need']}, width {ex['width']}")
    if ex["failed"]:
        cases = [c["path"] for c in doc.get("cases", {}).values() if c.get("source") == "fuzz"]
        where += "; the failing example" + (f", shrunk into {cases[0]}" if cases else "")
    return f"{text} ({where})"


def earlier_text(doc: dict) -> str:
    """A line naming where an earlier run's case files went, or ``""``."""
    e = doc.get("earlier_cases")
    if not e:
        return ""
    return (f"{e['count']} case file(s) of an earlier run in this folder were moved to {e['folder']}; "
            "they are not part of this report.")


def finding_rows(doc: dict) -> List[List[str]]:
    out = []
    for f in doc["findings"]:
        span = f"[{f.get('start', 0)}, {f.get('stop', 0)})" if f.get("stop", 0) else ""
        out.append([f["kind"], f"{f.get('buffer', '')} {f['region']}".strip(), span, f["case"]])
    return out


def text_table(doc: dict) -> str:
    """The end-of-run summary printed by ``fuzz``: the run, then the findings and their case files."""
    parts = [table(run_rows(doc), ["run", "value"])]
    if earlier_text(doc):
        parts.append(earlier_text(doc))
    if doc["findings"]:
        parts.append(table(finding_rows(doc), ["kind", "where", "elements", "case file"]))
        parts.append("\n".join(c["repro"] for c in doc.get("cases", {}).values()))
    return "\n\n".join(parts)


def merge_resumed(previous: dict, doc: dict) -> dict:
    """``fuzz --resume`` into a folder: ``previous`` (its summary.json) plus the findings and case files
    of ``doc``, so resuming never replaces an earlier run's results. The earlier run's statistics and
    coverage stay; ``resumed`` counts how many times results were added."""
    key = lambda f: (f["case"], f["kind"], f["region"], f.get("start", 0), f.get("stop", 0))  # noqa: E731
    seen = {key(f) for f in previous["findings"]}
    merged = dict(previous)
    merged["findings"] = list(previous["findings"]) + [f for f in doc["findings"] if key(f) not in seen]
    merged["cases"] = {**previous.get("cases", {}), **doc.get("cases", {})}
    merged["resumed"] = int(previous.get("resumed", 0)) + 1
    return merged
