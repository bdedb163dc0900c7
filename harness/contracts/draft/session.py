"""A checking session: one device, one kernel under test, runners cached per config.

``Session.check(case)`` is the whole pipeline for one case: pick (or build) the runner for the case's
config (graph mode keeps its buffers and captured graphs across cases, as production does), launch,
and return the verdict's findings: on CUDA the device verifier's counters decide a clean case; every other case
gets ``host_verdict``, the engine's verdict (``kvfence.engine.verdict``) on the runner's tables.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, List, Optional, Set, Tuple, cast
from weakref import WeakKeyDictionary

from kvfence.contract import Launch
from kvfence.contracts.draft import shipped_sizing
from kvfence.contracts.draft.case import Case, Config
from kvfence.contracts.draft.device_verify import COUNTERS, DeviceVerifier
from kvfence.contracts.draft.launches import launch_of
from kvfence.contracts.draft.runner import GraphRunner, Observation, make_runner
from kvfence.contracts.draft.runner_buffers import config_bytes as estimate_bytes
from kvfence.contracts.draft.targets import KernelTarget, resolve_kernel
from kvfence.engine import registry
from kvfence.engine.audit import resolve_audit
from kvfence.engine.checking import name_programs
from kvfence.engine.findings import Finding, Kind
from kvfence.engine.verdict import verdict, with_spills
from kvfence.errors import require


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())

VERIFIERS = ("auto", "oracle", "device")

#: Configs whose runners (buffers, graphs) stay alive; Hypothesis revisits recent configs when shrinking.
RUNNER_CACHE = 16


class Session:
    def __init__(self, device: str, kernel: str = "reference", *, poison: bool = True,
                 verifier: str = "auto", audit: Optional[bool] = None, absorb: bool = True,
                 max_bytes: Optional[int] = None, stats: Optional[dict] = None):
        self.device = device
        #: Device memory the cached runners may hold together (kvfence.contracts.draft.runner_buffers estimates);
        #: None: no bound.
        self.max_bytes = max_bytes
        # Interpreter address audit (kvfence.engine.audit): None = on for cpu, off for cuda; True on cuda is BadInput.
        self.audit = resolve_audit(audit, device)
        self.kernel: KernelTarget = resolve_kernel(kernel, device)
        self.poison = poison
        self.absorb = absorb  # False only under compute-sanitizer (kvfence.contracts.draft.runner._buffers)
        require(absorb or device == "cuda" or self.audit,
                "--no-absorb on the CPU needs the address audit: a wild store would write host memory")
        # "oracle": the plain-Python oracle builds every expected write set (CPU default).
        # "device": graph-mode cases are verified on the device (kvfence.contracts.draft.device_verify) and only a dirty
        # case goes through the full verdict, with the torch write-set builder (CUDA default).
        require(verifier in VERIFIERS, f"verifier must be one of {', '.join(VERIFIERS)}, got {verifier!r}")
        self.verifier = ("device" if device == "cuda" else "oracle") if verifier == "auto" else verifier
        #: fast_clean / full: cases judged by the device counters alone / by the full verdict;
        #: launches: kernel launches; runners: configs built; captures, compile_s, capture_s: CUDA-graph
        #: captures and the time spent warming up (compiling) and capturing them (kvfence.contracts.draft.runner);
        #: compiles: distinct constexpr variants of the kernel under test first launched by this process
        #: (each a Triton compile, or a load from Triton's on-disk cache); batches: check_many round trips.
        #: host_verified: cases the device verifier would have judged but whose config is §6's (a window,
        #: page-granular rows, translation or the rail, docs/contract.md §6): it checks §2 only, so they go
        #: through the full verdict on the host instead, and are counted, never silently.
        counters = {"fast_clean": 0, "full": 0, "launches": 0, "runners": 0, "runner_s": 0.0, "captures": 0,
                    "compile_s": 0.0, "capture_s": 0.0, "compiles": 0, "batches": 0, "host_verified_cases": 0}
        #: ``stats``: another session's counters to add to (a checker holding a session per kernel).
        self.stats = counters if stats is None else stats
        for key, value in counters.items():
            self.stats.setdefault(key, value)
        self._variants: Set[Any] = set()
        self._runners: "OrderedDict[tuple, object]" = OrderedDict()
        self._runner_bytes: dict = {}
        self._device_verifiers: "WeakKeyDictionary[GraphRunner, DeviceVerifier]" = WeakKeyDictionary()

    def runner(self, config: Config, canary_seed: int = 0):
        key = (config, canary_seed)
        runner = self._runners.get(key)
        if runner is None:
            self.kernel.check_config(config)  # a §6 config needs a kernel that takes its fields (BadInput)
            t0 = time.perf_counter()
            runner = make_runner(config, self.kernel, self.device, canary_seed=canary_seed, poison=self.poison,
                                 audit=self.audit, absorb=self.absorb, stats=self.stats)
            self.stats["runners"] += 1
            self.stats["runner_s"] += time.perf_counter() - t0
            self._runners[key] = runner
            self._runner_bytes[key] = estimate_bytes(config) if self.max_bytes is not None else 0
            evicted = False
            while len(self._runners) > 1 and (len(self._runners) > RUNNER_CACHE or (
                    self.max_bytes is not None and sum(self._runner_bytes.values()) > self.max_bytes)):
                old, _ = self._runners.popitem(last=False)
                evicted |= self._runner_bytes.pop(old) > 0
            if evicted and self.device == "cuda":
                import torch

                torch.cuda.empty_cache()  # hand the evicted buffers and graph pools back for the next config
        else:
            self._runners.move_to_end(key)
        return runner

    def observe(self, case: Case) -> Observation:
        return self.runner(case.config, case.canary_seed).run(case.batch)

    def _count_launch(self, case: Case) -> None:
        self._count_launches(case.config, [case.launch().num_seqs])

    def _count_launches(self, c: Config, buckets) -> None:
        """Launches of config ``c`` at these buckets (one per entry), and the kernel variants they compile."""
        self.stats["launches"] += len(buckets)
        if self.device != "cuda":
            return
        for m in set(buckets):  # a batch repeats a handful of buckets: the variant once per bucket
            # The classic launcher's constexprs
            # (kvfence.contracts.draft.targets / kvfence.kernels.draft.draft_kv_indices.launch).
            variant = (c.page_size, next_pow2(m), next_pow2(c.num_steps), next_pow2(m * c.topk), c.mode)
            if variant not in self._variants:
                self._variants.add(variant)
                self.stats["compiles"] += 1

    def _device_verifier(self, runner) -> DeviceVerifier:
        verifier = self._device_verifiers.get(runner)
        if verifier is None:
            verifier = self._device_verifiers[runner] = DeviceVerifier(runner)
        return verifier

    def _device_verifiable(self, case: Case, runner) -> bool:
        """The device verifier applies: graph mode, poisoned rows, and a §2 config (it checks §2 only;
        a §6 config is verified on the host and counted in ``stats["host_verified_cases"]``)."""
        return (self.verifier == "device" and self.poison and isinstance(runner, GraphRunner)
                and not case.config.is_family)

    def _fast_path(self, case: Case, runner) -> bool:
        if not self._device_verifiable(case, runner):
            return False
        sizing = case.sizing_summary()
        return sizing["need"] <= sizing["width"]

    def check_many(self, cases: List[Case]) -> List[List[Finding]]:
        """Verdicts of ``cases``, in order. Cases of one config that the device verifier can judge go
        in one round trip (``DeviceVerifier.total_counters``); if that batch is not all clean, each of
        its cases is checked again on its own, so a finding is always one case's."""
        cases = [runtime_case(c) for c in cases]
        out: List[Optional[List[Finding]]] = [None] * len(cases)
        # Grouped by the config object first (the cases of one example share it): hashing a config
        # per case would cost more than checking the case on the device.
        by_object: "OrderedDict[tuple, List[int]]" = OrderedDict()
        for i, case in enumerate(cases):
            by_object.setdefault((id(case.config), case.canary_seed), []).append(i)
        for idx in by_object.values():
            first = cases[idx[0]]
            runner = self.runner(first.config, first.canary_seed)
            fast = [i for i in idx if self._fast_path(cases[i], runner)]
            if len(fast) < 2:
                fast = []  # one case: Session.check is the same round trip
            on_device = set(fast)
            for i in idx:
                if i not in on_device:
                    out[i] = self.check(cases[i])
            if not fast:
                continue
            batch = [cases[i] for i in fast]
            self._count_launches(first.config, [case.launch().num_seqs for case in batch])
            self.stats["batches"] += 1
            if not any(self._device_verifier(runner).total_counters(batch)):
                self.stats["fast_clean"] += len(batch)
                for i in fast:
                    out[i] = []
                continue
            for i in fast:  # some case is dirty: find which, one by one
                out[i] = self.check(cases[i])
        return cast(List[List[Finding]], out)  # every case is in one group, and each group's cases got theirs

    def check(self, case: Case) -> List[Finding]:
        case = runtime_case(case)
        runner = self.runner(case.config, case.canary_seed)
        self._count_launch(case)
        counters = None
        if self.verifier == "device" and case.config.is_family:
            self.stats["host_verified_cases"] += 1
        if self._device_verifiable(case, runner):
            sizing = case.sizing_summary()
            if sizing["need"] <= sizing["width"]:
                counters = self._device_verifier(runner).counters(case)
                if not any(counters):
                    self.stats["fast_clean"] += 1
                    return []
        self.stats["full"] += 1
        if counters is not None:
            self.stats["launches"] += 1  # the full path launches the dirty case again
        obs = runner.run(case.batch)
        findings = host_verdict(obs)
        if counters is not None or (findings and self.verifier == "device"):
            # The device fast path re-poisons rows but trusts the guards: restore what this case broke.
            obs.reset()
        if counters is not None and not findings:
            # The device counters saw damage that a second launch of the same case did not repeat.
            findings.append(Finding(Kind.VALUE_MISMATCH, "kv_indices", "unrepeatable",
                                    detail=f"device verifier counted {dict(zip(COUNTERS, counters))} but a re-run "
                                           "was clean: a nondeterministic (racy) kernel?"))
        return findings


def runtime_case(case) -> Case:
    """The runner's case of an engine launch (a runner's own case as it is)."""
    if isinstance(case, Launch):
        return case.case.runtime(case.sizing, case.mode, case.layout, case.kernel)
    return case


#: The host check's kinds that stop the launch in production: nothing the kernel did is then a finding.
STOPPED = (Kind.HOST_CHECK_FIRED.value, Kind.HOST_CHECK_REJECTS_FIT.value)


def host_verdict(obs: Observation) -> List[Finding]:
    """The findings of one runner launch, on the host: the draft's arithmetic (``arithmetic``), the address
    audit's, a launch error, then the engine's verdict (``kvfence.engine.verdict.verdict``) on the runner's tables
    (its outputs, the inputs the launch changed) against the record's oracle (``Contract.expected``), with a
    production layout's spills onto another row accepted where they race (``with_spills``), and the programs named
    as the engine names them (``kvfence.engine.checking.name_programs``)."""
    launch = launch_of(obs.case)
    record = registry.get(launch.contract)  # the draft's record (``kvfence.contracts.draft.record``) by its name
    findings = arithmetic(record, launch, obs)
    if any(f.kind.value in STOPPED for f in findings):
        return findings  # the check fires: production stops before the launch, so nothing is written
    if obs.error is not None:
        return findings + obs.audit_findings + [Finding(Kind.LAUNCH_ERROR, "kernel", "launch", detail=obs.error)]
    buffers = obs.buffers
    expected = with_spills(record.expected(launch), buffers)
    found = verdict(record, launch, buffers, obs.before, obs.after, expected=expected)
    name_programs(record, launch, obs.audit_findings, found, expected, buffers, obs.audit)
    return findings + obs.audit_findings + found


def arithmetic(record: Any, launch: Launch, obs: Observation) -> List[Finding]:
    """What the case decides before the launch: a release's host check on it (read from the wheel,
    ``shipped_sizing.check_verdict``) and ``SIZING_VIOLATION`` (need > width), with the programs whose segments
    run past the row."""
    case, config = obs.case, obs.case.config
    width, need = obs.kv_indices.table.width, case.need()
    name = obs.kv_indices.table.name
    out = []
    host = shipped_sizing.check_verdict(config.sizing, config.topk, config.num_steps, obs.launch.num_seqs,
                                        sum(obs.launch.seq_lens), width, need)
    if host is not None:
        out.append(Finding(Kind(host[0]), name, "host check", detail=host[1]))
    if need > width and not any(f.kind.value in STOPPED for f in out):
        over: List[Tuple[int, ...]] = [(g.s, g.b, g.k) for g in record.segments(launch) if g.stop > width]
        family = "".join(f", {k}={v}" for k, v in config.family_dict().items())
        out.append(Finding(
            Kind.SIZING_VIOLATION, name, f"row {config.num_steps - 1}", width, need, [], over,
            f"need {need} > width {width} (topk={config.topk}, num_seqs={obs.launch.num_seqs}, "
            f"sum(L)={sum(obs.launch.seq_lens)}, num_steps={config.num_steps}, sizing={config.sizing}{family})"))
    return out
