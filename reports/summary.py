"""The fuzz run summary: built once from a ``FuzzResult`` and written as ``summary.json``.

``summary.json`` (and ``--json PATH``, same content) is what ``python -m harness report DIR`` re-renders
from, so it carries everything the report shows: the run, each finding with ``kind``, ``region`` and
``case`` (the path of its case file), a short record of each case file, and the coverage stats.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional

from harness.errors import require

SUMMARY_VERSION = 1
MARKER = "kvfence_summary"
#: Columns of ``coverage.examples`` rows (``harness.fuzz.ExampleStat`` fields).
COVERAGE_FIELDS = ("topk", "num_steps", "page_size", "num_seqs", "raw_bs", "need", "width", "failed")


def case_record(path: str, case, findings, *, source: str) -> dict:
    """What the summary keeps about one case file (enough to plot and describe it)."""
    s = case.sizing_summary()
    c, b = case.config, case.batch
    return {"path": path, "source": source, "kernel": case.kernel, "config": c.to_dict(), "batch": b.to_dict(),
            "need": s["need"], "width": s["width"], "num_seqs": s["num_seqs"],
            "kinds": sorted({f.kind.value for f in findings}), "repro": f"python -m harness repro {path}"}


def build(result, *, run: dict, case_path: Optional[str], crashes: Iterable = (), versions: Optional[dict] = None) -> dict:
    """The summary of one fuzz run. ``run`` holds the command's settings (device, kernel, sizing, ...);
    ``crashes`` are ``harness.journal.Crash`` records recovered at the start of the run."""
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
    return {
        MARKER: SUMMARY_VERSION,
        "examples": result.examples,
        "launches": result.launches,
        "elapsed_s": round(result.elapsed_s, 3),
        "cases_per_s": round(result.cases_per_s, 3),
        **run,
        "max_need_over_width": round(result.max_utilisation, 4),
        # How soon the (first) failure came: 1 when it was replayed from the example database.
        "examples_to_failure": result.examples_to_failure,
        "shrink_cut": result.shrink_cut,
        "findings": findings,
        "cases": cases,
        "coverage": {"fields": list(COVERAGE_FIELDS), "examples": stats,
                     "sampled": len(stats) < result.examples,
                     "failure": list(result.failure_stat) if result.failure_stat is not None else None},
        "versions": versions or {},
    }


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


def run_rows(doc: dict) -> List[List[str]]:
    return [["examples", str(doc["examples"])], ["launches", str(doc["launches"])],
            ["elapsed", f"{doc['elapsed_s']:.1f} s"], ["throughput", f"{doc['cases_per_s']:.1f} cases/s"],
            ["device", str(doc.get("device", "?"))], ["kernel", str(doc.get("kernel", "?"))],
            ["sizing", str(doc.get("sizing", "?"))], ["mode / layout", f"{doc.get('mode', '?')} / {doc.get('layout', '?')}"],
            ["seed", str(doc.get("seed"))], ["max need/width", f"{doc.get('max_need_over_width', 0):.2f}"],
            ["findings", str(len(doc["findings"]))]] + campaign_rows(doc)


def campaign_rows(doc: dict) -> List[List[str]]:
    """The example database and shard of a run (``harness.campaign``), when it recorded them."""
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


def finding_rows(doc: dict) -> List[List[str]]:
    out = []
    for f in doc["findings"]:
        span = f"[{f.get('start', 0)}, {f.get('stop', 0)})" if f.get("stop", 0) else ""
        out.append([f["kind"], f"{f.get('buffer', '')} {f['region']}".strip(), span, f["case"]])
    return out


def text_table(doc: dict) -> str:
    """The end-of-run summary printed by ``fuzz``: the run, then the findings and their case files."""
    parts = [table(run_rows(doc), ["run", "value"])]
    if doc["findings"]:
        parts.append(table(finding_rows(doc), ["kind", "where", "elements", "case file"]))
        parts.append("\n".join(c["repro"] for c in doc.get("cases", {}).values()))
    return "\n\n".join(parts)
