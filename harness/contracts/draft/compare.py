"""The two verifiers compared on dirty cases: ``python -m kvfence mutants --verifiers both``.

kvfence judges a graph-mode case on one of two paths. The **oracle path** (the CPU default) compares
every element with the plain-Python oracle (``kvfence.contracts.draft.session.host_verdict``: the engine's verdict on
the runner's tables). The **device path** (the CUDA default) runs the case through
``kvfence.contracts.draft.device_verify.DeviceVerifier`` and trusts its four counters when they are all zero;
otherwise it re-runs the case through the same full verdict, which names the findings. Whatever the device path
misses, kvfence misses on a GPU, so both paths must agree on cases that really are dirty, not only on clean ones.

For every target, the same drawn cases go through both paths, the device path as fuzzing runs it:
each drawn config brings a run of batches that ``Session.check_many`` judges in one round trip (the
first run of each target longer than ``BATCH_ROWS``, so it spans staging chunks, with a bucket first
needed after the first chunk; clean and dirty cases mixed), while the oracle path checks every case on
its own. The counters of (2) are each case's own (one case per device round trip).

* the reference kernel (``safe`` sizing; must be clean on both paths),
* every kernel and sizing mutant of ``kernels/draft/mutants/`` that breaks the draft contract (the window
  rail's are left out: its cases are judged by the host verdict on both paths; the draft kernel's §6
  mutants run here on classic configs, for the same reason),
* every planted bad write of ``kernels/draft/planted.py`` (one per region of each output buffer, one per
  kv_indptr column kind, three per input tensor), each of which must leave damage in some case.

Every target but the reference must leave damage in some case on its own domain (mutants of the §6
paths drawn with the §6 fields, as the mutation self-test draws them), or it is reported "not
exercised" and the run fails: comparing on clean cases proves nothing. On the CPU the scale mutants
(``DOMAIN = "gpu"``: bugs the interpreter's domain never reaches) are listed as not reachable there,
as the self-test lists them, and not compared. A target that found nothing in
its ``max_examples`` configs gets up to ``EXTRA_ROUNDS`` more rounds of short runs first, aimed at it
where its mutant says what reaches it (``AIM``: config pins, such as ``max_bs`` for a bug that needs 18
requests in a launch), so that the run passes or fails on what the paths say, not on whether two configs
happened to reach a rare bug.

A case agrees when (1) the device verdict (all counters zero or not) equals the oracle verdict (no finding or some), (2)
the counters that are non-zero are exactly those the oracle's findings imply (``counter_of``; when an input changed,
only the inputs counter: the verifier recomputes the write set from the inputs, so the other counters then count against
damaged inputs), and (3) the device path's findings equal the oracle path's, compared by kind, buffer, region and
element range. (1) and (2) apply where the device verifier runs (graph mode, ``need <= width``); (3) to every case. On a
case whose stores left kvfence's allocations (an ``OOB_WRITE``), input findings are not compared: where such stores land
depends on the allocator. The interpreter address audit's ``OOB_READ`` / ``OOB_WRITE`` are left out of (3): they come
from neither verifier (the audit is a third, CPU-only detector, off on CUDA), and on the CPU both paths' launches run
under an audit that drops stores outside kvfence's allocations, so neither writes into host memory.

A kernel whose stores race (two programs storing different values to one element, as several mutants
do on a GPU) can leave different values on two launches of one case. Where the contract itself lets
two programs store to one element (graph padding of the window rail, a row overflow whose spill lands
on the next row's write set in the production layout), the oracle accepts any of their values
(the oracle's sets of values, and ``kvfence.engine.verdict.with_spills``), so the reference kernel and the
planted writes are deterministic by construction. Each path launches the case itself, so every case is launched
on the oracle path twice, and when the paths disagree or those two launches differ, ``RACE_RETRIES`` more
times on each path; the device path's extra launches go through the path that judged the case (the whole run through
``check_many`` again when it was batched), so a batched path that loses findings is never excused by
one-case launches that see them. Each launch's verdict is recorded (``launches``: path, how it ran, kinds).
When two launches on one path name different findings, the case is **racy**: what it leaves depends on
the device's scheduling, so two launches are two samples, and only what holds whatever the schedule
is compared. A race can also come out the same on every launch of one path and differently on the
other (on the H200, where the programs land depends on where the path's buffers are): so when the
paths' verdicts are both dirty and their findings still differ after the extra launches, one more
device-path launch is judged by **both**
verifiers on the same buffers (``Paths.cross_judge``). If they name different findings there, the
verifiers disagree (reported, as before); if they name the same, the verifiers agree on one and the
same launch and the paths differ only in what the kernel left: the case is racy as well (launch-dependent),
with that launch added to both paths' launches. A racy case agrees when

* (1) holds over all launches: each path's verdict is dirty on some launch of it (a race may
  sometimes come out right, on either path), and a batched device path is dirty on some launch of its
  own when every other launch is dirty;
* (2) holds loosely: each non-zero counter of the device verifier is implied by the findings of some
  launch on either path (the counters come from a launch of their own, one more sample);
* the host-known findings (``SIZING_VIOLATION``, ``HOST_CHECK_*``: computed before the kernel runs,
  whatever it does) are equal, element range included;
* the kinds the kernel's stores left (everything but the host-known kinds), taken over all launches
  of each path, overlap: some kind is seen on both paths (so each path saw the kernel's damage).

Equal kinds from one launch per path are not asked for: a race can leave a ``VALUE_MISMATCH`` on one
launch and a ``MISSING_WRITE`` on the next. A case that is not racy is compared exactly as above,
range for range. A racy case of the reference kernel (under any sizing: the sizing mutants run it too)
or of a planted write is a harness bug (a write set kvfence got wrong, or a plant that is not one
store): it is a disagreement and fails the run. The JSON counts racy cases (``racy``, per target and in all).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from kvfence.contracts.draft.case import Case
from kvfence.contracts.draft.compare_rows import (
    AUDIT_KINDS,
    INPUTS,
    INPUTS_COUNTER,
    REFERENCE,
    CaseResult,
    Comparison,
    Row,
    Target,
    counter_of,
    format_table,
    must_be_deterministic,
    named,
    row_verdict,
)
from kvfence.contracts.draft.device_verify import COUNTERS
from kvfence.contracts.draft.domain import HOST_VERDICT_MAX_BYTES

#: What ``kvfence mutants --verifiers both`` uses (``kvfence.cli.mutants.COMPARISON_MEMBERS``), and ``Comparison``.
__all__ = ["DEFAULT_EXAMPLES", "Comparison", "format_table", "row_verdict", "run"]
from kvfence.engine.findings import Finding, Kind
from kvfence.kernels import KERNELS_DIR

PLANTED_FILE = KERNELS_DIR / "draft" / "planted.py"
#: Configs per target when ``--max-examples`` is not given (each a run of several batches).
DEFAULT_EXAMPLES = 8
#: Device bytes per drawn config on CUDA when ``--max-gpu-mem`` is not given: the oracle path builds
#: the whole write set in Python, so configs are kept to the size the host verdict checks in a second.
CUDA_MAX_BYTES = HOST_VERDICT_MAX_BYTES
#: Kinds known on the host before the kernel runs: the same on every launch of a case, racy or not.
HOST_KINDS = frozenset({Kind.SIZING_VIOLATION, Kind.HOST_CHECK_FIRED, Kind.HOST_CHECK_ADMITS_OVERFLOW,
                        Kind.HOST_CHECK_REJECTS_FIT})
#: Extra launches per path of a case on which the two paths disagree (see the module docstring).
RACE_RETRIES = 2
#: Batches per drawn config: the first config of a target gets a run longer than one staging chunk
#: (``kvfence.contracts.draft.device_verify.BATCH_ROWS``) on CUDA, the others short runs; on the CPU (the
#: interpreter) every run is short.
SHORT_RUN = {"cpu": 3, "cuda": 8}
#: Device bytes of the long run's config: the oracle path checks each of its cases in Python.
LONG_RUN_BYTES = 2 << 20
#: Rounds of more short runs (``max(max_examples, EXTRA_CONFIGS)`` configs each) for a target none of
#: whose cases was dirty yet: a bug that needs a rare draw (sinks longer than a window, say) gets there.
EXTRA_ROUNDS = 3
EXTRA_CONFIGS = 8


# -- targets and cases -----------------------------------------------------------------------------------
def targets(device: str, names: Optional[List[str]] = None) -> List[Target]:
    """The reference, every mutant and every planted write (or only ``names``), with their domains.

    As in the mutation self-test, a mutant is drawn from its own domain on CUDA and from the CPU domain
    on the CPU; the reference and the planted writes from the device's own domain.
    """
    import runpy

    from kvfence.contracts.draft.mutants import MUTANTS_DIR
    from kvfence.contracts.draft.record import DRAFT, WINDOW_RAIL
    from kvfence.errors import require
    from kvfence.kernels.draft.planted import PLANTS

    home = "gpu" if device == "cuda" else "cpu"
    every = {m.name: m for m in DRAFT.mutants + WINDOW_RAIL.mutants}
    mutant_names = set(every)
    if names:
        unknown = sorted(set(names) - mutant_names - set(PLANTS) - {REFERENCE})
        require(not unknown, f"unknown target(s) {', '.join(unknown)}: choose reference, a mutant "
                             f"({', '.join(sorted(mutant_names))}) or a planted write ({', '.join(PLANTS)})")
    wanted = (lambda n: n in names) if names else (lambda n: True)
    out = []
    domains = {home}
    for m in DRAFT.mutants:
        # The device verifier checks the draft contract only; a window-rail case is judged by the host verdict on
        # both paths (kvfence.contracts.draft.session), so there is nothing to compare.
        if not wanted(m.name):
            continue
        domain = m.domain if device == "cuda" else "cpu"
        domains.add(domain)
        data = runpy.run_path(str(MUTANTS_DIR / f"{m.name}.py"))
        # A bug of a §6 path (its docstring's bug class) needs the §6 fields drawn to show, as the
        # self-test draws them on the CPU domain; every other target keeps to the device verifier's §2.
        family = domain == "cpu" and "contract.md §6" in (data.get("__doc__") or "")
        aim = tuple(sorted((data.get("AIM") or {}).items())) if device == "cuda" else ()
        kind = "sizing" if m.sizing and not m.patch else "kernel"
        out.append(Target(m.name, f"{kind} mutant", f"mutant:{m.name}" if kind == "kernel" else REFERENCE,
                          m.sizing or "safe", domain, m.doc, family=family, aim=aim,
                          reachable=device == "cuda" or m.domain != "gpu"))
    if wanted(REFERENCE):
        out[:0] = [Target(REFERENCE, REFERENCE, REFERENCE, "safe", domain, "the reference kernel, safe sizing")
                   for domain in sorted(domains)]
    import kvfence.kernels.draft.planted as planted

    for name in PLANTS:
        if wanted(name):
            out.append(Target(name, "planted", f"{PLANTED_FILE}:{name}", "safe", home,
                              getattr(planted, name).__doc__ or name))
    return out


def draw_runs(target: Target, count: int, seed: int, max_bytes: Optional[int], batches: int,
              pins: Tuple[Tuple[str, int], ...] = ()) -> List[List[Case]]:
    """``count`` runs of ``batches`` cases, each run of one config from ``target``'s domain (configs
    unpinned but for ``pins``, graph and eager mode, both layouts), drawn by Hypothesis from ``seed`` alone, so both
    paths and every run see the same cases. A bucket that only one case of a run needs is moved to
    the end of the run: a long run then needs it first after its first staging chunk."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    from kvfence.contracts.draft.strategies import batches as batch_strategy
    from kvfence.contracts.draft.strategies import configs

    drawn: List[List[Case]] = []

    @hypothesis_seed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate], derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def collect(data):
        # Graph mode three times in four: it is where the device verifier judges.
        mode = data.draw(st.sampled_from(["graph", "graph", "graph", "eager"]))
        layout = data.draw(st.sampled_from(["redzone", "production"]))
        config = data.draw(configs(sizing=target.sizing, domain=target.domain, mode=mode, layout=layout,
                                   max_bytes=max_bytes, family=target.family, **dict(pins)))
        # Distinct cases (a repeated case would be one case checked twice). Hypothesis's first example is
        # its simplest, every draw in it alike: a repeated batch gets the next unused token seed instead
        # (a token-table variant, enough for a run that must span staging chunks).
        unique: Dict[Case, None] = {}
        for _ in range(batches):
            batch = data.draw(batch_strategy(config))
            seeds = {c.batch.token_seed for c in unique}
            while Case(config, batch, target.kernel) in unique:
                batch = dataclasses.replace(batch, token_seed=max(seeds) + 1)
            unique[Case(config, batch, target.kernel)] = None
        run = list(unique)
        buckets = [case.launch().num_seqs for case in run]
        lone = [i for i, m in enumerate(buckets) if buckets.count(m) == 1]
        if lone:
            run.append(run.pop(lone[0]))
        drawn.append(run)

    collect()
    return drawn[:count]


# -- one case through both paths -------------------------------------------------------------------------
class Paths:
    """The two sessions of one kernel: the oracle path and the device path."""

    def __init__(self, device: str, kernel: str):
        from weakref import WeakKeyDictionary

        from kvfence.contracts.draft.session import Session

        self.device = device
        self.oracle = Session(device, kernel, verifier="oracle")  # the address audit as by default
        # Our own verifier per device-path runner (its graphs are captured once per bucket, as the session's).
        self._verifiers: "WeakKeyDictionary[Any, Any]" = WeakKeyDictionary()
        self.dev = Session(device, kernel, verifier="device", audit=False)
        if device == "cpu":
            self.dev.kernel = _dropping_wild_stores(self.dev.kernel)

    def check(self, case: Case) -> CaseResult:
        return self.check_run([case])[0]

    def check_run(self, cases: List[Case]) -> List[CaseResult]:
        """Cases of one config through both paths: each on its own on the oracle path, all together
        through ``Session.check_many`` on the device path (as fuzzing checks them)."""
        from kvfence.contracts.draft.device_verify import DeviceVerifier

        counters: List[Optional[List[int]]] = []
        for case in cases:
            runner = self.dev.runner(case.config, case.canary_seed)
            sizing = case.sizing_summary()
            judged = case.config.mode == "graph" and sizing["need"] <= sizing["width"] and not case.config.is_family
            # A verifier of our own on the device path's runner, for each case's own counters (it leaves
            # the buffers clean: a dirty round trip resets them).
            verifier = (self._verifiers.get(runner) or self._verifiers.setdefault(runner, DeviceVerifier(runner))
                        if judged else None)
            counters.append(verifier.counters(case) if verifier is not None else None)
        batched = len(cases) > 1
        device = self.dev.check_many(cases) if batched else [self.dev.check(cases[0])]
        # A case's extra device launches go through the path that judged it: the whole run through
        # check_many again when it was batched, so a batched path that misses findings cannot be excused
        # by one-case launches that see them (the module docstring, "racy").
        relaunch = [(lambda i=i: self.dev.check_many(cases)[i]) if batched else (lambda c=case: self.dev.check(c))
                    for i, case in enumerate(cases)]
        return [self._result(case, c, d, again, "batch" if batched else "one")
                for case, c, d, again in zip(cases, counters, device, relaunch)]

    def _result(self, case: Case, counters: Optional[List[int]], device: List[Finding],
                relaunch: Optional[Callable[[], List[Finding]]] = None, via: str = "one") -> CaseResult:
        relaunch = relaunch or (lambda: self.dev.check(case))
        oracle_runs = [self.oracle.check(case), self.oracle.check(case)]
        device_runs = [device]
        device_via = [via]
        if _varies(oracle_runs) or named(device) != named(oracle_runs[0]):
            # A disagreement or a race: more launches on both paths. A race can come out the same on two
            # launches and differently on a third, on either path; a racy case is judged on all of them.
            for _ in range(RACE_RETRIES):
                device_runs.append(relaunch())
                device_via.append(via)
                oracle_runs.append(self.oracle.check(case))
        racy = _varies(oracle_runs) or _varies(device_runs)
        if not racy and named(device) and named(oracle_runs[0]) and named(device) != named(oracle_runs[0]):
            # Both verdicts dirty, the findings different (a clean verdict against a dirty one is never
            # put down to the kernel: it is what a blind verifier gives).
            judged = self.cross_judge(case)
            if judged is not None and named(judged[0]) == named(judged[1]):
                # Both verifiers name the same findings on one launch's buffers: the paths differ in what
                # the kernel left there (launch-dependent), not in how they judge it (the module docstring).
                racy = True
                device_runs.append(judged[0])
                device_via.append("cross-judge")
                oracle_runs.append(judged[1])
        oracle = oracle_runs[0]
        implied = sorted({i for i in map(counter_of, oracle) if i is not None})
        if racy:
            problems = self.compare_racy(counters, oracle_runs, device_runs)
            batch = [run for run, how in zip(device_runs, device_via) if how == "batch"]
            others = [run for run, how in zip(device_runs, device_via) if how != "batch"] + oracle_runs
            if batch and not any(named(run) for run in batch) and all(named(run) for run in others):
                problems.append(f"racy case: the batched path is clean on all {len(batch)} of its launches while "
                                f"every other launch ({len(others)}) is dirty")
        else:
            problems = self.compare(counters, implied, oracle, device)
        launches = ([{"path": "device", "via": how, "kinds": sorted({f.kind.value for f in run})}
                     for run, how in zip(device_runs, device_via)]
                    + [{"path": "oracle", "via": "one", "kinds": sorted({f.kind.value for f in run})}
                       for run in oracle_runs])
        return CaseResult(case, counters, implied, oracle, device, problems, racy, launches)

    def cross_judge(self, case: Case) -> Optional[Tuple[List[Finding], List[Finding]]]:
        """One launch of ``case`` on the device path's runner, judged by the full verdict both paths run on a
        dirty case (``host_verdict``), on the same buffers (then reset), as each path's; None where the device
        path does not judge the case on its device counters first (``Session.check``)."""
        from kvfence.contracts.draft.session import host_verdict

        if self.dev.verifier != "device":
            return None
        obs = self.dev.runner(case.config, case.canary_seed).run(case.batch)
        try:
            found = host_verdict(obs)
            return found, list(found)
        finally:
            obs.reset()

    @staticmethod
    def compare_racy(counters: Optional[List[int]], oracle_runs: List[List[Finding]],
                     device_runs: List[List[Finding]]) -> List[str]:
        """What differs between the two paths on a racy case, from every launch of each path (the module
        docstring: only what holds whatever the schedule)."""
        outside = any(f.kind == Kind.OOB_WRITE for run in oracle_runs for f in run)
        if outside:  # as in ``compare``: inputs hit by stores that left the allocations are not compared
            oracle_runs = [_inside_allocations(run) for run in oracle_runs]
            device_runs = [_inside_allocations(run) for run in device_runs]
        problems = []
        for path, runs in (("device", device_runs), ("oracle", oracle_runs)):
            if not any(named(run) for run in runs):
                problems.append(f"racy case: the {path} path is clean on all {len(runs)} launches")
        if counters is not None:
            implied = {i for run in oracle_runs + device_runs for i in map(counter_of, run) if i is not None}
            seen = {i for i, c in enumerate(counters) if c and not (outside and i == INPUTS_COUNTER)}
            if INPUTS_COUNTER in implied:  # as in ``compare``: the other counters count against damaged inputs
                seen, implied = seen & {INPUTS_COUNTER}, {INPUTS_COUNTER}
            if not seen <= implied:
                problems.append(f"racy case: counters {[COUNTERS[i] for i in sorted(seen)]} non-zero, the launches' "
                                f"findings imply some of {[COUNTERS[i] for i in sorted(implied)]}")
        host = {tuple(named([f for f in run if f.kind in HOST_KINDS])) for run in oracle_runs + device_runs}
        if len(host) > 1:
            problems.append("racy case: the host-known findings differ between launches")

        def stored(runs):
            return {f.kind for run in runs for f in run if f.kind not in HOST_KINDS | AUDIT_KINDS}

        if not stored(device_runs) & stored(oracle_runs):
            problems.append(f"racy case: no kind in common over all launches (device path "
                            f"{sorted(k.value for k in stored(device_runs))}, oracle path "
                            f"{sorted(k.value for k in stored(oracle_runs))})")
        return problems

    @staticmethod
    def compare(counters, implied, oracle, device) -> List[str]:
        """What differs between the two paths on a case that is not racy (empty: they agree)."""
        problems = []
        if any(f.kind == Kind.OOB_WRITE for f in oracle):
            # Stores that left kvfence's allocations (the CPU audit saw some): where the others land depends
            # on what the allocator put next to the buffer, which differs between the two paths' buffers,
            # so an input they hit on one path is not compared.
            oracle, device = _inside_allocations(oracle), _inside_allocations(device)
            implied = [i for i in implied if i != INPUTS_COUNTER]
            counters = None if counters is None else [c if i != INPUTS_COUNTER else 0 for i, c in enumerate(counters)]
        if counters is not None:
            if any(counters) != bool(named(oracle)):
                problems.append("device verdict " + ("dirty" if any(counters) else "clean") + ", oracle verdict "
                                + ("dirty" if named(oracle) else "clean"))
            seen = [i for i, c in enumerate(counters) if c]
            if INPUTS_COUNTER in implied:
                # The verifier recomputes the write set from the inputs the kernel just changed, so the
                # other counters count against damaged inputs: only the inputs counter is compared then
                # (the verdict is dirty either way, and (3) compares what the full path names).
                seen, implied = [i for i in seen if i == INPUTS_COUNTER], [INPUTS_COUNTER]
            if seen != implied:
                problems.append(f"counters {[COUNTERS[i] for i in seen]} non-zero, the oracle's findings imply "
                                f"{[COUNTERS[i] for i in implied]}")
        if named(device) != named(oracle):
            problems.append("the device path's findings differ from the oracle path's")
        return problems


def _varies(runs: List[List[Finding]]) -> bool:
    """Whether launches of one case on one path named different findings (the case is racy)."""
    return any(named(run) != named(runs[0]) for run in runs[1:])


def _inside_allocations(findings: List[Finding]) -> List[Finding]:
    """``findings`` without the inputs' (on a case with an ``OOB_WRITE``: see ``Paths.compare``)."""
    return [f for f in findings if f.buffer not in INPUTS]


def _dropping_wild_stores(target):
    """``target`` whose launches run under the interpreter address audit with every tensor's whole storage
    registered: a store outside kvfence's allocations is dropped (it would write host memory), and any
    store inside them lands, guards included. The audit's findings are not used (the module docstring)."""
    import dataclasses

    import torch

    from kvfence.engine.audit import Audit

    def launch(**kw):
        audit, seen = Audit(), set()
        for name, t in kw.items():
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                whole = torch.empty(0, dtype=t.dtype, device=t.device)
                whole.set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),))
                audit.register_tensor(name, whole)
        audit.wrap(lambda: target.launch(**kw))()

    return dataclasses.replace(target, launch=launch)


# -- the run ---------------------------------------------------------------------------------------------
def run(device: str, *, max_examples: int = DEFAULT_EXAMPLES, seed: int = 0, names: Optional[List[str]] = None,
        max_bytes: Optional[int] = None, progress: Optional[Callable[[Comparison, Row], None]] = None) -> Comparison:
    """Every target's cases through both paths; ``progress`` is called after each target."""
    from kvfence.contracts.draft.sizing import resolve_sizing
    from kvfence.errors import require

    require(max_examples >= 1, f"max_examples must be positive, got {max_examples}")
    if device == "cuda" and max_bytes is None:
        max_bytes = CUDA_MAX_BYTES
    from kvfence.contracts.draft.device_verify import BATCH_ROWS

    report = Comparison(device, max_examples, seed, max_bytes)
    paths: Dict[str, Paths] = {}
    short = SHORT_RUN.get(device, SHORT_RUN["cuda"])
    for target in targets(device, names):
        resolve_sizing(target.sizing)  # a broken sizing file is bad input before anything runs
        row = Row(target)
        if not target.reachable:  # nothing it could show here (``Target.reachable``): listed, not compared
            report.rows.append(row)
            if progress is not None:
                progress(report, row)
            continue
        start = time.perf_counter()
        pair = paths.get(target.kernel) or paths.setdefault(target.kernel, Paths(device, target.kernel))
        if device == "cuda":  # one run longer than a staging chunk, then short runs
            long_bytes = LONG_RUN_BYTES if max_bytes is None else min(max_bytes, LONG_RUN_BYTES)
            runs = draw_runs(target, 1, seed, long_bytes, BATCH_ROWS + short)
            runs += draw_runs(target, max_examples - 1, seed + 1, max_bytes, short) if max_examples > 1 else []
        else:
            runs = draw_runs(target, max_examples, seed, max_bytes, short)
        for extra in range(EXTRA_ROUNDS + 1):
            for run_cases in runs:
                for result in pair.check_run(run_cases):
                    if result.racy and must_be_deterministic(target):
                        result.problems.append(f"racy case of {target.name} ({target.group}): a harness bug")
                    row.add(result)
            if row.exercised or extra == EXTRA_ROUNDS:
                break
            runs = draw_runs(target, max(max_examples, EXTRA_CONFIGS), seed + 1000 * (extra + 1), max_bytes, short,
                             pins=target.aim)
        row.seconds = time.perf_counter() - start
        report.rows.append(row)
        if progress is not None:
            progress(report, row)
    return report


