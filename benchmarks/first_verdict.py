"""The first verdict against the floor: how long a user waits for ``kvfence fuzz`` to name a bug.

    python benchmarks/first_verdict.py [--device cuda|cpu] [--repeats 3] [--json FILE] [-- FUZZ FLAGS...]

In one run, on one machine:

* the floor: wall time of ``python -c "import torch; torch.zeros(1, device='cuda')"`` (Python, torch and a
  CUDA context: what any process that launches a kernel pays; ``device='cpu'`` with ``--device cpu``);
* the first verdict: wall time from starting ``python -m kvfence fuzz --sizing prefix`` (the seed's bug,
  found within a job's first few examples) to the line on stderr that names the first failure
  (``kvfence.commands.fuzz.FIRST_FAILURE``), and to the command's exit; the run summary's ``startup_s``,
  ``first_launch_s`` and ``first_failure_s`` with it, and with ``--jobs`` each job's ``startup_s``
  (``jobs_ready_s``, job 0 first: it leads on CUDA), and of the job that failed first its examples to the
  failure and its compile and capture seconds (``first_failing_job_*``).

Each is measured ``--repeats`` times after ``--warmup`` unmeasured runs (a warm Triton disk cache, as a
user's second run has); the medians give ``first_verdict_over_floor``. Flags after ``--`` go to the fuzz
command (e.g. ``-- --max-examples 5`` for a quick CPU check).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import fuzz_command_parser, saver  # noqa: E402

from kvfence.commands.fuzz import FIRST_FAILURE  # noqa: E402


def floor_seconds(device: str) -> float:
    """Wall time of a bare Python that imports torch and touches the device."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import torch; torch.zeros(1, device={device!r})"], check=True)
    return time.perf_counter() - start


def verdict_run(device: str, extra, out_dir: Path) -> dict:
    """One ``kvfence fuzz --sizing prefix`` run: seconds to the first-failure line and to the exit."""
    cmd = [sys.executable, "-m", "kvfence", "fuzz", "--sizing", "prefix", "--device", device, "--out", str(out_dir),
           *extra]
    env = dict(os.environ)
    env.pop("KVFENCE_COMMAND_START", None)  # the fuzz command's own start, not this script's
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    verdict, lines = None, []
    for line in proc.stderr:
        lines.append(line.rstrip())
        if verdict is None and line.startswith(FIRST_FAILURE):
            verdict = time.perf_counter() - start
    code = proc.wait()
    total = time.perf_counter() - start
    summary = json.loads((out_dir / "summary.json").read_text()) if (out_dir / "summary.json").exists() else {}
    if verdict is None:
        raise SystemExit(f"first_verdict: no '{FIRST_FAILURE}' line (exit {code}): {' | '.join(lines[-3:])}")
    # --jobs: when each job's worker was ready (job 0 leads on CUDA; kvfence.workflow.jobs), and how many
    # jobs the parent did not start.
    job_summaries = sorted((out_dir / "jobs").glob("job-*/summary.json"), key=lambda p: int(p.parent.name[4:]))
    jobs = [json.loads(p.read_text()) for p in job_summaries]
    # Where a slow verdict's time went: which job failed first, after how many examples, and what that job
    # spent compiling and capturing (the seed is random per run, as a user's is).
    failed = [j for j in jobs if j.get("first_failure_s") is not None]
    first = min(failed, key=lambda j: j["first_failure_s"]) if failed else summary
    return {"first_verdict_s": round(verdict, 3), "wall_s": round(total, 3), "exit": code,
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
    args = parser.parse_args(argv)
    result = {"benchmark": "first_verdict", "device": args.device, "fuzz_flags": extra, "floor_s": [], "runs": []}
    save = saver(args.json, result)
    with tempfile.TemporaryDirectory(prefix="kvfence-first-verdict-") as tmp:
        for i in range(args.warmup):
            verdict_run(args.device, extra, Path(tmp) / f"warmup-{i}")
            floor_seconds(args.device)
        for i in range(args.repeats):  # interleaved, so both see the same machine load
            result["floor_s"].append(round(floor_seconds(args.device), 3))
            result["runs"].append(verdict_run(args.device, extra, Path(tmp) / f"run-{i}"))
            save()
    floor = statistics.median(result["floor_s"])
    verdict = statistics.median(r["first_verdict_s"] for r in result["runs"])
    result.update(floor_median_s=round(floor, 3), first_verdict_median_s=round(verdict, 3),
                  first_verdict_over_floor=round(verdict / floor, 3))
    save()
    print(f"floor {floor:.2f}s, first verdict {verdict:.2f}s: first_verdict_over_floor "
          f"{result['first_verdict_over_floor']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
