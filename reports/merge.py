"""``python -m harness report --merge DIR... --out OUT``: several fuzz runs (hosts, shards, nights) as one report.

Each DIR is a ``fuzz --out`` folder (``summary.json`` and ``cases/``), copied from wherever it ran.
The merged ``OUT/summary.json`` is an ordinary summary (``reports.summary``), so ``report OUT`` re-renders
it, plus a ``merged`` block listing the runs. Identical failing cases (same case content, hence the same
``<hash>.json`` name) are kept once, with every run that found them; identical findings of one case are
kept once. Case files are validated as data and copied byte for byte: nothing they name is imported.

Totals: ``examples``, ``launches`` and ``elapsed_s`` are sums over the runs (machine time, whether the
runs were parallel or not), so ``cases_per_s`` is the mean rate of one run; each run's own numbers are
in ``merged.runs``. The coverage sample takes from each run in proportion to its examples, as many rows
as the largest input sample holds.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Dict, List

from harness.casefile import CASES_DIR, MARKER as CASE_MARKER, SCHEMA_VERSION, atomic_write_text, case_from_dict, \
    case_hash, parse_json_file, repro_command
from harness.errors import BadInput, require
from reports.summary import MARKER, SUMMARY_VERSION, validate

#: Run settings that should agree across merged runs; when they do not, the merged value says "mixed".
SHARED_FIELDS = ("device", "kernel", "sizing", "mode", "layout", "seq_len_limit")


def _load_run(folder: Path) -> dict:
    require(folder.is_dir(), f"report --merge {folder}: no such directory")
    where = folder / "summary.json"
    return validate(parse_json_file(where, "summary"), str(where))


def _case_file(folder: Path, recorded: str) -> Path:
    """The run's case file: ``DIR/cases/<name>`` (the recorded path is where it was on the run's host)."""
    path = folder / CASES_DIR / Path(recorded).name
    require(path.is_file(), f"report --merge {folder}: case file {path.name} named in summary.json is missing "
                            f"from {folder / CASES_DIR}")
    return path


def _case_key(path: Path) -> str:
    """The case file's content hash, from validated data (no kernel or sizing plug-in is resolved)."""
    doc = parse_json_file(path, "case file")
    require(isinstance(doc, dict) and doc.get(CASE_MARKER) == SCHEMA_VERSION,
            f"case file {path}: not a kvfence case file of schema version {SCHEMA_VERSION}")
    try:
        return case_hash(case_from_dict(doc.get("case")))
    except BadInput as exc:
        raise BadInput(f"case file {path}: {exc}") from None


def _mixed(values: List) -> object:
    """The runs' common value, or ``"mixed: a, b"`` when they differ."""
    distinct = sorted({str(v) for v in values})
    return values[0] if len(distinct) == 1 else "mixed: " + ", ".join(distinct)


def _versions(folders: List[Path], docs: List[dict]) -> dict:
    """The tool versions when every run agrees, else each run's (a fleet should agree: worth seeing)."""
    versions = [d.get("versions") or {} for d in docs]
    if all(v == versions[0] for v in versions):
        return versions[0]
    return {str(f): ", ".join(f"{k} {x}" for k, x in v.items()) for f, v in zip(folders, versions)}


def _coverage(docs: List[dict]) -> dict:
    rows_by_run = [d.get("coverage", {}).get("examples", []) for d in docs]
    cap = max((len(rows) for rows in rows_by_run), default=0)
    total = sum(d["examples"] for d in docs) or 1
    rng = random.Random(0)
    rows: List[list] = []
    for doc, run_rows in zip(docs, rows_by_run):
        want = min(len(run_rows), max(1, round(cap * doc["examples"] / total)) if run_rows else 0)
        rows += run_rows if want == len(run_rows) else rng.sample(run_rows, want)
    failures = [d["coverage"]["failure"] for d in docs if d.get("coverage", {}).get("failure")]
    fields = docs[0].get("coverage", {}).get("fields")
    sampled = len(rows) < sum(d["examples"] for d in docs) or any(d.get("coverage", {}).get("sampled") for d in docs)
    return {"fields": fields, "examples": rows, "sampled": sampled,
            "failure": failures[0] if failures else None}


def merge(folders: List[Path], out: Path) -> dict:
    """Merge the runs in ``folders`` into ``out`` (summary.json and cases/); return the merged summary."""
    require(folders, "report --merge: name at least one run folder")
    resolved = [f.resolve() for f in folders]
    require(len(set(resolved)) == len(resolved), "report --merge: a folder is named twice")
    require(out.resolve() not in resolved, f"report --merge: --out {out} is one of the merged folders; "
                                           "choose a new folder")
    require(not out.exists() or out.is_dir(), f"report --merge: --out {out} exists and is not a directory")
    docs = [_load_run(f) for f in folders]

    # Validate every case file before writing anything.
    cases: Dict[str, dict] = {}  # content hash -> merged case record
    sources: Dict[str, Path] = {}
    renamed: List[Dict[str, str]] = []  # per run: recorded path -> merged path
    for folder, doc in zip(folders, docs):
        mapping = {}
        for recorded, record in doc.get("cases", {}).items():
            path = _case_file(folder, recorded)
            key = _case_key(path)
            target = str(out / CASES_DIR / f"{key}.json")
            mapping[recorded] = target
            if key not in cases:
                sources[key] = path
                cases[key] = dict(record, path=target, repro=repro_command(target), found_in=[])
            cases[key]["found_in"].append(str(folder))
        renamed.append(mapping)
    findings, seen = [], set()
    for doc, mapping in zip(docs, renamed):
        for f in doc["findings"]:
            require(f["case"] in mapping, f"report --merge: a finding names case {f['case']}, which its summary's "
                                          "cases do not list")
            merged = dict(f, case=mapping[f["case"]])
            text = json.dumps(merged, sort_keys=True)
            if text not in seen:
                seen.add(text)
                findings.append(merged)

    examples = sum(d["examples"] for d in docs)
    elapsed = sum(d["elapsed_s"] for d in docs)
    runs = [{"dir": str(folder), "host": (d.get("campaign") or {}).get("host"),
             "shard": ((d.get("campaign") or {}).get("shard") or {}).get("shard"), "device": d.get("device"),
             "seed": d.get("seed"), "examples": d["examples"], "elapsed_s": d["elapsed_s"],
             "findings": len(d["findings"]), "cases": len(d.get("cases", {}))} for folder, d in zip(folders, docs)]
    doc = {
        MARKER: SUMMARY_VERSION,
        "examples": examples,
        "launches": sum(d["launches"] for d in docs),
        "elapsed_s": round(elapsed, 3),
        "cases_per_s": round(examples / elapsed, 3) if elapsed > 0 else 0.0,
        **{name: _mixed([d.get(name) for d in docs]) for name in SHARED_FIELDS},
        "seed": None,
        "resume": False,
        "max_need_over_width": max(d.get("max_need_over_width", 0) for d in docs),
        "shrink_cut": any(d.get("shrink_cut") for d in docs),
        "findings": findings,
        "cases": {c["path"]: c for c in cases.values()},
        "coverage": _coverage(docs),
        "versions": _versions(folders, docs),
        "merged": {"runs": runs, "duplicate_cases": sum(len(c["found_in"]) - 1 for c in cases.values())},
    }

    (out / CASES_DIR).mkdir(parents=True, exist_ok=True)
    for key, source in sources.items():
        target = out / CASES_DIR / f"{key}.json"
        target.write_bytes(source.read_bytes())
    atomic_write_text(out / "summary.json", json.dumps(doc, indent=1) + "\n")
    return doc
