"""CPU before/after: ``interpreter.py`` and ``campaign_overhead.py`` on two checkouts, in alternating rounds.

    python benchmarks/before_after.py --before DIR --after DIR [--rounds 6] [--json PATH]

Each DIR is a checkout with its own environment in ``DIR/.venv`` where kvfence is installed from DIR (editable),
so each side runs its own package and its own copy of the two scripts with the same command lines:

    git worktree add /tmp/before c7ded67 && cp -a .venv /tmp/before/
    /tmp/before/.venv/bin/python -m pip install --no-deps -e /tmp/before

On a machine shared with other work, which side runs first moves a round's figures more than the code does,
so odd rounds run the before side first and even rounds the after side. Reported per measure: each side's
median over the rounds, and the median, lowest and highest per-round ratio after/before of a rate (above 1:
the after side is faster in that round). Every raw results file is kept in the output, its ``code`` stamp
naming the commit that side ran.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvfence.provenance import stamped

SIDES = ("before", "after")
#: Each script with its arguments (both sides the same), and the file's measures: name -> path of keys.
SCRIPTS = {
    "interpreter": ["benchmarks/interpreter.py", "--examples", "200"],
    "campaign": ["benchmarks/campaign_overhead.py", "--examples", "1000", "--repeat", "3"],
}
#: Measures that are not rates: lower is better, so no after/before ratio is formed.
SHARES = ("interpreter: kvfence share of the profile (%)",)
RUN_TIMEOUT_S = 1200


def fail(message: str, code: int) -> None:
    print(f"before_after: error: {message}", file=sys.stderr)
    sys.exit(code)


def python_of(side: str, folder: Path) -> Path:
    python = folder / ".venv" / "bin" / "python"
    if not (folder / "benchmarks" / "interpreter.py").is_file() or not python.is_file():
        fail(f"--{side} {folder}: not a kvfence checkout with its own .venv (see this script's docstring)", 2)
    return python


def measures(results: dict) -> dict:
    """The figures of one side's two results files, by measure name."""
    interp = results["interpreter"]
    out = {"interpreter, overflow checks skipped (cases/s)": interp["overflow_checks_skipped"]["cases_per_s"],
           "interpreter, Triton's default (cases/s)": interp["triton_default"]["cases_per_s"],
           SHARES[0]: interp["profile_share_percent"]["kvfence"]}
    for row in results["campaign"]["rows"]:
        target = "on" if row["targeting"] else "off"
        out[f"stub loop, {row['variant']}, target {target} (cases per CPU s)"] = row["cases_per_cpu_s_median"]
    return out


def run_side(side: str, folder: Path, python: Path, label: str) -> dict:
    results = {}
    for name, command in SCRIPTS.items():
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / f"{name}.json"
            start = time.monotonic()
            done = subprocess.run([str(python), *command, "--json", str(out)], cwd=folder, capture_output=True,
                                  text=True, timeout=RUN_TIMEOUT_S)
            if done.returncode != 0 or not out.is_file():
                tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
                fail(f"{label} {side}: {' '.join(command)} exited {done.returncode}: {tail}", 3)
            results[name] = json.loads(out.read_text())
        print(f"{label} {side}: {name} done in {time.monotonic() - start:.0f} s", flush=True)
    return results


def summary(rounds: list) -> dict:
    figures = {side: [measures(r[side]) for r in rounds] for side in SIDES}
    out = {}
    for name in figures["before"][0]:
        before = [f[name] for f in figures["before"]]
        after = [f[name] for f in figures["after"]]
        row = {"before_median": statistics.median(before), "after_median": statistics.median(after),
               "before": before, "after": after}
        if name not in SHARES:
            ratios = [a / b for a, b in zip(after, before)]
            row.update(ratio_median=round(statistics.median(ratios), 3), ratio_min=round(min(ratios), 3),
                       ratio_max=round(max(ratios), 3), after_faster_rounds=sum(r > 1 for r in ratios))
        out[name] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.rounds < 1:
        fail(f"--rounds must be at least 1, got {args.rounds}", 2)
    folders = {"before": args.before.resolve(), "after": args.after.resolve()}
    pythons = {side: python_of(side, folder) for side, folder in folders.items()}
    rounds = []
    for number in range(1, args.rounds + 1):
        order = SIDES if number % 2 else SIDES[::-1]
        label = f"round {number}/{args.rounds}"
        rounds.append({"order": list(order), **{side: run_side(side, folders[side], pythons[side], label)
                                                 for side in order}})
    table = summary(rounds)
    for name, row in table.items():
        ratio = (f"  after/before median {row['ratio_median']} ({row['ratio_min']}-{row['ratio_max']}, "
                 f"after faster in {row['after_faster_rounds']}/{len(rounds)})" if "ratio_median" in row else "")
        print(f"{name}: before {row['before_median']}, after {row['after_median']}{ratio}")
    out = {"summary": table, "rounds": rounds,
           "sides": {side: rounds[0][side]["interpreter"].get("code") for side in SIDES},
           "command": "python benchmarks/before_after.py " + " ".join(sys.argv[1:])}
    if args.json:
        args.json.write_text(json.dumps(stamped(out), indent=2) + "\n")


if __name__ == "__main__":
    main()
