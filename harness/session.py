"""A checking session: one device, one kernel under test, runners cached per config.

``Session.check(case)`` is the whole pipeline for one case: pick (or build) the runner for the case's
config (graph mode keeps its buffers and captured graphs across cases, as production does), launch,
and return the verdict's findings.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, List, Optional

from harness.audit import resolve_audit
from harness.case import Case, Config
from harness.findings import Finding
from harness.runner import Observation, make_runner
from harness.targets import KernelTarget, resolve_kernel
from harness.verdict import ExpectedWrites, check

#: Configs whose runners (buffers, graphs) stay alive; Hypothesis revisits recent configs when shrinking.
RUNNER_CACHE = 16


class Session:
    def __init__(self, device: str, kernel: str = "reference", *, poison: bool = True,
                 expected_builder: Optional[Callable[[Observation], ExpectedWrites]] = None,
                 audit: Optional[bool] = None):
        self.device = device
        # Interpreter address audit (harness.audit): None = on for cpu, off for cuda; True on cuda is BadInput.
        self.audit = resolve_audit(audit, device)
        self.kernel_spec = kernel
        self.kernel: KernelTarget = resolve_kernel(kernel, device)
        self.poison = poison
        # None: the plain oracle. The fast builder (harness.fastcheck) is tested equal to it.
        self.expected_builder = expected_builder
        self._runners: "OrderedDict[tuple, object]" = OrderedDict()

    def runner(self, config: Config, canary_seed: int = 0):
        key = (config, canary_seed)
        runner = self._runners.get(key)
        if runner is None:
            runner = make_runner(config, self.kernel, self.device, canary_seed=canary_seed, poison=self.poison,
                                 audit=self.audit)
            self._runners[key] = runner
            if len(self._runners) > RUNNER_CACHE:
                self._runners.popitem(last=False)
        else:
            self._runners.move_to_end(key)
        return runner

    def observe(self, case: Case) -> Observation:
        return self.runner(case.config, case.canary_seed).run(case.batch)

    def check(self, case: Case) -> List[Finding]:
        obs = self.observe(case)
        expected = self.expected_builder(obs) if self.expected_builder is not None else None
        return check(obs, expected)
