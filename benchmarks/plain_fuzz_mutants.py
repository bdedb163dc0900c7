"""Does the plain command find each shipped mutant? ``kvfence fuzz --kernel MUTANT`` under many seeds.

    python benchmarks/plain_fuzz_mutants.py [--device cuda] [--seeds 20] [--only NAME ...] [--json FILE]
        [-- EXTRA FUZZ FLAGS]

For every mutant of ``kernels/mutants/`` (or those named with ``--only``) and every seed, it runs the
command a user would run, ``python -m kvfence fuzz --device D --kernel FILE:ATTR`` (a kernel mutant,
built as ``kvfence mutants`` builds it) or ``--sizing FILE:row_width`` (a sizing mutant), with the
default budget of the device and ``--shrink-seconds 0`` (the first failure is the detection; shrinking
would only add time). A seed counts as a detection when the run exits 1 with findings that name the
mutant's ``DETECTS`` kinds (read from its file as data); a mutant file without ``DETECTS`` needs a
finding other than ``HANG``, ``CRASH`` or ``LAUNCH_ERROR`` (what a slow or broken machine gives). Window-rail
mutants get ``--contract window-rail --window 64`` (the rail's window is part of its ABI). The result
per mutant: seeds detected, the rate against ``--required`` (0.95), and the seconds to the first failure.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from result_file import fuzz_command_parser, saver  # noqa: E402

from kvfence.workflow.mutants import discover  # noqa: E402


#: Kinds that say the machine, not the planted bug, ended the launch.
NOT_THE_BUG = {"HANG", "CRASH", "LAUNCH_ERROR"}


def detects(mutant):
    """The mutant file's ``DETECTS`` tuple (a literal, read without importing the file), or None."""
    for node in ast.parse(Path(mutant.path).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DETECTS" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return None


def is_detection(kinds: set, wanted) -> bool:
    return wanted <= kinds if wanted else bool(kinds - NOT_THE_BUG)


def flags_for(mutant) -> list:
    flags = ["--kernel", mutant.kernel] if mutant.kind == "kernel" else ["--sizing", mutant.sizing]
    if mutant.contract == "window-rail":
        flags += ["--contract", "window-rail", "--window", "64"]
    return flags


def main() -> int:
    parser, argv, extra = fuzz_command_parser(__doc__, sys.argv[1:])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--required", type=float, default=0.95)
    args = parser.parse_args(argv)
    result = {"benchmark": "plain_fuzz_mutants", "device": args.device, "seeds": args.seeds, "extra": extra,
              "mutants": {}}
    save = saver(args.json, result)
    with tempfile.TemporaryDirectory(prefix="kvfence-plain-mutants-") as tmp:
        for m in discover(names=args.only or None):
            wanted = detects(m)
            row = result["mutants"][m.name] = {"flags": flags_for(m), "detects": sorted(wanted or []), "detected": 0,
                                               "first_failure_s": [], "kinds": [], "exit_codes": []}
            for seed in range(args.seeds):
                out = Path(tmp) / f"{m.name}-{seed}"
                cmd = [sys.executable, "-m", "kvfence", "fuzz", "--device", args.device, *row["flags"],
                       "--seed", str(seed), "--shrink-seconds", "0", "--quiet", "--out", str(out), *extra]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                row["exit_codes"].append(proc.returncode)
                summary = out / "summary.json"
                doc = json.loads(summary.read_text()) if summary.exists() else {}
                kinds = {f["kind"] for f in doc.get("findings", [])}
                row["kinds"] = sorted(set(row["kinds"]) | kinds)
                if proc.returncode == 1 and is_detection(kinds, wanted):
                    row["detected"] += 1
                    row["first_failure_s"].append(doc.get("first_failure_s"))
                save()
            row["rate"] = row["detected"] / args.seeds
            row["passed"] = row["rate"] >= args.required
            print(f"{m.name:30s} {row['detected']:3d}/{args.seeds}  kinds {','.join(row['kinds']) or '-'}", flush=True)
            save()
    result["passed"] = all(r["passed"] for r in result["mutants"].values())
    save()
    print("PASS" if result["passed"] else "FAIL", f"({sum(r['passed'] for r in result['mutants'].values())}/"
          f"{len(result['mutants'])} mutants in >= {args.required:.0%} of {args.seeds} seeds)")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
