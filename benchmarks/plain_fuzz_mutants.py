"""Does the plain command find each shipped mutant? ``kvfence fuzz --kernel MUTANT`` under many seeds.

    python benchmarks/plain_fuzz_mutants.py [--device cuda] [--seeds 20] [--only NAME ...] [--parallel N]
        [--cores-per-run C] [--gpus 0,1,...] [--reference-seeds K] [--max-seconds S] [--json FILE]
        [--resume FILE] [--compare-bulk N] [-- EXTRA FUZZ FLAGS]

For every planted bug of the draft kernel's contracts (``CONTRACTS``: each record's ``mutants``,
``kernels/draft/mutants/``), or those named with ``--only``, and every seed, it runs the command a user
would run, ``python -m kvfence fuzz --device D --kernel mutant:NAME`` (a patch or kernel mutant, built as
``kvfence mutants`` builds it) or ``--sizing SPEC`` with the reference kernel (a sizing mutant: its
``sizing``), with the default budget of the device and ``--shrink-seconds 0`` (the first failure is the
detection; shrinking would only add time). A mutant's run is stopped at its first failure, once every job it
started has written its summary (``run_end``: what it does after, its jobs' reports and the merge, measures
nothing; ``--run-to-exit`` lets it end on its own), and recorded from those summaries merged as the run merges
them (``stopped_at_failure`` lists those seeds). A seed counts as a detection when the run found findings that
name one of the mutant's ``detects`` kinds (``names_the_bug``, as ``kvfence mutants`` counts:
``kvfence.selftest.mutants``) and exited 1 or was stopped at its first failure. Window-rail mutants get
``--contract window-rail --window 4`` (the command needs the window, part of the rail's ABI; see ``RAIL_FLAGS``
for why 4). The reference kernel runs the same command under ``--reference-seeds`` seeds for each contract a
mutant breaks, to its end, and must stay clean (exit 0). The result per mutant: seeds detected, the rate against
``--required`` (0.95), the seconds from each command's start to its first failure (the run's
``first_failure_s``), the search time (that less the start-up to the first worker ready, the summary's
``startup_s``: ``search_s``, median and worst per row, a miss counted as its whole wall time), each run's
wall time, the first failing job's examples to its failure and work (``examples_to_failure``,
``failing_job_work``), and the command. ``kill_search_s`` tabulates the search times per mutant against the kill
targets (median <= 3 s, worst <= 10 s). The default runs without the bulk generator; ``--compare-bulk N``
runs every mutant and seed a second time with ``--bulk-per-example N`` (rows ``NAME [--bulk-per-example N]``,
the bulk opened after the default ``--bulk-after``), so ``kill_search_s`` also holds each mutant's search
times with the bulk on and whether it was slower so (``bulk_slower``: a higher median), and
``bulk_comparison`` counts the mutants the bulk made slower and faster.

``--parallel N`` runs N commands at once, each on its own GPU (``CUDA_VISIBLE_DEVICES``, ``--gpus``) and
its own ``--cores-per-run`` CPU cores (default: the cores this process may use, split N ways; whole
physical cores, the GPU's NUMA node first where the machine says which), so on an 8-GPU node with 128
cores each run sees what a one-GPU box with 16 cores gives it: kvfence's default ``--jobs`` follows the
cores it may run on. Reference runs (the longest: the whole default budget) start first, then every
mutant's seed 0, then seed 1, and so on; the ``--json`` file is rewritten after every run, so a cut
(``--max-seconds``: no run starts after it; a signal) leaves every mutant with about as many seeds: rates
of each row are over the seeds that ran (``seeds_run``; ``min_seeds_run``, ``cut``), while the file's
``passed`` needs every planned run done (``complete``): a cut run with no failing row so far says
INCOMPLETE and exits 3.

``--gpus 0,0,0,0`` may name one GPU more than once: those runs share it (a one-GPU machine running
several commands at once, each on its own cores; the file's ``slots`` say so). ``--resume FILE``
continues a cut results file of the same plan (device, seeds, mutants, reference seeds, extra flags)
where it stopped: only the runs it lacks start (a run the cut stopped starts again), the file is
rewritten in place, and ``sessions`` lists each command with its wall time, so a plan longer than one
sitting is measured over several and still lands in one file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run_end  # noqa: E402
from machine import gpu_local_cpus, physical_order  # noqa: E402
from result_file import first_failing, fuzz_command_parser, job_summaries, saver  # noqa: E402

from kvfence.engine import registry  # noqa: E402
from kvfence.errors import BadInput, require  # noqa: E402
from kvfence.provenance import code_stamp  # noqa: E402

#: The contracts of the draft kernel: their planted bugs (each record's ``mutants``) are kernels/draft/mutants/.
CONTRACTS = ("draft", "window-rail")
#: The reference rows' name: ``reference (CONTRACT)``.
REFERENCE = "reference"

#: A run past this many seconds is stopped and counted as a miss (a default GPU run ends after 60 s of
#: fuzzing, plus start-up and reports; the CPU's 100 examples take about as long).
RUN_TIMEOUT_S = 240.0
#: The rail's window on the plain command line (``kvfence fuzz --contract window-rail`` needs one). Four,
#: because the rail's paths split at the draft depth: a window longer than the chain (``n < w``) clips the
#: prefix (``rail_prefix_from_start``), one shorter (``n > w``) starts inside the chain
#: (``rail_chain_from_zero``); with the usual 1-5 steps and deeper ones both occur. A window of 64 (or a
#: production one) is longer than every chain of 16 steps: the chain path is never drawn.
RAIL_FLAGS = ["--contract", "window-rail", "--window", "4"]


#: The fuzz flags that choose each contract of ``CONTRACTS`` (the draft is the default contract).
CONTRACT_FLAGS = {"draft": [], "window-rail": RAIL_FLAGS}


@dataclass(frozen=True)
class Planted:
    """One planted bug (``kvfence.contract.Mutant``) of the contract it breaks."""

    name: str
    contract: str
    domain: str  # where the default draws must reach it
    detects: tuple  # the finding kinds that count as catching it
    kernel: str  # the --kernel spec: ``mutant:NAME`` (a patch or kernel of its own), or the reference
    sizing: Optional[str] = None  # the buggy sizing it runs under (a sizing mutant), or None: the default

    @property
    def kind(self) -> str:
        return "sizing" if self.kernel == REFERENCE else "kernel"


def discover(names: Optional[List[str]] = None) -> List[Planted]:
    """The planted bugs of ``CONTRACTS`` (sorted by name), or only ``names``; ``BadInput`` naming the known ones."""
    found = {}
    for contract in CONTRACTS:
        for m in registry.get(contract).mutants:
            found[m.name] = Planted(m.name, contract, m.domain, tuple(m.detects),
                                    f"mutant:{m.name}" if (m.patch or m.kernel) else REFERENCE, m.sizing)
    unknown = [n for n in names or () if n not in found]
    require(not unknown, f"unknown mutant(s) {', '.join(unknown)}: choose from {', '.join(sorted(found))}")
    return [found[n] for n in names] if names else [found[n] for n in sorted(found)]


def names_the_bug(kinds, detects) -> bool:
    """Whether a failure's finding kinds detect a mutant: one of the kinds it declares (the reference declares
    none, and fails on any finding)."""
    return bool(kinds) and (not detects or bool(set(kinds) & set(detects)))


def flags_for(mutant: Planted) -> list:
    flags = (["--kernel", mutant.kernel] if mutant.kernel != REFERENCE else []) + (
        ["--sizing", mutant.sizing] if mutant.sizing else [])
    return flags + CONTRACT_FLAGS[mutant.contract]


@dataclass
class Run:
    """One command: a mutant's (or the reference's) fuzz run under one seed."""

    row: str
    seed: int
    argv: List[str]
    out: Path
    detects: tuple = ()
    reference: bool = False
    proc: Optional[subprocess.Popen] = None
    slot: int = -1
    started: float = 0.0
    stop_at_failure: bool = False  # stopped once its first failure is written (``run_end``), not left to exit
    interrupted: bool = False  # asked to stop (SIGINT) after its first failure, another job still running
    at_failure: Optional[dict] = None  # what ``record`` reads, once written at the first failure

    @property
    def stderr(self) -> Path:
        return self.out.with_name(self.out.name + ".stderr")


# -- where each run may run -------------------------------------------------------------------------
def _gpu_count() -> Optional[int]:
    """GPUs ``nvidia-smi -L`` lists (the benchmark itself never creates a CUDA context), None if it cannot say."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(line.startswith("GPU ") for line in out.splitlines())


def slots(parallel: int, cores_per_run: Optional[int], gpus: Optional[List[int]], device: str) -> List[dict]:
    """``parallel`` slots, each ``{"gpu": i or None, "cpus": [...]}``: disjoint cores, one GPU each."""
    usable = sorted(os.sched_getaffinity(0))
    per_run = cores_per_run or len(usable) // parallel
    require(per_run >= 1 and per_run * parallel <= len(usable),
            f"--parallel {parallel} x --cores-per-run {per_run} needs {parallel * max(per_run, 1)} cores; this process "
            f"may use {len(usable)}")
    ordered = physical_order(usable)
    chunks = [ordered[i * per_run:(i + 1) * per_run] for i in range(parallel)]
    if device != "cuda":
        return [{"gpu": None, "cpus": sorted(c)} for c in chunks]
    gpus = gpus if gpus is not None else list(range(parallel))
    require(len(gpus) == parallel, f"--gpus names {len(gpus)} GPUs for --parallel {parallel} (one per run; "
                                   f"naming one twice makes those runs share it)")
    present = _gpu_count()
    require(present is None or max(gpus) < present,
            f"--parallel {parallel} / --gpus {','.join(map(str, gpus))}: this machine has {present} GPU(s)")
    local = gpu_local_cpus(gpus)
    out = []
    for gpu in gpus:  # each run's GPU takes the free chunk with most of its NUMA node's cores
        best = max(range(len(chunks)), key=lambda i: len(set(chunks[i]) & local.get(gpu, set())))
        out.append({"gpu": gpu, "cpus": sorted(chunks.pop(best))})
    return out


def _start(run: Run, slot: dict, index: int) -> None:
    env = dict(os.environ)
    if slot["gpu"] is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(slot["gpu"])
    cpus = slot["cpus"]
    run.slot, run.started = index, time.monotonic()
    # Its own session (a cut stops the run and every job it started) on its own cores, which its jobs inherit.
    with open(run.stderr, "w") as err:
        run.proc = subprocess.Popen(run.argv, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True,
                                    preexec_fn=lambda: os.sched_setaffinity(0, cpus))


#: Seconds between looks at the runs (their exit, their first failure).
POLL_S = 0.1


def written_at_failure(run: Run) -> bool:
    """Whether ``run`` is past its first failure with what ``record`` reads written (kept in ``run.at_failure``);
    a run whose failing job is done while another is still searching is asked to stop (``run_end``)."""
    if not run_end.announced(run.stderr):
        return False
    run.at_failure, finder_done = run_end.failure_written(run.out)
    if run.at_failure is None and finder_done and not run.interrupted:
        run_end.interrupt(run.proc)
        run.interrupted = True
    return run.at_failure is not None


def ended(run: Run, run_timeout: float) -> Tuple[bool, Optional[int]]:
    """``(over, exit code)`` of ``run``: over when it exited, or was stopped here (exit code None) at its first
    failure (``written_at_failure``) or past ``run_timeout`` seconds (a miss)."""
    code = run.proc.poll()
    if code is not None:
        return True, code
    if (run.stop_at_failure and written_at_failure(run)) or time.monotonic() - run.started > run_timeout:
        _stop(run)
        return True, None
    return False, None


def _stop(run: Run) -> None:
    try:
        os.killpg(run.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    run.proc.wait()


# -- results ------------------------------------------------------------------------------------------
def _row(result: dict, run: Run) -> dict:
    return (result["reference"] if run.reference else result["mutants"])[run.row]


#: What a detecting run records of its first failing job's summary (``failing_job_work``): compiles and their
#: seconds, the seconds building configs' buffers, graph captures and their seconds.
FAILING_JOB_WORK = ("compiles", "compile_s", "runner_s", "captures", "capture_s")


def record(result: dict, run: Run, returncode: Optional[int], wall_s: float) -> None:
    """One finished (or stopped: ``returncode`` None) run into its row: its summary, or for a run stopped at its
    first failure what was written then (``run.at_failure``)."""
    row = _row(result, run)
    summary = run.out / "summary.json"
    doc = run.at_failure or (json.loads(summary.read_text()) if summary.exists() else {})
    at_failure = run.at_failure is not None or run.interrupted
    kinds = sorted({f["kind"] for f in doc.get("findings", [])})
    row["seeds_run"].append(run.seed)
    row["exit_codes"].append(returncode)
    row["wall_s"].append(round(wall_s, 2))
    row["kinds"] = sorted(set(row["kinds"]) | set(kinds))
    last_error = ((run.stderr.read_text(errors="replace").strip().splitlines() or [""])[-1]
                  if run.stderr.exists() else "")
    if run.reference:
        row["clean"] = row["clean"] is not False and returncode == 0 and not kinds
        row["passed"] = row["clean"]
        if not (returncode == 0 and not kinds):
            row["problems"].append({"seed": run.seed, "exit": returncode, "kinds": kinds, "stderr": last_error})
        return
    found = (returncode == 1 or at_failure) and names_the_bug(kinds, run.detects)
    if at_failure:
        row.setdefault("stopped_at_failure", []).append(run.seed)
    row["first_failure_s"].append(doc.get("first_failure_s") if found else None)
    # Where a slow kill's time went: the first failing job's examples to its failure (many: the draws were
    # slow to reach the bug; few: its examples were slow) and what its checking session spent on the way.
    first = first_failing(job_summaries(run.out), doc) if found else None
    row.setdefault("examples_to_failure", []).append(first.get("examples_to_failure") if first else None)
    row.setdefault("failing_job_work", []).append(
        {k: first.get(k) for k in FAILING_JOB_WORK} if first else None)
    # Search time: the first failure less the start-up (the first worker ready), as kill times are counted.
    startup = doc.get("startup_s")
    row.setdefault("search_s", []).append(
        round(doc["first_failure_s"] - startup, 3) if found and startup is not None else None)
    if found:
        row["detected_seeds"].append(run.seed)
    else:
        row["misses"].append({"seed": run.seed, "exit": returncode, "kinds": kinds, "stderr": last_error})
    times = [t for t in row["first_failure_s"] if t is not None]
    row["detected"] = len(row["detected_seeds"])
    row["rate"] = round(row["detected"] / len(row["seeds_run"]), 3)
    row["median_first_failure_s"] = round(statistics.median(times), 2) if times else None
    row["worst_first_failure_s"] = round(max(times), 2) if times else None
    # A miss counts as the run's whole wall time (a lower bound of its search time): the worst is never flattered.
    search = [t if t is not None else w for t, w in zip(row["search_s"], row["wall_s"])]
    row["median_search_s"] = round(statistics.median(search), 2) if search else None
    row["worst_search_s"] = round(max(search), 2) if search else None
    row["passed"] = row["rate"] >= result["required"]


def bulk_flags(compare_bulk: Optional[int]) -> List[str]:
    """``--compare-bulk N``'s fuzz flags: each mutant's row again with the bulk on, a row of its own."""
    return ["--bulk-per-example", str(compare_bulk)] if compare_bulk else []


def bulk_suffix(compare_bulk: Optional[int]) -> str:
    """The name suffix of ``--compare-bulk N``'s rows (``NAME [--bulk-per-example N]``)."""
    return f" [{' '.join(bulk_flags(compare_bulk))}]" if compare_bulk else ""


def variants(compare_bulk: Optional[int]) -> List[tuple]:
    """``(row suffix, extra flags)`` of each way a mutant is run: the plain command, and with the bulk on."""
    return [("", [])] + ([(bulk_suffix(compare_bulk), bulk_flags(compare_bulk))] if compare_bulk else [])


def plan(mutants, seeds: int, reference_seeds: int, device: str, extra: List[str], tmp: Path, result: dict,
         compare_bulk: Optional[int] = None):
    """Every run, in the order they start (reference runs first, then seed-major), and their rows; a row
    already in ``result`` (``--resume``) keeps what it has and gets only the seeds it has not run."""
    base = [sys.executable, "-m", "kvfence", "fuzz", "--device", device]
    runs: List[Run] = []

    def command(flags, seed, out):
        return base + flags + ["--seed", str(seed), "--shrink-seconds", "0", "--quiet", "--out", str(out), *extra]

    def text(flags):  # a row's command, its seed and output folder as placeholders
        return shlex.join(["python", *command(flags, "SEED", "OUT")[1:]])

    for contract in sorted({m.contract for m in mutants}):
        name, flags = f"{REFERENCE} ({contract})", CONTRACT_FLAGS[contract]
        done = set(result["reference"].get(name, {}).get("seeds_run", []))
        for seed in range(reference_seeds):
            out = tmp / f"{REFERENCE}-{contract}-{seed}"
            if seed not in done:
                runs.append(Run(name, seed, command(flags, seed, out), out, reference=True))
        if reference_seeds and name not in result["reference"]:
            result["reference"][name] = {"flags": flags, "seeds_run": [], "exit_codes": [], "wall_s": [],
                                         "kinds": [], "clean": None, "passed": False, "problems": [],
                                         "command": text(flags)}
    ways = variants(compare_bulk)
    for m in mutants:
        for suffix, more in ways:
            if m.name + suffix in result["mutants"]:
                continue
            result["mutants"][m.name + suffix] = {
                "kind": m.kind, "domain": m.domain, "contract": m.contract, "flags": flags_for(m) + more,
                "detects": list(m.detects), "seeds": seeds, "seeds_run": [], "detected_seeds": [], "detected": 0,
                "rate": 0.0, "passed": False, "median_first_failure_s": None, "worst_first_failure_s": None,
                "median_search_s": None, "worst_search_s": None, "first_failure_s": [], "search_s": [],
                "wall_s": [], "exit_codes": [], "kinds": [], "misses": [], "command": text(flags_for(m) + more)}
    for seed in range(seeds):
        for suffix, more in ways:
            for m in mutants:
                out = tmp / f"{m.name}{'-bulk-on' if suffix else ''}-{seed}"
                if seed in result["mutants"][m.name + suffix]["seeds_run"]:
                    continue
                runs.append(Run(m.name + suffix, seed, command(flags_for(m) + more, seed, out), out,
                                detects=m.detects))
    return runs


#: Kill-time targets (the plain default command on the GPU): median and worst search seconds per mutant.
KILL_MEDIAN_S, KILL_WORST_S = 3.0, 10.0


def kill_table(result: dict) -> dict:
    """Per mutant, the median and worst search time of the plain command (and, with ``--compare-bulk N``,
    of the same with the bulk on): ``kill_search_s``, with whether the targets hold."""
    table = {}
    suffix = bulk_suffix(result.get("compare_bulk"))
    for name, row in result["mutants"].items():
        if suffix and name.endswith(suffix):
            continue
        entry = {"median": row["median_search_s"], "worst": row["worst_search_s"], "seeds": len(row["seeds_run"]),
                 "detected": row["detected"]}
        on = result["mutants"].get(name + suffix) if suffix else None
        if on is not None:
            entry.update(median_bulk_on=on["median_search_s"], worst_bulk_on=on["worst_search_s"])
            entry["bulk_slower"] = (None if entry["median"] is None or on["median_search_s"] is None
                                    else on["median_search_s"] > entry["median"])
        entry["meets_targets"] = (entry["median"] is not None and entry["median"] <= KILL_MEDIAN_S
                                  and entry["worst"] <= KILL_WORST_S)
        table[name] = entry
    return table


#: Exit code of a run whose plan is not all run (cut) and has no failing row so far.
INCOMPLETE = 3

#: What a ``--resume`` file must share with the command that continues it.
PLAN_KEYS = ("benchmark", "device", "seeds", "reference_seeds", "required", "compare_bulk", "extra")


def resumed(path: str, fresh: dict, mutants) -> dict:
    """The results file ``path`` to continue, checked against this command's plan ``fresh``: the runs
    it has stay, the cut is undone (only the seeds it lacks will run)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"--resume {path}: not a readable results file ({exc.__class__.__name__})") from None
    require(isinstance(doc, dict) and isinstance(doc.get("mutants"), dict) and isinstance(doc.get("reference"), dict),
            f"--resume {path}: not a plain_fuzz_mutants results file")
    for key in PLAN_KEYS:
        require(doc.get(key) == fresh[key], f"--resume {path}: its {key} is {doc.get(key)!r}, this command's "
                                            f"{fresh[key]!r}")
    names = sorted(m.name for m in mutants)
    require(sorted(doc["mutants"]) == names, f"--resume {path}: it holds other mutants than this command's --only")
    # One file, one code: a cut file of other code is measured again, not continued (its figures would mix two).
    code = doc.get("code") or {}
    require(code.get("digest") == code_stamp()["digest"],
            f"--resume {path}: written by other code (commit {str(code.get('commit'))[:9]}): measure again "
            f"without --resume")
    if "sessions" not in doc:  # written before sessions were kept: its own command is the first
        doc["sessions"] = [{"command": doc.get("command"), "parallel": doc.get("parallel"), "slots": doc.get("slots"),
                            "wall_s": doc.get("wall_s", 0.0), "cut": doc.get("cut", False)}]
    doc["cut"], doc["stopped"] = False, []
    return doc


def _arguments() -> Tuple[argparse.Namespace, list]:
    """The command line: the fuzz command's flags and this benchmark's own; returns ``(args, extra)``."""
    parser, argv, extra = fuzz_command_parser(__doc__, sys.argv[1:])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--required", type=float, default=0.95)
    parser.add_argument("--parallel", type=int, default=1, help="commands at once, one GPU and its own cores each")
    parser.add_argument("--cores-per-run", type=int, default=None)
    parser.add_argument("--gpus", default=None, help="comma-separated GPU indices (default 0..N-1)")
    parser.add_argument("--reference-seeds", type=int, default=2)
    parser.add_argument("--max-seconds", type=float, default=None, help="start no run after this many seconds")
    parser.add_argument("--run-timeout", type=float, default=RUN_TIMEOUT_S)
    parser.add_argument("--run-to-exit", action="store_true",
                        help="let each mutant's run end on its own, not at its first failure (the docstring)")
    parser.add_argument("--compare-bulk", type=int, default=None, metavar="N",
                        help="run every mutant and seed again with --bulk-per-example N (rows NAME "
                             "[--bulk-per-example N]): the bulk on beside the default, off")
    parser.add_argument("--resume", default=None, metavar="FILE",
                        help="continue this cut results file of the same plan (rewritten in place)")
    return parser.parse_args(argv), extra


def _results_file(args: argparse.Namespace, extra: list) -> Tuple[dict, List[dict], List[Planted]]:
    """The arguments checked, the slots laid out, the mutants found: ``(result, layout, mutants)``, the result
    that of ``--resume``'s file when given (``BadInput`` or ``ValueError`` on bad input)."""
    require(args.seeds >= 1 and args.parallel >= 1 and args.reference_seeds >= 0, "--seeds and --parallel must be "
                                                                                     ">= 1, --reference-seeds >= 0")
    require(args.compare_bulk is None or args.compare_bulk >= 1,
            f"--compare-bulk {args.compare_bulk}: expected the bulk to compare, N >= 1 batches per example")
    gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
    layout = slots(args.parallel, args.cores_per_run, gpus, args.device)
    mutants = discover(names=args.only or None)
    result = {"benchmark": "plain_fuzz_mutants", "command": shlex.join(["python", *sys.argv]),
              "device": args.device, "seeds": args.seeds, "reference_seeds": args.reference_seeds,
              "required": args.required, "compare_bulk": args.compare_bulk, "parallel": args.parallel,
              "slots": layout, "extra": extra,
              "cut": False, "stopped": [], "wall_s": 0.0, "reference": {}, "mutants": {}}
    if args.resume:
        result = resumed(args.resume, result, mutants)
        args.json = args.json or args.resume
    return result, layout, mutants


def main() -> int:
    args, extra = _arguments()
    try:
        result, layout, mutants = _results_file(args, extra)
    except Exception as exc:  # BadInput, a malformed --gpus or --resume file: one line, exit 2
        print(f"plain_fuzz_mutants: {exc}", file=sys.stderr)
        return 2
    start = time.monotonic()
    earlier_wall = result["wall_s"]
    session = {"command": shlex.join(["python", *sys.argv]), "parallel": args.parallel, "slots": layout,
               "wall_s": 0.0, "cut": False}
    result.setdefault("sessions", []).append(session)

    def clock() -> None:
        """This sitting's wall time so far, and the file's over every sitting."""
        session["wall_s"] = round(time.monotonic() - start, 1)
        result["wall_s"] = round(earlier_wall + session["wall_s"], 1)

    save = saver(args.json, result)
    for i, slot in enumerate(layout):
        print(f"slot {i}: gpu {slot['gpu']}, cores {slot['cpus'][0]}..{slot['cpus'][-1]} ({len(slot['cpus'])})",
              flush=True)
    with tempfile.TemporaryDirectory(prefix="kvfence-plain-mutants-") as tmp:
        pending = plan(mutants, args.seeds, args.reference_seeds, args.device, extra, Path(tmp), result,
                       args.compare_bulk)
        for run in pending:  # a reference run has no failure to stop at: it runs its whole budget
            run.stop_at_failure = not (run.reference or args.run_to_exit)
        running: List[Run] = []

        def finish(run: Run, returncode: Optional[int]) -> None:
            running.remove(run)
            record(result, run, returncode, time.monotonic() - run.started)
            clock()
            save()
            row = _row(result, run)
            what = ("clean" if row["clean"] else "NOT CLEAN") if run.reference else (
                "DETECTED" if run.seed in row["detected_seeds"] else "miss")
            print(f"{run.row:32s} seed {run.seed:2d}  {what:8s} exit {returncode}  {row['wall_s'][-1]:6.1f} s",
                  flush=True)

        def cut():
            """Stop every run in flight: not counted (a run the cut stopped says nothing of the mutant)."""
            result["cut"] = session["cut"] = True
            for run in list(running):
                _stop(run)
                running.remove(run)
                result["stopped"].append({"row": run.row, "seed": run.seed})
            pending.clear()
            save()

        def terminated(signum, frame):  # ``timeout``'s SIGTERM: stop as on ^C, then write the totals
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, terminated)
        try:
            while pending or running:
                late = args.max_seconds is not None and time.monotonic() - start > args.max_seconds
                if late and pending:
                    result["cut"] = session["cut"] = True
                    pending.clear()
                busy = {r.slot for r in running}
                free = [i for i in range(len(layout)) if i not in busy]
                while free and pending:
                    run, i = pending.pop(0), free.pop(0)
                    _start(run, layout[i], i)
                    running.append(run)
                for run in list(running):
                    over, code = ended(run, args.run_timeout)
                    if over:
                        finish(run, code)
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            cut()
    _totals(result, args)
    clock()
    save()
    return _report(result, args)


def _totals(result: dict, args: argparse.Namespace) -> None:
    """The run's totals into ``result``: seeds run, whether it is complete and passed, the kill-time table."""
    rows = list(result["mutants"].values())
    # Rows' rates are over the seeds that ran; the whole passes only with every planned run done.
    result["min_seeds_run"] = min((len(r["seeds_run"]) for r in rows), default=0)
    result["complete"] = (result["min_seeds_run"] == args.seeds and
                          all(len(r["seeds_run"]) == args.reference_seeds for r in result["reference"].values()))
    result["passed"] = (result["complete"] and all(r["passed"] for r in rows)
                        and all(r["passed"] for r in result["reference"].values()))
    result["kill_search_s"] = kill_table(result)
    result["kill_targets_met"] = result["complete"] and all(e["meets_targets"]
                                                            for e in result["kill_search_s"].values())
    if args.compare_bulk:
        compared = [e for e in result["kill_search_s"].values() if e.get("bulk_slower") is not None]
        result["bulk_comparison"] = {"flags": bulk_flags(args.compare_bulk), "mutants": len(compared),
                                     "slower_with_bulk": sum(e["bulk_slower"] for e in compared),
                                     "faster_with_bulk": sum(e["median_bulk_on"] < e["median"] for e in compared)}


def _report(result: dict, args: argparse.Namespace) -> int:
    """Print each row and the verdict; returns the exit code (0 PASS, 1 FAIL, ``INCOMPLETE``)."""
    rows = list(result["mutants"].values())
    for name, r in result["mutants"].items():
        print(f"{name:56s} {r['detected']:3d}/{len(r['seeds_run'])}  search median {r['median_search_s']} s, "
              f"worst {r['worst_search_s']} s  kinds {','.join(r['kinds']) or '-'}")
    for name, r in result["reference"].items():
        verdict = {True: "clean", False: "NOT CLEAN", None: "not run"}[r["clean"]]
        print(f"{name:32s} {verdict} in {len(r['seeds_run'])} seed(s)")
    failing = sum(not r["passed"] for r in rows) + sum(not r["passed"] for r in result["reference"].values())
    verdict = "PASS" if result["passed"] else ("FAIL" if failing else "INCOMPLETE")
    print(verdict, f"({sum(r['passed'] for r in rows)}/{len(rows)} mutants in >= {args.required:.0%} of the seeds "
                   f"they ran, at least {result['min_seeds_run']} of {args.seeds} seeds each; {result['wall_s']} s"
                   f"{'; cut: --resume the file to run the rest' if not result['complete'] else ''})")
    return {"PASS": 0, "FAIL": 1, "INCOMPLETE": INCOMPLETE}[verdict]



if __name__ == "__main__":
    sys.exit(main())
