"""The first verdict against the floor: how long a user waits for ``kvfence fuzz`` to name a bug.

    python benchmarks/first_verdict.py [--device cuda|cpu] [--repeats 3] [--head-starts S,...] [--jobs-list N,...]
        [--json FILE] [-- FUZZ FLAGS...]

In one run, on one machine:

* the floor: wall time of ``python -c "import torch; torch.zeros(1, device='cuda')"`` (Python, torch and a
  CUDA context: what any process that launches a kernel pays; ``device='cpu'`` with ``--device cpu``);
* the first verdict: wall time from starting ``python -m kvfence fuzz --sizing prefix`` (the seed's bug,
  found within a job's first few examples) to the line on stderr that names the first failure
  (``kvfence.engine.fuzzrun.FIRST_FAILURE``), and to the command's exit; the run summary's ``startup_s``,
  ``first_launch_s`` and ``first_failure_s`` with it, and with ``--jobs`` each job's ``startup_s``
  (``jobs_ready_s``, job 0 first: it leads on CUDA), and of the job that failed first its examples to the
  failure and its compile and capture seconds (``first_failing_job_*``).

Each is measured ``--repeats`` times after ``--warmup`` unmeasured runs, each to its end (a warm Triton disk
cache, as a user's second run has); the medians give ``first_verdict_over_floor``. A measured run is stopped at
its first-failure line as by a Ctrl-C (``run_end.interrupt``; ``stopped_at_verdict``): its jobs and the run
still write their summaries, whose figures below are kept, and the shrinking that would follow measures
nothing here; ``--run-to-exit`` lets each end on its own (``wall_s`` is then the whole run). Flags after ``--``
go to the fuzz command (e.g. ``-- --max-examples 5`` for a quick CPU check). Every run also records what the lead
(job 0) did (``lead``: its examples, when it was ready and failed, its compiles and captures, and when each of its
first examples began and was checked, with its config: ``first_examples``), so a slow verdict shows whether
the lead was unlucky (many examples) or held up (few).

``--head-starts 0,1`` also runs the command with the lead's head start (``kvfence.engine.jobs.
LEAD_HEAD_START_S``, set in the parent process by a launcher) at each of those values, interleaved with the
default runs so every variant sees the same machine: ``by_head_start`` holds their runs and ratios, the
evidence the default was chosen on. ``--jobs-list 4,8`` likewise runs it with ``--jobs N`` added last
(``by_jobs``; it wins over a ``--jobs`` among the fuzz flags): on CUDA every job is a process with its own
context on the one GPU, and fewer contexts contend less for it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run_end  # noqa: E402
from result_file import first_failing, fuzz_command_parser, job_summaries, saver  # noqa: E402

from kvfence.engine.fuzzrun import FIRST_FAILURE  # noqa: E402
from kvfence.engine.jobs import LEAD_HEAD_START_S  # noqa: E402


def floor_seconds(device: str) -> float:
    """Wall time of a bare Python that imports torch and touches the device."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import torch; torch.zeros(1, device={device!r})"], check=True)
    return time.perf_counter() - start


#: ``python -m kvfence`` with the lead's head start set first (argv[1]): the parent is the process that reads it.
_HEAD_START_LAUNCHER = """
import sys
from kvfence.engine import jobs
jobs.LEAD_HEAD_START_S = float(sys.argv.pop(1))
from kvfence.__main__ import main
sys.exit(main(prog="python -m kvfence"))
"""

#: What a run records of the lead's (job 0's) summary.
LEAD_FIELDS = ("startup_s", "first_failure_s", "examples", "examples_to_failure", "compile_s", "compiles",
               "capture_s", "captures", "ended_by", "first_examples")


def verdict_run(device: str, extra, out_dir: Path, head_start: Optional[float] = None,
                to_exit: bool = False) -> dict:
    """One ``kvfence fuzz --sizing prefix`` run (with ``head_start``: the lead's head start set to it): seconds
    to the first-failure line and to the exit. At that line the run is stopped as by a Ctrl-C (``run_end``: its
    jobs and then the run write their summaries, whose figures are kept), not left to shrink; ``to_exit``: left
    to end on its own."""
    launcher = ["-m", "kvfence"] if head_start is None else ["-c", _HEAD_START_LAUNCHER, str(head_start)]
    cmd = [sys.executable, *launcher, "fuzz", "--sizing", "prefix", "--device", device, "--out", str(out_dir),
           *extra]
    env = dict(os.environ)
    env.pop("KVFENCE_COMMAND_START", None)  # the fuzz command's own start, not this script's
    start = time.perf_counter()
    # Its own session: the stop at the verdict reaches every job of the run and nothing else.
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    verdict, lines = None, []
    for line in proc.stderr:
        lines.append(line.rstrip())
        if verdict is None and line.startswith(FIRST_FAILURE):
            verdict = time.perf_counter() - start
            if not to_exit:
                run_end.interrupt(proc)
    code = proc.wait()
    total = time.perf_counter() - start
    summary = json.loads((out_dir / "summary.json").read_text()) if (out_dir / "summary.json").exists() else {}
    if verdict is None:
        raise SystemExit(f"first_verdict: no '{FIRST_FAILURE}' line (exit {code}): {' | '.join(lines[-3:])}")
    # --jobs: when each job's worker was ready (job 0 leads on CUDA; kvfence.engine.jobs), and how many
    # jobs the parent did not start.
    jobs = job_summaries(out_dir)
    # Where a slow verdict's time went: which job failed first, after how many examples, and what that job
    # spent compiling and capturing (the seed is random per run, as a user's is).
    first = first_failing(jobs, summary)
    return {"first_verdict_s": round(verdict, 3), "wall_s": round(total, 3), "exit": code,
            "stopped_at_verdict": not to_exit,
            "lead_head_start_s": LEAD_HEAD_START_S if head_start is None else head_start,
            "lead": {k: jobs[0].get(k) for k in LEAD_FIELDS} if jobs else None,
            **{k: summary.get(k) for k in ("seed", "startup_s", "first_launch_s", "first_failure_s", "ended_by",
                                           "jobs", "jobs_not_started")},
            "jobs_ready_s": [j.get("startup_s") for j in jobs],
            "first_failing_job": jobs.index(first) if first in jobs else None,
            **{f"first_failing_job_{k}": first.get(k) for k in ("examples_to_failure", "compile_s", "capture_s",
                                                                 "compiles", "captures")}}


def main() -> int:
    parser, argv, extra = fuzz_command_parser(__doc__, sys.argv[1:])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured runs first (Triton's disk cache)")
    parser.add_argument("--head-starts", default="",
                        help="comma-separated lead head starts (seconds) to run beside the default (docstring)")
    parser.add_argument("--jobs-list", default="",
                        help="comma-separated --jobs values to run beside the default (docstring)")
    parser.add_argument("--run-to-exit", action="store_true",
                        help="let each run end on its own, not stop it at its first verdict (the docstring)")
    args = parser.parse_args(argv)
    try:
        head_starts = [float(v) for v in args.head_starts.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--head-starts {args.head_starts!r}: expected comma-separated seconds, e.g. 0,1")
    if any(not 0 <= v < 60 for v in head_starts):
        parser.error(f"--head-starts {args.head_starts!r}: each must be 0 <= seconds < 60")
    try:
        jobs_list = [int(v) for v in args.jobs_list.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--jobs-list {args.jobs_list!r}: expected comma-separated job counts, e.g. 4,8")
    if any(n < 1 for n in jobs_list):
        parser.error(f"--jobs-list {args.jobs_list!r}: each must be >= 1")
    result = {"benchmark": "first_verdict", "device": args.device, "fuzz_flags": extra,
              "lead_head_start_s": LEAD_HEAD_START_S, "floor_s": [], "runs": []}
    # Each variant beside the default: (results key, row key, verdict_run's keywords); argparse takes the last --jobs.
    variants = ([("by_head_start", f"{v:g}", {"head_start": v}) for v in head_starts]
                + [("by_jobs", str(n), {"extra": [*extra, "--jobs", str(n)]}) for n in jobs_list])
    for group, key, _ in variants:
        result.setdefault(group, {})[key] = {"runs": []}
    save = saver(args.json, result)
    with tempfile.TemporaryDirectory(prefix="kvfence-first-verdict-") as tmp:
        for i in range(args.warmup):  # to its end, shrinking included: the cache a user's first run leaves
            verdict_run(args.device, extra, Path(tmp) / f"warmup-{i}", to_exit=True)
            floor_seconds(args.device)
        for i in range(args.repeats):  # interleaved, so every variant sees the same machine load
            result["floor_s"].append(round(floor_seconds(args.device), 3))
            result["runs"].append(verdict_run(args.device, extra, Path(tmp) / f"run-{i}", to_exit=args.run_to_exit))
            save()
            for group, key, how in variants:
                out = Path(tmp) / f"run-{i}-{group}-{key}"
                result[group][key]["runs"].append(verdict_run(args.device, how.get("extra", extra), out,
                                                              head_start=how.get("head_start"),
                                                              to_exit=args.run_to_exit))
                save()
    floor = statistics.median(result["floor_s"])
    verdict = statistics.median(r["first_verdict_s"] for r in result["runs"])
    result.update(floor_median_s=round(floor, 3), first_verdict_median_s=round(verdict, 3),
                  first_verdict_over_floor=round(verdict / floor, 3))
    for group, key, _ in variants:
        row = result[group][key]
        median = statistics.median(r["first_verdict_s"] for r in row["runs"])
        row.update(first_verdict_median_s=round(median, 3), first_verdict_over_floor=round(median / floor, 3))
        what = f"head start {key}s" if group == "by_head_start" else f"--jobs {key}"
        print(f"{what}: first verdict {median:.2f}s, over the floor {row['first_verdict_over_floor']:.2f}")
    save()
    print(f"floor {floor:.2f}s, first verdict {verdict:.2f}s (head start {LEAD_HEAD_START_S:g}s): "
          f"first_verdict_over_floor {result['first_verdict_over_floor']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
