"""Ending a ``kvfence fuzz`` run at its first failure, for the benchmarks that time how long the search takes to
find a bug (``plain_fuzz_mutants.py``, ``first_verdict.py``).

What a run does after its first failure (shrinking, the other jobs stopping at their next example or at the
parent's grace, every job's report and coverage plot, the merge and the run's own report) measures nothing a
kill time counts, and on a GPU shared by 8 runs it was about 4.4 s of a 12 s run (``h200_kill_time.json``: the
wall time less the first failure, median). A run announces its first failure on stderr (``FIRST_FAILURE``); the
figures a benchmark reads (the first failure and the first worker ready, seconds from the command's start; the
findings' kinds; the failing job's own summary) are on disk as soon as every job the run started has written its
summary, which the job that failed does before its reports, or is still starting where that cannot change them
(``_still_starting``). ``failure_written`` says when that is and returns them merged as the run merges them
(``kvfence.engine.summary.merge``), so a run stopped there is recorded with the figures its own summary would have
held. A run whose other job is still searching is asked to stop as on a Ctrl-C (``interrupt``: SIGINT to its
process group; every job then writes its summary at its next example).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Optional

from kvfence.engine.fuzzrun import FIRST_FAILURE
from kvfence.engine.jobs import JOBS_DIR, PLAN_FILE, PROGRESS_FILE
from kvfence.engine.summary import merge


def announced(stderr: Path) -> bool:
    """Whether the run whose stderr goes to ``stderr`` has printed its first-failure line."""
    try:
        text = stderr.read_text(errors="replace")
    except OSError:
        return False
    return any(line.startswith(FIRST_FAILURE) for line in text.splitlines())


def _summary(folder: Path) -> Optional[dict]:
    try:
        return json.loads((folder / "summary.json").read_text())  # written atomically by the run
    except (OSError, ValueError):
        return None


#: Seconds a job must have started after the first worker was ready to be known to change nothing (the summaries'
#: times are rounded to the millisecond).
AFTER_READY_MARGIN_S = 0.01


def _still_starting(folder: Path, written: list) -> bool:
    """Whether the job in ``folder``, which has written no summary, can change none of the run's figures: it has
    checked no example (no progress file: a job writes one after its first example and at its failure), so it
    has no finding, and it started after the first worker of the jobs in ``written`` was ready (its plan file's
    time, written as it starts; on CUDA the jobs after the lead start so, ``kvfence.engine.jobs``), so its
    worker's ready time cannot be the run's first."""
    ready = [d["startup_s"] for d in written if d.get("startup_s") is not None]
    failed = [d for d in written if d.get("first_failure_at") is not None and d.get("first_failure_s") is not None]
    if (folder / PROGRESS_FILE).exists() or not ready or not failed:
        return False
    command_start = failed[0]["first_failure_at"] - failed[0]["first_failure_s"]  # every job counts from it
    return (folder / PLAN_FILE).stat().st_mtime > command_start + min(ready) + AFTER_READY_MARGIN_S


def failure_written(out: Path) -> tuple:
    """``(doc, finder_done)`` of a run (``--out out``) past its first failure: ``doc``, the run's summary figures
    once every job it started has written its summary or is still starting and can change none of them
    (``_still_starting``), the summaries merged (a run of one process: its own summary), else None;
    ``finder_done``, whether a job that failed has written its summary (the others may be searching)."""
    started = sorted((out / JOBS_DIR).glob(f"job-*/{PLAN_FILE}"))
    if not started:  # one process: its summary is written once its failure is (shrinking aside)
        doc = _summary(out)
        return doc, doc is not None
    docs = {plan.parent: _summary(plan.parent) for plan in started}
    written = [d for d in docs.values() if d is not None]
    finder_done = any(d.get("first_failure_at") is not None for d in written)
    if not finder_done or not all(d is not None or _still_starting(folder, written) for folder, d in docs.items()):
        return None, finder_done
    return merge(written, run={}, elapsed_s=0.0), finder_done


def interrupt(proc: subprocess.Popen) -> None:
    """SIGINT to the run's process group (it was started in a session of its own), as a Ctrl-C: every job stops
    and writes its summary, the run merges them."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
