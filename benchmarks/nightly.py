"""The nightly profile, end to end: is the sweep green on a correct kernel and red on a buggy one?

Runs two sweeps of the reference kernel (eager mode, caching allocator off under the tools):

1. ``--sizing safe``: must exit 0 (no canary finding, no tool finding, no tool error);
2. ``--sizing prefix --matrix``: must exit 1 with canary findings *and* memcheck findings; it also runs
   the detection matrix (``kvfence.sanitizer.matrix``).

and writes one JSON (``--json``) with ``safe_exit``, ``prefix_exit``, ``wall_s`` and ``detection_matrix``,
plus what each sweep found. Exit 0 when both verdicts are as expected, 1 otherwise, 2 on bad input.
Needs a GPU and compute-sanitizer (``bash benchmarks/gpu.sh nightly`` runs it on the H200).

    python benchmarks/nightly.py --out reports/out/nightly --json benchmarks/results/h200_nightly.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from kvfence.provenance import stamped

ROOT = Path(__file__).resolve().parents[1]


def sweep(out: Path, sizing: str, args, extra=()) -> dict:
    cmd = [sys.executable, "-m", "kvfence", "sweep", "--sizing", sizing, "--mode", "eager", "--max-examples",
           str(args.max_examples), "--jobs", str(args.jobs), "--seed", str(args.seed), "--max-failing",
           str(args.max_failing), "--sample", str(args.sample), "--timeout", str(args.timeout), "--out", str(out),
           *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (out.parent / f"{out.name}.stderr.txt").write_text(proc.stderr)
    doc = {}
    if (out / "sweep.json").is_file():
        doc = json.loads((out / "sweep.json").read_text())
    per_tool = doc.get("per_tool", {})
    return {"command": " ".join(cmd[1:]), "exit": proc.returncode, "wall_s": round(wall, 1),
            "stderr_tail": proc.stderr.strip().splitlines()[-3:],
            "explored": doc.get("explored"), "failing": doc.get("failing"),
            "canary_cases_with_findings": doc.get("canary_cases_with_findings"),
            "baseline_errors": doc.get("baseline_errors"),
            "per_tool": per_tool, "detection_matrix": doc.get("detection_matrix")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="reports/out/nightly", help="folder for both sweeps' outputs")
    p.add_argument("--json", required=True, help="where the nightly summary goes")
    p.add_argument("--max-examples", type=int, default=300)
    p.add_argument("--max-failing", type=int, default=5)
    p.add_argument("--sample", type=int, default=2)
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not Path(args.json).parent.is_dir():
        print(f"nightly: error: --json {args.json}: folder does not exist", file=sys.stderr)
        return 2

    t0 = time.perf_counter()
    safe = sweep(out / "safe", "safe", args)
    prefix = sweep(out / "prefix", "prefix", args, extra=("--matrix",))
    wall = time.perf_counter() - t0
    memcheck = prefix["per_tool"].get("memcheck", {})
    checks = {
        "safe exits 0": safe["exit"] == 0,
        "prefix exits 1": prefix["exit"] == 1,
        "prefix has canary findings": bool(prefix["canary_cases_with_findings"]),
        "prefix has memcheck findings": bool(memcheck.get("cases_with_findings")),
    }
    doc = {"safe_exit": safe["exit"], "prefix_exit": prefix["exit"], "wall_s": round(wall, 1),
           "detection_matrix": prefix.pop("detection_matrix"), "checks": checks,
           "safe": {k: v for k, v in safe.items() if k != "detection_matrix"}, "prefix": prefix}
    Path(args.json).write_text(json.dumps(stamped(doc), indent=2) + "\n")
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    print(f"nightly: safe exit {safe['exit']} ({safe['wall_s']} s), "
          f"prefix exit {prefix['exit']} ({prefix['wall_s']} s), "
          f"{wall:.0f} s in all; wrote {args.json}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
