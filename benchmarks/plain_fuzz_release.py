"""Does the plain command find a release kernel's bug? ``kvfence fuzz --contract C --kernel SPEC`` under many seeds.

Each seed runs the command as a user types it (its default budget; flags after ``--`` are added to every run), one
after another, and keeps from its summary the exit code, the examples and seconds to the first failure (from the
command's start, and from the first worker ready: the search), and the finding kinds; ``passed`` when every seed
exits 1. The kernel is named by its spec, so a release's own kernel (``vllm==0.34.0``) is measured, not a planted
copy of it.
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

from result_file import fuzz_command_parser, saver


def run_seed(contract: str, kernel: str, device: str, seed: int, extra, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="kvfence-plain-") as tmp:
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "kvfence", "fuzz", "--contract", contract, "--kernel", kernel, "--device",
               device, "--seed", str(seed), "--out", str(out), *extra]
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
        row = {"seed": seed, "exit": proc.returncode, "wall_s": round(time.monotonic() - start, 2)}
        summary = out / "summary.json"
        if summary.is_file():
            doc = json.loads(summary.read_text())
            first = doc.get("first_failure_s")
            ready = doc.get("startup_s")
            row.update(examples_to_failure=doc.get("examples_to_failure"), first_failure_s=first,
                       search_s=round(first - ready, 3) if first is not None and ready is not None else None,
                       kinds=sorted({f["kind"] for f in doc.get("findings", [])}))
        else:
            row["stderr"] = proc.stderr.strip().splitlines()[-1:] if proc.stderr else []
        return row


def main(argv=None) -> int:
    parser, own, extra = fuzz_command_parser(__doc__, sys.argv[1:] if argv is None else argv)
    parser.add_argument("--contract", required=True)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--run-timeout", type=float, default=600)
    args = parser.parse_args(own)
    result = {"contract": args.contract, "kernel": args.kernel, "device": args.device, "extra": extra, "runs": []}
    save = saver(args.json, result)
    for seed in range(args.seeds):
        row = run_seed(args.contract, args.kernel, args.device, seed, extra, args.run_timeout)
        result["runs"].append(row)
        print(json.dumps(row), flush=True)
        save()
    found = [r for r in result["runs"] if r["exit"] == 1]
    result["passed"] = len(found) == len(result["runs"])
    for key in ("examples_to_failure", "first_failure_s", "search_s"):
        values = [r[key] for r in found if r.get(key) is not None]
        if values:
            result[key] = {"median": statistics.median(values), "worst": max(values)}
    save()
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
