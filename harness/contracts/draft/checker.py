"""The draft contract's own checker (``Contract.checker``): its production path.

Each launch becomes the runner's case (``DraftCase.runtime``) and goes to a ``session.Session``: the CUDA-graph
runner of docs/contract.md §4 (buffers sized once at ``max_bs``, batches padded to their bucket, graphs captured
once per bucket and replayed, stale buffers kept between replays), guarded buffers, the verdict, and on CUDA the
device verifier (a clean case never leaves the GPU). The plain path of the record (``tables``, ``expected``,
``launch``) is what it is tested against (``tests/test_draft_paths.py``).
"""

from __future__ import annotations

from typing import List

from kvfence.contract import Launch
from kvfence.contracts.draft.case import Case
from kvfence.contracts.draft.session import runtime_case


class DraftChecker:
    """``check`` / ``check_many`` of the engine's launches through a ``Session`` per kernel (the plan's first,
    resolved now: a kernel that cannot be used is one line before any case). A runner's own ``Case`` (what
    ``kvfence.strategies`` draws for a project's own tests) is checked as it is."""

    def __init__(self, record, plan, **options):
        self.record, self.plan, self.options = record, plan, options
        self._sessions = {}
        self.session = self._session(plan.kernel)
        self.stats = self.session.stats

    def _session(self, kernel: str):
        from kvfence.contracts.draft.session import Session

        found = self._sessions.get(kernel)
        if found is None:
            found = self._sessions[kernel] = Session(self.plan.device, kernel, audit=self.plan.audit,
                                                     absorb=self.plan.absorb, max_bytes=self.plan.max_bytes,
                                                     stats=getattr(self, "stats", None), **self.options)
        return found

    runtime = staticmethod(runtime_case)

    def check(self, launch: Launch | Case) -> list:
        """The findings of one launch (or of a runner's own case, as ``check_many`` passes them)."""
        self._fits(launch)
        case = self.runtime(launch)
        return self._session(case.kernel).check(case)

    def _fits(self, launch) -> None:
        """A launch's buffers within the plan's memory budget before its runner allocates them (one line)."""
        if isinstance(launch, Launch):
            from kvfence.engine.checking import require_fits

            require_fits(self.record, launch, self.plan.max_bytes)

    def check_many(self, launches: List[Launch]) -> List[list]:
        for launch in launches[:1]:  # one config: its first launch's buffers are every one's
            self._fits(launch)
        cases = [self.runtime(x) for x in launches]
        if len({c.kernel for c in cases}) > 1:
            return [self.check(c) for c in cases]
        return self._session(cases[0].kernel).check_many(cases) if cases else []
