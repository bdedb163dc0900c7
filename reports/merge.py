"""``python -m kvfence report --merge DIR... --out OUT``: several fuzz runs (hosts, shards, nights) as one report.

Each DIR is a ``fuzz --out`` folder (``summary.json`` and ``cases/``), copied from wherever it ran.
The merged ``OUT/summary.json`` is an ordinary summary (``kvfence.engine.summary``), so ``report OUT`` re-renders
it, plus a ``merged`` block listing the runs. Identical failing cases (same case content, hence the same
``<hash>.json`` name) are kept once, with every run that found them; identical findings of one case are
kept once. Case files are validated as data and copied byte for byte: nothing they name is imported.

Counts, coverage and findings are merged by ``kvfence.engine.summary.merge`` (as for ``fuzz --jobs``);
``elapsed_s`` is the runs' elapsed seconds summed (machine time, whether the runs were parallel or
not), so ``cases_per_s`` is the mean rate of one run; each run's own numbers are in ``merged.runs``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, List

from kvfence.engine.casefile import (
    CASES_DIR,
    atomic_write_text,
    case_hash,
    from_document,
    parse_json_file,
    record_repro_command,
)
from kvfence.engine.summary import merge as merge_summaries
from kvfence.engine.summary import validate
from kvfence.errors import BadInput, require

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
    """The case file's content hash, from validated data (its contract's record reads the case; no kernel or
    sizing plug-in is resolved)."""
    return case_hash(from_document(parse_json_file(path, "case file"), path).case)


def _mixed(values: List) -> object:
    """The runs' common value, or ``"mixed: a, b"`` when they differ."""
    distinct = sorted({str(v) for v in values})
    return values[0] if len(distinct) == 1 else "mixed: " + ", ".join(distinct)


def merge(folders: List[Path], out: Path, before_writing: Callable[[], None] = lambda: None) -> dict:
    """Merge the runs in ``folders`` into ``out`` (summary.json and cases/); return the merged summary.
    ``before_writing`` runs once every input is validated, before anything is written (the CLI takes
    ``out``'s run lock there, ``kvfence.engine.outlock``)."""
    require(folders, "report --merge: name at least one run folder")
    resolved = [f.resolve() for f in folders]
    require(len(set(resolved)) == len(resolved), "report --merge: a folder is named twice")
    require(out.resolve() not in resolved, f"report --merge: --out {out} is one of the merged folders; "
                                           "choose a new folder")
    require(not out.exists() or out.is_dir(), f"report --merge: --out {out} exists and is not a directory")
    docs = [_load_run(f) for f in folders]

    # Every case file is validated before anything is written; each is renamed by its content hash.
    sources: Dict[str, Path] = {}  # merged path -> a run's case file
    found_in: Dict[str, List[str]] = {}
    for folder, doc in zip(folders, docs):
        mapping = {}
        for recorded in doc.get("cases", {}):
            path = _case_file(folder, recorded)
            key = _case_key(path)
            # A case file is named by its case's hash when written: a different hash now means the file was
            # edited after its run, and the run's summary (its findings, need, kinds) describes another case.
            require(key == path.stem, f"report --merge {folder}: case file {path.name} was changed after its run "
                                      f"(its case now hashes to {key}): the summary describes the case as it "
                                      "ran; restore the file, or leave this run out")
            mapping[recorded] = target = str(out / CASES_DIR / f"{key}.json")
            sources.setdefault(target, path)
            found_in.setdefault(target, []).append(str(folder))
        for f in doc["findings"]:
            require(f["case"] in mapping, f"report --merge: {folder / 'summary.json'} has a finding for case "
                                          f"{f['case']}, which its cases do not list")
            f["case"] = mapping[f["case"]]
        doc["cases"] = {mapping[k]: dict(v, path=mapping[k], repro=record_repro_command(mapping[k], v),
                                         found_in=found_in[mapping[k]]) for k, v in doc.get("cases", {}).items()}

    # Counts, coverage and findings as for --jobs (one definition: kvfence.engine.summary.merge); identical
    # findings of one case file are kept once. Time is machine time: the runs' elapsed seconds summed.
    shared = {name: _mixed([d.get(name) for d in docs]) for name in SHARED_FIELDS}
    doc = merge_summaries(docs, run=dict(shared, seed=None, resume=False),
                          elapsed_s=sum(d["elapsed_s"] for d in docs))
    doc["versions"] = _versions(folders, docs)
    doc["merged"] = {"runs": [_run_row(folder, d) for folder, d in zip(folders, docs)],
                     "duplicate_cases": sum(len(v) - 1 for v in found_in.values())}

    before_writing()
    try:
        (out / CASES_DIR).mkdir(parents=True, exist_ok=True)
        for target, source in sources.items():
            Path(target).write_bytes(source.read_bytes())
        atomic_write_text(out / "summary.json", json.dumps(doc, indent=1) + "\n")
    except OSError as exc:
        raise BadInput(f"report --merge --out {out}: cannot write {exc.filename or out}: "
                       f"{exc.strerror or exc}") from None
    return doc


def _run_row(folder: Path, doc: dict) -> dict:
    campaign = doc.get("campaign") or {}
    return {"dir": str(folder), "host": campaign.get("host"), "shard": (campaign.get("shard") or {}).get("shard"),
            "device": doc.get("device"), "seed": doc.get("seed"), "examples": doc["examples"],
            "elapsed_s": doc["elapsed_s"], "findings": len(doc["findings"]), "cases": len(doc.get("cases", {}))}


def _versions(folders: List[Path], docs: List[dict]) -> dict:
    """The tool versions when every run agrees, else each run's (a fleet should agree: worth seeing)."""
    versions = [d.get("versions") or {} for d in docs]
    if all(v == versions[0] for v in versions):
        return versions[0]
    return {str(f): ", ".join(f"{k} {x}" for k, x in v.items()) for f, v in zip(folders, versions)}
