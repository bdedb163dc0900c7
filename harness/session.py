"""A checking session: one device, one kernel under test, runners cached per config.

``Session.check(case)`` is the whole pipeline for one case: pick (or build) the runner for the case's
config (graph mode keeps its buffers and captured graphs across cases, as production does), launch,
and return the verdict's findings.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import List, Optional

from weakref import WeakKeyDictionary

from harness.audit import resolve_audit
from harness.case import Case, Config
from harness.device_verify import COUNTERS, DeviceVerifier
from harness.errors import require
from harness.fastcheck import expected_writes_torch
from harness.findings import Finding, Kind
from harness.runner import GraphRunner, Observation, make_runner
from harness.targets import KernelTarget, resolve_kernel
from harness.verdict import check

VERIFIERS = ("auto", "oracle", "device")

#: Configs whose runners (buffers, graphs) stay alive; Hypothesis revisits recent configs when shrinking.
RUNNER_CACHE = 16


class Session:
    def __init__(self, device: str, kernel: str = "reference", *, poison: bool = True,
                 verifier: str = "auto", audit: Optional[bool] = None, absorb: bool = True):
        self.device = device
        # Interpreter address audit (harness.audit): None = on for cpu, off for cuda; True on cuda is BadInput.
        self.audit = resolve_audit(audit, device)
        self.kernel: KernelTarget = resolve_kernel(kernel, device)
        self.poison = poison
        self.absorb = absorb  # False only under compute-sanitizer (harness.runner._buffers)
        require(absorb or device == "cuda" or self.audit,
                "--no-absorb on the CPU needs the address audit: a wild store would write host memory")
        # "oracle": the plain-Python oracle builds every expected write set (CPU default).
        # "device": graph-mode cases are verified on the device (harness.device_verify) and only a dirty
        # case goes through the full verdict, with the torch write-set builder (CUDA default).
        require(verifier in VERIFIERS, f"verifier must be one of {', '.join(VERIFIERS)}, got {verifier!r}")
        self.verifier = ("device" if device == "cuda" else "oracle") if verifier == "auto" else verifier
        self.stats = {"fast_clean": 0, "full": 0}
        self._runners: "OrderedDict[tuple, object]" = OrderedDict()
        self._device_verifiers: "WeakKeyDictionary[GraphRunner, DeviceVerifier]" = WeakKeyDictionary()

    def runner(self, config: Config, canary_seed: int = 0):
        key = (config, canary_seed)
        runner = self._runners.get(key)
        if runner is None:
            runner = make_runner(config, self.kernel, self.device, canary_seed=canary_seed, poison=self.poison,
                                 audit=self.audit, absorb=self.absorb)
            self._runners[key] = runner
            if len(self._runners) > RUNNER_CACHE:
                self._runners.popitem(last=False)
        else:
            self._runners.move_to_end(key)
        return runner

    def observe(self, case: Case) -> Observation:
        return self.runner(case.config, case.canary_seed).run(case.batch)

    def check(self, case: Case) -> List[Finding]:
        runner = self.runner(case.config, case.canary_seed)
        counters = None
        if self.verifier == "device" and self.poison and isinstance(runner, GraphRunner):
            sizing = case.sizing_summary()
            if sizing["need"] <= sizing["width"]:
                verifier = self._device_verifiers.get(runner)
                if verifier is None:
                    verifier = self._device_verifiers[runner] = DeviceVerifier(runner)
                counters = verifier.counters(case)
                if not any(counters):
                    self.stats["fast_clean"] += 1
                    return []
        self.stats["full"] += 1
        obs = runner.run(case.batch)
        expected = expected_writes_torch(obs) if self.verifier == "device" else None
        findings = check(obs, expected)
        if counters is not None or (findings and self.verifier == "device"):
            # The device fast path re-poisons rows but trusts the guards: restore what this case broke.
            obs.kv_indices.reset()
            obs.kv_indptr.reset()
        if counters is not None and not findings:
            # The device counters saw damage that a second launch of the same case did not repeat.
            findings.append(Finding(Kind.VALUE_MISMATCH, "kv_indices", "unrepeatable",
                                    detail=f"device verifier counted {dict(zip(COUNTERS, counters))} but a re-run "
                                           "was clean: a nondeterministic (racy) kernel?"))
        return findings
