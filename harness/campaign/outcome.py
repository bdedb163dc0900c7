"""A campaign's one result: the shards' folders merged into ``OUT`` (``kvfence report --merge``'s merge: one
``summary.json``, ``cases/``, ``report.md``, ``report.html``), with a ``shards`` table (each shard's host, GPU,
seed block, status, examples) and a ``campaign_run`` block (engine, wall time, follow-ups), and the exit code.

Exit codes as ``fuzz``: 1 when the campaign has findings, or a shard ended without a result of its own (lost,
timed out, died, bad input: each named in ``shard_problems``, as ``fuzz --jobs`` names a job that died); 0 when
every shard ran clean; ``128 + signal`` when a signal stopped it (what finished is merged all the same).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional, Tuple

from kvfence.engine.casefile import atomic_write_text
from kvfence.engine.outdir import EARLIER_DIR, set_aside_earlier_cases
from kvfence.errors import EXIT_CLEAN, EXIT_FINDINGS
from kvfence.reports.merge import merge
from kvfence.reports.render import write_reports

#: Shard statuses that are a result (the shard ran its budget, or was stopped by the campaign's own signal).
RESULT_STATUSES = ("clean", "findings", "interrupted", "cancelled")
#: Finding kinds a compute-sanitizer follow-up replays (the process died or stopped answering: canaries saw nothing).
FOLLOW_UP_KINDS = ("CRASH", "HANG")


def set_aside_earlier(out: Path) -> Optional[dict]:
    """An earlier campaign's results in ``out``: its case files go to ``cases/earlier/<time>/`` (as ``fuzz`` does;
    the report names them as earlier), its ``shards/`` and ``sanitizer/`` folders to ``earlier/<time>/``, so this
    campaign's merge sees only its own shards. Returns the case files' ``{"folder", "count"}`` or ``None``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    moving = [out / name for name in ("shards", "sanitizer") if (out / name).is_dir()]
    if moving:
        dest = out / EARLIER_DIR / stamp
        while dest.exists():
            dest = dest.with_name(dest.name + "-1")
        dest.mkdir(parents=True)
        for folder in moving:
            folder.replace(dest / folder.name)  # same filesystem: a rename
    return set_aside_earlier_cases(out)


def merged_shards(out: Path, rows: List[dict]) -> Optional[dict]:
    """Merge the folders of the shards that wrote a summary into ``out``; ``None`` when none did."""
    folders = [out / "shards" / r["shard"] for r in rows if (out / "shards" / r["shard"] / "summary.json").is_file()]
    return merge(folders, out) if folders else None


def follow_up_cases(doc: Optional[dict]) -> Tuple[List[Path], List[Path]]:
    """The merged case files with a CRASH or HANG finding: those a shard found on CUDA (compute-sanitizer replays
    them) and those found only on the CPU (the interpreter: nothing for compute-sanitizer to check)."""
    if doc is None:
        return [], []
    cuda_runs = {r["dir"] for r in doc["merged"]["runs"] if r.get("device") == "cuda"}
    wanted = {f["case"] for f in doc["findings"] if f["kind"] in FOLLOW_UP_KINDS}
    cases = [(Path(path), bool(set(record.get("found_in", [])) & cuda_runs))
             for path, record in doc["cases"].items() if path in wanted]
    return [p for p, cuda in cases if cuda], [p for p, cuda in cases if not cuda]


def shard_problems(rows: List[dict]) -> List[str]:
    return [f"shard {r['shard']} ({r['label']}) {r['status']}" + (f": {r['note']}" if r.get("note") else "")
            for r in rows if r["status"] not in RESULT_STATUSES]


def write(out: Path, doc: Optional[dict], rows: List[dict], run: dict, earlier: Optional[dict] = None) -> dict:
    """The merged summary with ``shards`` and ``campaign_run`` (and, when no shard wrote a summary, a summary of
    none: the shards' rows still say what happened), then the reports."""
    rows = sorted(rows, key=lambda r: (r["target"], r["index"]))
    if doc is None:
        doc = {"examples": 0, "findings": [], "cases": {}, "merged": {"runs": [], "duplicate_cases": 0}}
    doc["shards"] = rows
    doc["shard_problems"] = shard_problems(rows)
    doc["campaign_run"] = run
    doc["earlier_cases"] = earlier
    atomic_write_text(out / "summary.json", json.dumps(doc, indent=1) + "\n")
    if doc["merged"]["runs"]:  # a merged run summary (none: no shard wrote one, the rows say why)
        write_reports(doc, out)
    return doc


def exit_code(doc: dict) -> int:
    return EXIT_FINDINGS if doc["findings"] or doc["shard_problems"] else EXIT_CLEAN
