"""``fuzz --jobs N``: N fuzzing processes of one host sharing its GPU(s), merged into one run.

Hypothesis's engine costs about a millisecond per example in one Python process, which caps one
process well below what a GPU can verify; independent processes lift that cap. Each job is a plain
``python -m kvfence fuzz`` child with the parent's flags, its own seed (``seed + i``), its share of the
example budget and memory budget, and its own folder ``OUT/jobs/job-i`` (journal, case files,
summary, log). With several GPUs, job ``i`` sees only GPU ``i mod count`` (``CUDA_VISIBLE_DEVICES``).

The parent launches nothing itself: it shows one progress line summed over the jobs (each child writes
its counts to ``progress.json``), then merges the children's summaries (``kvfence.engine.summary.merge``) and
copies their case files into ``OUT/cases``. Each job shrinks its own first failure; every failure of
every job is kept. Once a job has found a failure (not under ``--keep-going``), the parent writes
``OUT/jobs/stop``: the other jobs stop exploring (``ended_by: job_failure``; one already shrinking its
own failure finishes it), as one Hypothesis run ends its exploration at its first failure, so the
run's wall time is the first failure and its shrinking, not the whole time budget. A job reads that file
between examples only: once every job that found a failure has ended, the others get
``AFTER_FAILURE_GRACE_S`` more and are then stopped (SIGTERM, their outputs written and merged), so one
in the middle of a long check cannot hold the verdict back. A job that dies (CUDA
fault, kill -9) is reported, the case it had in flight is recovered from its journal as a ``CRASH`` case
file, and the other jobs go on.

On CUDA, job 0 leads: it starts alone and the others start ``LEAD_HEAD_START_S`` after it has checked its
first example (its progress file appears), once it has ended, or once ``LEAD_WAIT_S`` have passed. N
processes that each import torch and create a CUDA context on one GPU at once make every one of them ready
later (on the H200, 15 jobs at once: the first ready 6.5-6.8 s into the command; the lead alone, on a
machine of the same floor: 4.6-4.9 s; BENCHMARKS.md), and the first verdict waits for the first of them;
the lead makes it wait for one start only. A lead that has found a failure by then (not under
``--keep-going``) ends the run: the others are not started (``not_started``; a signal before they start
leaves them unstarted too).
The others run at a lower CPU priority (``FOLLOWER_NICENESS``, inherited by their workers): while they
start (two processes each, a supervisor importing Hypothesis and a worker importing torch and creating its
CUDA context: more processes than the machine has cores) the lead goes on with its next examples, and the
first verdict is usually its; at nice 0 it got a share of a core beside them. Once all have started the
priority only orders who runs first when the CPU is short.

Priority does not order the GPU, and the lead was still slow in some runs: on the H200, in two runs of
``fuzz --sizing prefix``, the lead (ready at 5.6-5.9 s) had not found the seed's bug by 12.8-13.3 s, when
another job found it at its 3rd example, though the lead's draws reach that bug by their 3rd to 6th
example (``sizing_missing_topk`` in ``benchmarks/prior_reach.py --examples-to-trigger``). Inferring that
the others' start-ups held the lead up, the others also wait ``LEAD_HEAD_START_S`` of the lead's search,
in which its first examples run alone. Measured (BENCHMARKS.md, the first verdict, three runs each way in
one H200 sitting), that has not shown a gain yet: 1.46x the floor with it, 1.53x without. In its slowest
run the lead's first three examples took 11.6 s with 0.18 s of compiling, past the head start: a lead's
own slow example can hold the verdict back too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from kvfence.device import usable_cores
from kvfence.engine import casefile
from kvfence.engine.clock import budget_left
from kvfence.engine.plan import RunPlan
from kvfence.errors import BadInput, require

if TYPE_CHECKING:
    from kvfence.engine.journal import Crash
    from kvfence.engine.progress import Counts
    from kvfence.engine.result import FuzzResult

JOBS_DIR = "jobs"
PROGRESS_FILE = "progress.json"
#: Written by the parent in ``OUT/jobs`` when a job has found a failure: the others stop exploring.
STOP_FILE = "stop"
#: How often the parent redraws the summed progress line and children rewrite their progress file.
POLL_S = 1.0
#: Seconds the parent waits, after a signal, for jobs that got it too to stop before it signals them.
GRACE_S = 5.0
#: Seconds a job is given, once asked to stop (SIGINT, or SIGTERM past its budget), before it is killed.
STOP_WAIT_S = 5.0
#: Seconds past the run's budget (``deadline_s``) before the parent stops a job that is still running:
#: a job checks its budget between examples only, so one hung in a launch or a plug-in never returns.
JOB_OVERRUN_GRACE_S = 15.0
#: Seconds the other jobs get, once every job that found a failure has ended (shrunk and written it), to stop
#: on their own at their next example; then they are stopped (SIGTERM: their outputs written). A job reads the
#: stop file between examples only, so one in the middle of a long check (a large config compiling and
#: capturing on a shared GPU) held the verdict back until its budget's grace ran out.
AFTER_FAILURE_GRACE_S = 2.0


def _stop(procs: Sequence[_Proc], wanted: Set[int], first: int) -> List[int]:
    """Stop the jobs ``wanted`` (indices) that still run: signal ``first`` (a stopped one is continued so it
    can act on it), then SIGKILL those still alive after ``STOP_WAIT_S``. Returns the indices killed."""
    alive = [i for i in wanted if procs[i][0].poll() is None]
    for i in alive:
        for sig in (signal.SIGCONT, first):
            try:
                procs[i][0].send_signal(sig)
            except OSError:
                pass
    end = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < end and any(procs[i][0].poll() is None for i in alive):
        time.sleep(0.05)
    killed = [i for i in alive if procs[i][0].poll() is None]
    for i in killed:
        procs[i][0].kill()
        procs[i][0].wait()
    return killed


#: Memory one job needs at least: a fuzz process and its checking worker, each with torch and triton loaded.
JOB_MEMORY_BYTES = 1 << 30
#: Jobs per CPU core at most (a job waits on the device part of its time, so a little more than one).
JOBS_PER_CORE = 2


def _available_memory() -> Optional[int]:
    """Bytes of memory this host can still give (``MemAvailable``), or ``None`` where it cannot say."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def max_jobs() -> int:
    """The most ``--jobs`` this machine can hold: ``JOBS_PER_CORE`` per usable CPU core, and no more than
    its available memory at ``JOB_MEMORY_BYTES`` a job (``fuzz --help`` says so)."""
    cores = usable_cores()
    memory = _available_memory()
    by_memory = memory // JOB_MEMORY_BYTES if memory is not None else cores * JOBS_PER_CORE
    return max(1, min(cores * JOBS_PER_CORE, by_memory))


#: A job's plan, in its folder (``kvfence fuzz --plan FILE``).
PLAN_FILE = "plan.json"


def job_dir(out_dir: Path, i: int) -> Path:
    return Path(out_dir) / JOBS_DIR / f"job-{i}"


def write_progress(path: Path, result: FuzzResult) -> None:
    """A child's counts for the parent's progress line (atomic: the parent never reads half a file)."""
    doc = {key: getattr(result, key) for key in ("examples", "generated_cases", "verified_cases", "cached_cases",
                                                "shrink_cases")}
    doc.update(findings=len(result.findings), shrinking=result.shrinking, max_utilisation=result.max_utilisation,
               first_failure_at=result.first_failure_at, first_failure_text=result.first_failure_text)
    casefile.atomic_write_text(path, json.dumps(doc))


class _Summed:
    """The jobs' counts added up, as ``kvfence.engine.progress.Progress`` reads a run (its ``Counts``)."""

    def __init__(self, docs: List[dict[str, Any]], elapsed_s: float) -> None:
        def total(key: str) -> int:
            return int(sum(d.get(key, 0) for d in docs))

        self.examples, self.generated_cases = total("examples"), total("generated_cases")
        self.verified_cases, self.cached_cases, self.shrink_cases = (
            total("verified_cases"), total("cached_cases"), total("shrink_cases"))
        self.findings = [None] * total("findings")
        self.shrinking = any(d.get("shrinking") for d in docs)
        self.max_utilisation = max([d.get("max_utilisation", 0.0) for d in docs] + [0.0])
        self.elapsed_s = elapsed_s


def visible_gpus() -> List[str]:
    """The GPU ids a child may be given (honouring a CUDA_VISIBLE_DEVICES the user set)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [x for x in env.split(",") if x.strip()]
    from kvfence.device import cuda_device_count  # the driver's count: the parent never imports torch

    return [str(i) for i in range(cuda_device_count())]


#: How often the parent looks at the jobs' progress files for a first failure (it redraws every ``POLL_S``).
FIRST_FAILURE_POLL_S = 0.1
#: Seconds the other jobs wait at most for the lead job's first checked example (a CUDA run's start-up
#: and first compile take a few seconds; a lead that takes longer is not worth waiting for).
LEAD_WAIT_S = 20.0
#: Seconds of the lead's search (from its first checked example) before the others start (the module's
#: docstring says why); with ``LEAD_WAIT_S`` the others wait the lesser of the two bounds.
LEAD_HEAD_START_S = 2.0
#: ``nice`` increment of the jobs that start after the lead (the module's docstring says why).
FOLLOWER_NICENESS = 10
#: The followers start only while this much of ``--max-seconds`` (counted from the command's start) is left: each
#: checks at least one example, and a follower's start-up (imports, compiles, captures) takes seconds, so one
#: started later would only push the run's end past its budget.
FOLLOWER_MIN_LEFT_S = 5.0


def jobs_deadline(plan: RunPlan) -> Optional[float]:
    """A ``--jobs`` run's whole budget, when it has one: exploring and shrinking (and on CUDA the lead's wait)."""
    if plan.max_seconds is None:
        return None  # an example budget only: no time the parent could hold a job to
    return (LEAD_WAIT_S if plan.device == "cuda" else 0.0) + plan.max_seconds + plan.shrink_seconds


#: What ``run_jobs`` returns: the children's summaries, problem lines, recovered ``CRASH`` records, the signal's
#: name (or None) and how many jobs were never started.
JobsOutcome = Tuple[List[Dict[str, Any]], List[str], List["Crash"], Optional[str], int]


def run_jobs(plan: RunPlan, children: Sequence[RunPlan], *, progress: Optional[Callable[[Counts], None]] = None,
             on_first_failure: Optional[Callable[[Dict[str, Any]], None]] = None,
             lead: Optional[bool] = None) -> JobsOutcome:
    """Run ``plan`` (the parent's: its ``--out``, device, budgets and ``--keep-going``) as one ``python -m kvfence
    fuzz --plan FILE`` child per plan of ``children`` (``RunPlan``s, each its own seed, budget share and folder:
    ``kvfence.engine.fuzzrun.Run.child_plans``), the plan written as data; return ``(docs, problems,
    crashes, interrupted, not_started)``: the children's summaries, one line per child that ended abnormally, the
    ``CRASH`` records recovered from dead children's journals, the signal's name if SIGINT/SIGTERM stopped
    the run (the children are then stopped too, and what they wrote is still merged), and how many jobs
    were never started (the lead found a failure, or a signal came, before they were).
    ``on_first_failure(progress doc)`` is called once, for the first job whose progress shows a failure;
    without ``plan.keep_going`` the other jobs are then told to stop exploring (``STOP_FILE``), and stopped
    ``AFTER_FAILURE_GRACE_S`` after every job that found a failure has ended.
    ``lead`` (default: on CUDA) starts job 0 alone first (the module's docstring says why).
    The run's budget (``jobs_deadline``: exploring and shrinking; on CUDA the lead's wait) counts for each job
    from its first progress (its start-up is not its budget: on a loaded machine it can take seconds), or from
    the run's start for a job that never reports; a job still running ``JOB_OVERRUN_GRACE_S`` past it is
    stopped (SIGTERM, its outputs written; SIGKILL after ``STOP_WAIT_S``) and named in ``problems``."""
    from kvfence.engine.interrupt import Interrupted, raise_pending, signals_interrupt

    out_dir = Path(plan.out)
    _check_scratch(out_dir, len(children))
    run = _JobsRun(plan, _job_specs(plan, children, out_dir), progress, on_first_failure,
                   plan.device == "cuda" if lead is None else lead)
    try:
        with signals_interrupt():
            while run.waiting or run.any_running():
                raise_pending()  # a signal while the jobs were starting
                run.poll()
    except Interrupted as exc:
        run.stop_on_signal(exc.signal_name)
    finally:
        for _, _, log in run.procs:
            log.close()
    docs, problems, crashes = run.collect()
    return docs, problems, crashes, run.interrupted, run.not_started


def _check_scratch(out_dir: Path, count: int) -> None:
    """The scratch paths must have the type this run gives them, checked before anything moves or starts; an
    earlier run's stop file is removed."""
    stop_file = out_dir / JOBS_DIR / STOP_FILE
    scratch = out_dir / JOBS_DIR
    require(not scratch.exists() or scratch.is_dir(),
            f"--out {out_dir}: {scratch} exists and is not a directory: the jobs write there; move it away")
    require(not stop_file.is_dir() or stop_file.is_symlink(),
            f"--out {out_dir}: {stop_file} is a directory: the jobs' stop signal is a file there; move it away")
    for i in range(count):
        folder = job_dir(out_dir, i)
        require(not folder.exists() or folder.is_dir(),
                f"--out {out_dir}: {folder} exists and is not a directory: job {i} writes there; move it away")
    if stop_file.exists() or stop_file.is_symlink():
        stop_file.unlink()  # an earlier run's


@dataclass(frozen=True)
class _JobSpec:
    """One job to start: its command, environment, folder and plan (written to ``plan_file`` at its start)."""

    cmd: List[str]
    env: Dict[str, str]
    folder: Path
    plan: RunPlan
    plan_file: Path


def _job_specs(plan: RunPlan, children: Sequence[RunPlan], out_dir: Path) -> List[_JobSpec]:
    """The jobs' specs, each job's folder emptied; with several GPUs, job ``i`` sees GPU ``i mod count``."""
    gpus = visible_gpus() if plan.device == "cuda" else []
    specs = []
    for i, child in enumerate(children):
        folder = job_dir(out_dir, i)
        if folder.exists():
            shutil.rmtree(folder)  # a job folder is this run's scratch; the merged outputs are the record
        env = dict(os.environ)
        if len(gpus) > 1:
            env["CUDA_VISIBLE_DEVICES"] = gpus[i % len(gpus)]
        plan_file = folder / PLAN_FILE
        cmd = [sys.executable, "-m", "kvfence", "fuzz", "--plan", str(plan_file)]
        specs.append(_JobSpec(cmd, env, folder, child, plan_file))
    return specs


#: One started job: its process, folder and open log.
_Proc = Tuple["subprocess.Popen[bytes]", Path, IO[str]]


class _JobsRun:
    """The parent's watch over its jobs (``run_jobs``): which started, which wait, what their progress says."""

    def __init__(self, plan: RunPlan, specs: List[_JobSpec], progress: Optional[Callable[[Counts], None]],
                 on_first_failure: Optional[Callable[[Dict[str, Any]], None]], lead: bool) -> None:
        out_dir = Path(plan.out)
        self.plan, self.progress, self.on_first_failure = plan, progress, on_first_failure
        self.stop_on_failure = not plan.keep_going
        self.deadline_s = jobs_deadline(plan)
        self.stop_file = out_dir / JOBS_DIR / STOP_FILE
        self.stop_path = self.stop_file if self.stop_on_failure else out_dir / JOBS_DIR / "never-stop"
        self.procs: List[_Proc] = []
        self.start = time.perf_counter()
        self.began: Dict[int, float] = {}  # job index -> when its progress file first appeared
        self.waiting = specs[1:] if lead else []
        for spec in specs[:1] if lead else specs:
            self.launch(spec)
        self.not_started = 0
        self.interrupted: Optional[str] = None
        self.overrun: List[str] = []
        self.finders_done_at: Optional[float] = None  # when every job that found a failure had ended
        self.stopped_after_failure: Set[int] = set()
        self.drawn = self.start
        self.announced = on_first_failure is None and not self.stop_on_failure

    def launch(self, spec: _JobSpec, niceness: int = 0) -> None:
        from kvfence.engine.interrupt import child_dies_with_parent

        spec.folder.mkdir(parents=True)
        write_job_file(spec.plan_file, spec.plan, spec.folder / PROGRESS_FILE, self.stop_path)
        log = open(spec.folder / "log.txt", "w")
        # A job stops (SIGTERM: its outputs written) when this process dies, even by SIGKILL: no orphans.
        orphan_guard = child_dies_with_parent(signal.SIGTERM)

        def preexec() -> None:
            if orphan_guard is not None:
                orphan_guard()
            if niceness:
                os.nice(niceness)

        self.procs.append((subprocess.Popen(spec.cmd, stdout=log, stderr=subprocess.STDOUT, env=spec.env,
                                            preexec_fn=preexec), spec.folder, log))

    def any_running(self) -> bool:
        return any(p.poll() is None for p, _, _ in self.procs)

    def poll(self) -> None:
        """One look at the jobs: their progress, a first failure, the followers' start, the budget."""
        time.sleep(FIRST_FAILURE_POLL_S if not self.announced or self.waiting else POLL_S)
        now = time.perf_counter()
        if (self.announced and self.progress is None and not self.waiting and self.deadline_s is None
                and not self.stop_on_failure):
            return  # nothing left to read the progress files for (a budget still needs them)
        docs = [_read_json(folder / PROGRESS_FILE) or {} for _, folder, _ in self.procs]
        failed = [d for d in docs if d.get("first_failure_at") is not None]
        self._on_failures(docs, failed, now)
        for i, d in enumerate(docs):
            if d and i not in self.began:
                self.began[i] = now  # its first progress: its start-up is over, its budget runs from here
        self._start_followers(bool(failed), now)
        if self.progress is not None and now - self.drawn >= POLL_S:
            self.drawn = now
            self.progress(_Summed(docs, now - self.start))
        if self.deadline_s is not None:
            self._stop_overruns(self.deadline_s, now)

    def _on_failures(self, docs: List[Dict[str, Any]], failed: List[Dict[str, Any]], now: float) -> None:
        """The first failure announced (and the stop file written); once every job that found one has ended,
        the others stopped after ``AFTER_FAILURE_GRACE_S``."""
        if not self.announced and failed:
            self.announced = True
            if self.stop_on_failure:
                casefile.atomic_write_text(self.stop_file, "a job found a failure\n")
            if self.on_first_failure is not None:
                self.on_first_failure(min(failed, key=lambda d: d["first_failure_at"]))
        if self.stop_on_failure and failed and not self.stopped_after_failure:
            finders = [i for i, d in enumerate(docs) if d.get("first_failure_at") is not None]
            if all(self.procs[i][0].poll() is not None for i in finders):
                self.finders_done_at = self.finders_done_at or now
                rest = {i for i, (p, _, _) in enumerate(self.procs) if p.poll() is None}
                if rest and now - self.finders_done_at >= AFTER_FAILURE_GRACE_S:
                    self.stopped_after_failure = rest
                    _stop(self.procs, rest, signal.SIGTERM)

    def _start_followers(self, failed: bool, now: float) -> None:
        """The jobs held back for the lead: dropped when they would only start up and stop, started after the
        lead's head start (or its end, or ``LEAD_WAIT_S``)."""
        if not self.waiting:
            return
        left = budget_left(self.plan.max_seconds)
        if (self.stop_on_failure and failed) or (left is not None and left < FOLLOWER_MIN_LEFT_S):
            self.not_started, self.waiting = len(self.waiting), []  # they would only start up and stop
        elif (now - self.began.get(0, now) >= LEAD_HEAD_START_S or self.procs[0][0].poll() is not None
              or now - self.start >= LEAD_WAIT_S):
            for spec in self.waiting:
                self.launch(spec, FOLLOWER_NICENESS)
            self.waiting = []

    def _stop_overruns(self, deadline_s: float, now: float) -> None:
        """Stop and name the jobs running past the budget and its grace. A job's budget counts from its first
        progress (start-up on a loaded machine is not its budget); one that never reported counts from the run's
        start."""
        began, start = self.began, self.start
        late = [i for i, (p, _, _) in enumerate(self.procs)
                if p.poll() is None and now - began.get(i, start) > deadline_s + JOB_OVERRUN_GRACE_S]
        if late:
            killed = set(_stop(self.procs, set(late), signal.SIGTERM))
            self.overrun += [f"job {i} was still running {now - began.get(i, start):.0f} s into a run budgeted "
                             f"{deadline_s:g} s (+{JOB_OVERRUN_GRACE_S:g} s grace"
                             f"{', counted from its first progress' if i in began else ''}): "
                             f"{'killed' if i in killed else 'stopped'} (log: {self.procs[i][1] / 'log.txt'})"
                             for i in late]
        if self.waiting and now - start > deadline_s + JOB_OVERRUN_GRACE_S:
            self.not_started, self.waiting = self.not_started + len(self.waiting), []

    def stop_on_signal(self, signal_name: Optional[str]) -> None:
        """Every job ends the way one fuzz process does on a signal (summary, reports and the failure so
        far written); the parent then merges what they wrote, like a finished run."""
        self.interrupted = signal_name
        self.not_started = len(self.waiting)
        # A Ctrl-C in a terminal reaches the jobs too (one process group): give them a moment to stop on
        # their own, since a second signal would cut their own summary short. Then signal the rest.
        grace = time.monotonic() + GRACE_S
        while time.monotonic() < grace and self.any_running():
            time.sleep(0.1)
        # Then ask the rest (SIGINT), and kill what still runs after STOP_WAIT_S (a hung or stopped job):
        # a Ctrl-C ends the run within GRACE_S + STOP_WAIT_S, with what the jobs wrote.
        killed = _stop(self.procs, set(range(len(self.procs))), signal.SIGINT)
        self.overrun += [f"job {i} did not stop within {GRACE_S + STOP_WAIT_S:g} s of the signal: killed "
                         f"(log: {self.procs[i][1] / 'log.txt'})" for i in killed]

    def collect(self) -> Tuple[List[Dict[str, Any]], List[str], List[Crash]]:
        """The jobs' summaries, the problem lines, and the ``CRASH`` records recovered from dead jobs' journals."""
        from kvfence.engine.journal import recover

        docs: List[Dict[str, Any]] = []
        problems, crashes = list(self.overrun), []
        for i, (p, folder, _) in enumerate(self.procs):
            doc = _read_json(folder / "summary.json")
            # -SIGINT: a job that had already written its summary got the forwarded SIGINT while it was
            # exiting (past its own handler), so Python died of it: still a job we stopped, not a dead one.
            if self.interrupted and doc is not None and p.returncode in (0, 1, 130, 143, -signal.SIGINT):
                docs.append(doc)  # stopped by the signal we forwarded: a partial run, not a dead job
                continue
            if i in self.stopped_after_failure and doc is not None and p.returncode in (0, 1, 143, -signal.SIGTERM):
                docs.append(doc)  # stopped once another job's failure was written: what it checked still counts
                continue
            if p.returncode not in (0, 1) or doc is None:
                tail = (folder / "log.txt").read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                problems.append(f"job {i} ended with exit code {p.returncode}: {tail[0]} (log: {folder / 'log.txt'})")
                crashes += recover(folder, report=problems.append)
            if doc is not None:
                docs.append(doc)
        return docs, problems, crashes


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        doc: dict[str, Any] = json.loads(Path(path).read_text())  # the jobs' own files: a JSON object
        return doc
    except (OSError, ValueError):
        return None


def adopt_case_files(docs: List[dict[str, Any]], out_dir: Path) -> Dict[str, str]:
    """Copy every case file the jobs wrote into ``OUT/cases`` and point the summaries at the copies.

    Case files are named by content hash, so two jobs that shrank to the same case share one file.
    Returns ``{old path: new path}``.
    """
    moved: Dict[str, str] = {}
    target = Path(out_dir) / casefile.CASES_DIR
    for doc in docs:
        for old in list(doc.get("cases", {})):
            src = Path(old)
            if not src.is_file():
                continue
            target.mkdir(parents=True, exist_ok=True)
            dst = target / src.name
            if not dst.exists():
                shutil.copyfile(src, dst)
            moved[old] = str(dst)
        doc["cases"] = {moved.get(k, k): dict(v, path=moved.get(k, k),
                                              repro=casefile.record_repro_command(moved.get(k, k), v))
                        for k, v in doc.get("cases", {}).items()}
        for f in doc.get("findings", []):
            f["case"] = moved.get(f.get("case"), f.get("case"))
    return moved


def write_job_file(path: Path, plan: RunPlan, progress_file: Path, stop_file: Path) -> None:
    """A ``--jobs`` child's plan as data, with the files it reports progress to and stops at."""
    path.write_text(json.dumps({"plan": plan.to_dict(), "progress_file": str(progress_file),
                                "stop_file": str(stop_file)}))


def read_job_file(path: str) -> Tuple[RunPlan, Path, Path]:
    """``(plan, progress file, stop file)`` of a ``--jobs`` child (``BadInput`` on anything malformed)."""
    data = casefile.parse_json_file(path, "job plan")
    if not isinstance(data, dict) or not isinstance(data.get("plan"), dict):
        raise BadInput(f"job plan {path}: expected an object with a plan")
    return RunPlan.from_dict(data["plan"]), Path(data["progress_file"]), Path(data["stop_file"])
