"""Kill time of every contract's planted bugs, the first verdict and the two verifiers: one command, one file.

    python benchmarks/kill_time.py --device cuda --part all --budget S --resume [--json FILE]
    python benchmarks/kill_time.py --device cuda --part NAME [--json FILE] [--resume] [--seeds 10]
        [--reference-seeds 1] [--only CONTRACT.NAME ...] [--parallel N] [--gpus 0,0,...] [--max-seconds S]
        [--run-timeout S] [--run-to-exit] [--repeats 3] [-- FUZZ FLAGS]

``--part all --budget S`` runs, within ``S`` seconds, every part not yet complete that fits (``next_part``: first
the parts a cut would lose, the first verdict and the two verifier parts, each only with its ``WHOLE_PART_S``
left; then the plain parts, the last one cut where the budget ends and resumed by the next call: ``--resume`` is
implied), so the same command run again on the same code completes the file; the parts that are not plain
compile into a Triton cache of their own (``WHOLE_PART_TRITON_CACHE``), so running them first never warms the
plain runs' kernels. ``--part NAME`` runs one part (``PARTS``). Every part writes its section of the one results
file (``--json``, default ``benchmarks/results/DEVICE_kill_time.json``, rewritten with the totals after the part):

* a plain part (``draft``, ``pages``, ``r2t-slot``, ``fa3-rail``, ``dsv4``): ``benchmarks/plain_fuzz_mutants.py``
  over its contracts' shipped mutants, the release-text ones included (rows ``CONTRACT.NAME``: names repeat across
  contracts), ``--seeds`` seeds each, the reference of each contract ``--reference-seeds`` times: the plain
  ``kvfence fuzz`` a user runs per mutant and seed, the search time (first failure less the first worker
  ready); on CUDA 8 runs share the GPU, 2 cores and ``--jobs 2 --max-seconds 15 --max-gpu-mem 10G`` each (the
  protocol of the recorded ``h200_kill_time.json``), and no run starts after ``--max-seconds`` (480); a mutant's
  run is stopped once its first failure is written (``run_end``; ``--run-to-exit`` lets it end on its own);
* ``first-verdict``: ``benchmarks/first_verdict.py`` (``--repeats`` runs of ``fuzz --sizing prefix`` against the
  device floor, after a warm-up run to its end; each measured run stopped at its verdict);
* ``verifiers-0-4``, ``verifiers-5-9``: ``kvfence mutants --verifiers both --max-examples 2 --seed S``, the five
  seeds side by side (one thread each), each seed's report kept.

``--resume`` continues the file's part where a cut left it (the plain runs it lacks, the seeds not yet run) and
skips a part already complete; the file must be of this code (a file of other code is measured again, not
continued: its figures would mix two). The totals: ``kill_search_s`` (every plain part's rows: median and worst
search seconds against the targets, ``KILL_MEDIAN_S`` and ``KILL_WORST_S``), ``kill_targets`` (met, missed, and
which), ``first_verdict_over_floor`` (target ``FIRST_VERDICT_TARGET``), ``verifiers`` (each seed passed or not),
``complete`` (every part run to its end), and ``kill_where`` (per plain row, the medians of its search seconds,
of the first failing job's examples to the failure and of that job's compile, build and capture seconds).

The release-text mutants are built from SGLang's wheels (0.5.23 and 0.5.3.post3): the command's environment must
reach them (``KVFENCE_WHEEL_DIR``, or a ``KVFENCE_CACHE`` filled where the network is by
``kvfence mutants --contract C --device cpu --max-examples 1`` per contract). On the CPU with tiny settings (what
``tests/test_kill_time.py`` runs):

    python benchmarks/kill_time.py --device cpu --part r2t-slot --seeds 1 --reference-seeds 1 \\
        --only slot-mapping.tail_starts_one_late --json OUT.json -- --max-examples 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import first_verdict  # noqa: E402
import plain_fuzz_mutants as plain  # noqa: E402
from result_file import saver  # noqa: E402

from kvfence.engine import registry  # noqa: E402
from kvfence.errors import BadInput, require  # noqa: E402
from kvfence.provenance import code_stamp  # noqa: E402

#: Each part: its kind and what it covers (a plain part: its contracts; a verifiers part: its seeds). Sized from
#: the H200 file of the draft's 31 mutants (8 runs sharing the GPU, about 12.6 s a run run to its end: 310 runs in
#: 490 s): a plain part of up to 27 mutants x 10 seeds and a reference run per contract fits a 560 s cap.
PARTS = {
    "draft": ("plain", ("draft",)),
    "pages": ("plain", ("flashmla-page-table", "trtllm-mha-page-table")),
    "r2t-slot": ("plain", ("req-to-token", "slot-mapping")),
    "fa3-rail": ("plain", ("fa3-decode-metadata", "window-rail")),
    "dsv4": ("plain", ("dsv4-topk-indices",)),
    "first-verdict": ("first-verdict", ()),
    "verifiers-0-4": ("verifiers", (0, 1, 2, 3, 4)),
    "verifiers-5-9": ("verifiers", (5, 6, 7, 8, 9)),
}
#: The fuzz flags of every plain run on CUDA, 8 runs sharing one GPU (``h200_kill_time.json``'s protocol).
CUDA_FUZZ_FLAGS = ["--jobs", "2", "--max-seconds", "15", "--max-gpu-mem", "10G"]
CUDA_PARALLEL = 8
#: The first verdict's target over the floor (the issue's).
FIRST_VERDICT_TARGET = 1.3
#: Exit code of a part cut before its end (run it again with ``--resume``).
INCOMPLETE = plain.INCOMPLETE


def contract_flags(contract: str) -> List[str]:
    """The fuzz flags that choose ``contract`` (the draft is the default contract; the rail needs its window)."""
    if contract == "draft":
        return []
    return plain.RAIL_FLAGS if contract == "window-rail" else ["--contract", contract]


def planted(contracts, names: Optional[List[str]] = None) -> List[plain.Planted]:
    """The shipped mutants of ``contracts`` as rows ``CONTRACT.NAME`` (sorted), or only ``names``."""
    found = {}
    for contract in contracts:
        for m in registry.get(contract).mutants:
            row = f"{contract}.{m.name}"
            found[row] = plain.Planted(row, contract, m.domain, tuple(m.detects),
                                       f"mutant:{m.name}" if (m.patch or m.kernel) else plain.REFERENCE, m.sizing)
    unknown = [n for n in names or () if n not in found]
    require(not unknown, f"unknown mutant(s) {', '.join(unknown)} of {', '.join(contracts)}: choose from "
                         f"{', '.join(sorted(found))}")
    return [found[n] for n in names] if names else [found[n] for n in sorted(found)]


# -- the parts ------------------------------------------------------------------------------------------
def run_plain(args, contracts, extra: List[str], before: Optional[dict], work: Path) -> dict:
    """``plain_fuzz_mutants.py``'s plan over ``contracts`` (its resume of ``before``, the part's section so far)."""
    plain.CONTRACTS = tuple(contracts)
    plain.CONTRACT_FLAGS = {c: contract_flags(c) for c in contracts}
    plain.discover = lambda names=None: planted(contracts, names)
    part_file = work / "plain.json"
    cuda = args.device == "cuda"
    parallel = args.parallel or (CUDA_PARALLEL if cuda else 1)
    argv = ["--device", args.device, "--seeds", str(args.seeds), "--reference-seeds", str(args.reference_seeds),
            "--parallel", str(parallel), "--run-timeout", str(args.run_timeout), "--json", str(part_file)]
    if cuda:
        argv += ["--gpus", args.gpus or ",".join(["0"] * parallel)]
    if args.max_seconds is not None:
        argv += ["--max-seconds", str(args.max_seconds)]
    if args.only:
        argv += ["--only", *args.only]
    if args.run_to_exit:
        argv += ["--run-to-exit"]
    if before is not None:
        part_file.write_text(json.dumps(before))
        argv += ["--resume", str(part_file)]
    sys.argv = ["benchmarks/kill_time.py", *argv, "--", *extra]
    code = plain.main()
    if code == 2:  # bad input (a --resume of another plan): plain_fuzz_mutants said so in one line
        return None
    require(part_file.exists(), f"part {args.part}: plain_fuzz_mutants wrote no results (exit {code})")
    doc = json.loads(part_file.read_text())
    doc["exit"] = code
    return doc


def run_first_verdict(args, extra: List[str], before: Optional[dict], work: Path) -> dict:
    part_file = work / "first_verdict.json"
    sys.argv = ["benchmarks/kill_time.py", "--device", args.device, "--repeats", str(args.repeats),
                "--json", str(part_file), *(["--run-to-exit"] if args.run_to_exit else []), "--", *extra]
    error = None
    try:
        code = first_verdict.main()
    except KeyboardInterrupt:  # cut: the runs measured so far (first_verdict.py saves after each)
        code = None
    except SystemExit as exc:  # a run without its first-failure line: first_verdict.py says so in one line
        code, error = None, str(exc.code)
        print(f"kill_time: first-verdict: {error}", file=sys.stderr)
    doc = json.loads(part_file.read_text()) if part_file.exists() else {"runs": []}
    if error:
        doc["error"] = error
    doc.update(exit=code, complete=code == 0 and len(doc["runs"]) == args.repeats,
               meets_target=doc.get("first_verdict_over_floor") is not None
               and doc["first_verdict_over_floor"] <= FIRST_VERDICT_TARGET)
    return doc


def run_verifiers(args, seeds, extra: List[str], before: Optional[dict], work: Path) -> dict:
    """Each seed's ``mutants --verifiers both`` side by side; a seed already in ``before`` is not run again."""
    doc = before or {"seeds": {}}
    todo = [s for s in seeds if str(s) not in doc["seeds"]]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = {}
    for s in todo:
        out = work / f"verifiers{s}.json"
        cmd = [sys.executable, "-m", "kvfence", "mutants", "--device", args.device, "--verifiers", "both",
               "--max-examples", "2", "--seed", str(s), "--quiet", "--json", str(out), *extra]
        procs[s] = (subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env),
                    out, time.monotonic())
    try:
        for s, (proc, out, started) in procs.items():
            _, err = proc.communicate()
            if out.exists():
                report = json.loads(out.read_text())
                doc["seeds"][str(s)] = dict(report, exit=proc.returncode, wall_s=round(time.monotonic() - started, 1))
            else:
                print(f"kill_time: verifiers seed {s}: no report (exit {proc.returncode}): "
                      f"{(err.strip().splitlines() or [''])[-1]}", file=sys.stderr)
    except KeyboardInterrupt:  # timeout's SIGTERM: stop every seed still running, keep the finished ones
        for proc, _, _ in procs.values():
            proc.kill()
    doc["complete"] = all(str(s) in doc["seeds"] for s in seeds)
    doc["command"] = shlex.join(["python", "-m", "kvfence", "mutants", "--device", args.device, "--verifiers",
                                 "both", "--max-examples", "2", "--seed", "S", *extra])
    return doc


# -- the file ---------------------------------------------------------------------------------------------
def _opened(path: Path, device: str, resume: bool) -> dict:
    """The results file to add a part to: this code's file at ``path`` (with ``--resume``, or to add another
    part), else a fresh one."""
    fresh = {"benchmark": "kill_time", "device": device, "parts": {}}
    if not path.exists():
        return fresh
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"--json {path}: not a readable results file ({exc.__class__.__name__})") from None
    require(isinstance(doc, dict) and doc.get("benchmark") == "kill_time" and isinstance(doc.get("parts"), dict),
            f"--json {path}: not a kill_time results file")
    require(doc.get("device") == device, f"--json {path}: its device is {doc.get('device')}, this command's {device}")
    code = doc.get("code") or {}
    if code.get("digest") != code_stamp()["digest"]:
        if resume:
            print(f"kill_time: {path} was written by other code (commit {str(code.get('commit'))[:9]}): measured "
                  "again from the start", file=sys.stderr)
        return fresh
    return doc


def _median(values) -> Optional[float]:
    known = sorted(v for v in values if v is not None)
    return round(statistics.median(known), 3) if known else None


def where(row: dict) -> dict:
    """Where a plain row's kills spent their time, medians over its detecting seeds: the search seconds, the first
    failing job's examples to the failure (many: draws that do not reach the bug) and its compile, build and
    capture seconds (most of the search: slow examples)."""
    work = [w for w in row.get("failing_job_work", []) if w]
    return {"search_s": _median(row.get("search_s", [])),
            "examples_to_failure": _median(row.get("examples_to_failure", [])),
            **{k: _median(w.get(k) for w in work) for k in plain.FAILING_JOB_WORK}}


def totals(doc: dict) -> None:
    """The file's totals over the parts it holds (the module docstring)."""
    kill, spent, complete = {}, {}, True
    for name, (kind, _) in PARTS.items():
        part = doc["parts"].get(name)
        complete = complete and part is not None and bool(part.get("complete"))
        if part is not None and kind == "plain":
            kill.update(part.get("kill_search_s", {}))
            spent.update({row: where(r) for row, r in part.get("mutants", {}).items()})
    doc["kill_search_s"] = kill
    doc["kill_where"] = spent
    missed = sorted(n for n, e in kill.items() if not e["meets_targets"])
    doc["kill_targets"] = {"median_s": plain.KILL_MEDIAN_S, "worst_s": plain.KILL_WORST_S, "mutants": len(kill),
                           "met": len(kill) - len(missed), "missed": missed}
    verdict = doc["parts"].get("first-verdict") or {}
    doc["first_verdict_over_floor"] = verdict.get("first_verdict_over_floor")
    doc["first_verdict_target"] = FIRST_VERDICT_TARGET
    seeds = {}
    for name, (kind, _) in PARTS.items():
        if kind == "verifiers" and name in doc["parts"]:
            seeds.update({s: r.get("passed") for s, r in doc["parts"][name]["seeds"].items()})
    doc["verifiers"] = dict(sorted(seeds.items(), key=lambda kv: int(kv[0])))
    doc["complete"] = complete


#: ``--part all``: the order parts are taken in, the ones a cut loses first (each starts only with its
#: ``WHOLE_PART_S`` left in ``--budget``), then the plain parts, which a cut keeps and the next call resumes, filling
#: what is left.
ALL_ORDER = ("first-verdict", "verifiers-0-4", "verifiers-5-9", "draft", "pages", "r2t-slot", "fa3-rail", "dsv4")
#: Seconds a part that a cut loses needs, from the recorded GPU files: the first verdict's warm-up run to its end
#: (12.6-20.8 s), four floors (about 5 s each) and three runs stopped at their verdict (7-14.5 s, then the
#: Ctrl-C's summaries: h200_first_verdict.json), about 80 s; five verifier seeds side by side, 310 s for seeds 0-4
#: on cec8e46 (BENCHMARKS.md's verifier row). Each with a margin: another GPU or code may be slower.
WHOLE_PART_S = {"first-verdict": 120.0, "verifiers": 360.0}
#: A plain part starts with at least ``PLAIN_MIN_S`` of the budget left and starts no run in its last
#: ``PLAIN_TAIL_S`` (a run is stopped at ``--run-timeout``, 40 s, and the part then writes its file).
PLAIN_MIN_S, PLAIN_TAIL_S = 90.0, 50.0


def next_part(doc: dict, left: float, tried) -> Optional[tuple]:
    """``--part all``: the next part to run with ``left`` seconds of the budget, ``(name, max_seconds)`` (a plain
    part's last start; None for a part that is not cut), or None when no part that is not complete and not in
    ``tried`` fits."""
    for name in ALL_ORDER:
        kind = PARTS[name][0]
        if name in tried or (doc["parts"].get(name) or {}).get("complete"):
            continue
        if kind == "plain" and left >= PLAIN_MIN_S:
            return name, left - PLAIN_TAIL_S
        if kind != "plain" and left >= WHOLE_PART_S[kind]:
            return name, None
    return None


def _arguments(own: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--part", required=True, choices=[*PARTS, "all"])
    parser.add_argument("--budget", type=float, default=None,
                        help="--part all: seconds this command may take (the parts that fit it, in ALL_ORDER)")
    parser.add_argument("--json", default=None, help="the results file (default benchmarks/results/"
                                                     "DEVICE_kill_time.json)")
    parser.add_argument("--resume", action="store_true", help="continue the file's part, skip it when complete")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--reference-seeds", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, metavar="CONTRACT.NAME")
    parser.add_argument("--parallel", type=int, default=None, help="runs at once (default 8 on CUDA, 1 on the CPU)")
    parser.add_argument("--gpus", default=None, help="comma-separated GPU per run (default: all on GPU 0)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="start no plain run after this many seconds (default 480 on CUDA)")
    parser.add_argument("--run-timeout", type=float, default=40.0)
    parser.add_argument("--run-to-exit", action="store_true",
                        help="plain parts: let each mutant's run end on its own, not at its first failure")
    parser.add_argument("--repeats", type=int, default=3, help="first-verdict: measured runs")
    return parser.parse_args(own)


def _checked(args, extra: List[str], path: Path) -> dict:
    """The arguments checked (``BadInput``) and the results file to add to."""
    require(args.seeds >= 1 and args.reference_seeds >= 0 and args.repeats >= 1,
            "--seeds and --repeats must be >= 1, --reference-seeds >= 0")
    every = args.part == "all"
    require(every == (args.budget is not None), "--budget goes with --part all (and --part all needs it)")
    require(not every or (not extra and not args.only and args.max_seconds is None),
            "--part all runs each part as it is planned: no fuzz flags, --only or --max-seconds")
    require(args.budget is None or args.budget > 0, "--budget must be > 0 seconds")
    kind, covers = PARTS.get(args.part, ("all", ()))
    require(not args.only or kind == "plain", f"--only names mutants of a plain part, not of {args.part}")
    if kind == "plain":
        planted(covers, args.only)
    return _opened(path, args.device, args.resume)


#: Triton's kernel cache of the first verdict and the verifier parts: a folder of their own (kept between calls on
#: one machine), so the kernels they compile (the draft's mutants among them) never warm the plain runs' cache:
#: a plain run's first seed finds only what the plain runs before it compiled, whichever order the parts run in.
WHOLE_PART_TRITON_CACHE = Path(tempfile.gettempdir()) / "kvfence-kill-time-triton"


@contextlib.contextmanager
def triton_cache(kind: str):
    """For a part that is not plain, ``TRITON_CACHE_DIR`` set to ``WHOLE_PART_TRITON_CACHE`` (restored after)."""
    before = os.environ.get("TRITON_CACHE_DIR")
    if kind != "plain":
        os.environ["TRITON_CACHE_DIR"] = str(WHOLE_PART_TRITON_CACHE)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = before


def run_part(args, name: str, extra: List[str], doc: dict, argv: List[str]) -> Optional[dict]:
    """One part run into ``doc`` (its section and the totals); the part's section, or None on bad input."""
    kind, covers = PARTS[name]
    if kind == "plain" and not extra and args.device == "cuda":
        extra = list(CUDA_FUZZ_FLAGS)
    before = doc["parts"].get(name) if args.resume else None
    with tempfile.TemporaryDirectory(prefix="kvfence-kill-time-") as tmp, triton_cache(kind):
        work = Path(tmp)
        if kind == "plain":
            part = run_plain(args, covers, extra, before, work)
        elif kind == "first-verdict":
            part = run_first_verdict(args, extra, None, work)
        else:
            part = run_verifiers(args, covers, extra, before, work)
    if part is None:
        return None
    part["part_command"] = shlex.join(["python", "benchmarks/kill_time.py", *argv])
    doc["parts"][name] = part
    totals(doc)
    return part


def part_exit(name: str, part: dict) -> int:
    """A part's exit code: ``INCOMPLETE`` when cut, 1 when it failed, else 0."""
    if not part.get("complete"):
        return INCOMPLETE
    failed = part.get("passed") is False or (PARTS[name][0] == "verifiers" and not all(
        r.get("passed") for r in part["seeds"].values()))
    return 1 if failed else 0


def _said(doc: dict, path: Path, name: str, part: dict) -> None:
    print(f"kill_time: part {name} {'complete' if part.get('complete') else 'CUT: run it again with --resume'}"
          f" in {path}; kill targets met by {doc['kill_targets']['met']}/{doc['kill_targets']['mutants']} mutants so "
          f"far; first verdict over the floor {doc['first_verdict_over_floor']}; verifiers {doc['verifiers'] or '-'}",
          flush=True)


def run_all(args, doc: dict, path: Path, save, argv: List[str], stopped: list, on_term=signal.SIG_DFL) -> int:
    """``--part all``: the parts ``next_part`` picks while the budget lasts; 0 when the file is complete and every
    part passed, 1 when one failed, ``INCOMPLETE`` when parts are left for the next call. ``on_term``, the
    SIGTERM handler (it appends to ``stopped``), is set again before each part (a plain part sets its own)."""
    start, tried, failed = time.monotonic(), set(), False
    try:
        while not stopped:
            left = args.budget - (time.monotonic() - start)
            chosen = next_part(doc, left, tried)
            if chosen is None:
                break
            name, args.max_seconds = chosen
            tried.add(name)
            print(f"kill_time: part {name} ({left:.0f} s of the budget left)", flush=True)
            signal.signal(signal.SIGTERM, on_term)
            part = run_part(args, name, [], doc, argv)
            if part is None:
                return 2
            save()
            _said(doc, path, name, part)
            failed = failed or part_exit(name, part) == 1
            if PARTS[name][0] == "plain" and not part.get("complete"):  # cut where the budget ends: resumed next
                break
    except KeyboardInterrupt:  # a signal between two parts: each part so far is saved
        pass
    left = [n for n in ALL_ORDER if not (doc["parts"].get(n) or {}).get("complete")]
    print(f"kill_time: {'every part is complete' if not left else 'left for the next call: ' + ', '.join(left)}"
          f" in {path}")
    return INCOMPLETE if left else (1 if failed else 0)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    own, extra = argv[:cut], argv[cut + 1:]
    args = _arguments(own)
    args.resume = args.resume or args.part == "all"  # --part all goes on where the file of this code stopped
    path = Path(args.json or Path(__file__).resolve().parent / "results" / f"{args.device}_kill_time.json")
    try:
        doc = _checked(args, extra, path)
    except BadInput as exc:
        print(f"kill_time: {exc}", file=sys.stderr)
        return 2
    if args.max_seconds is None and args.device == "cuda" and args.part != "all":
        args.max_seconds = 480.0
    save = saver(str(path), doc)
    stopped: list = []

    def terminated(signum, frame):  # ``timeout``'s SIGTERM: the part stops as on ^C and keeps what finished
        stopped.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminated)
    if args.part == "all":
        return run_all(args, doc, path, save, argv, stopped, terminated)
    before = doc["parts"].get(args.part) if args.resume else None
    if before is not None and before.get("complete"):
        print(f"kill_time: part {args.part} is complete in {path}: nothing to run")
        return 0
    part = run_part(args, args.part, extra, doc, argv)
    if part is None:
        return 2
    save()
    _said(doc, path, args.part, part)
    return part_exit(args.part, part)


if __name__ == "__main__":
    sys.exit(main())
