"""On a GPU: a kernel that really faults (illegal address far past its allocation) is a CRASH of its
case only; the worker with the dead CUDA context is replaced and the next cases are checked."""

from pathlib import Path

import pytest

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.record import launch_of
from kvfence.engine.findings import Kind
from kvfence.engine.plan import RunPlan
from kvfence.engine.supervisor import RemoteSession

pytestmark = pytest.mark.gpu

FAULT = f"{Path(__file__).resolve().parent / 'targets' / 'far_store.py'}:fault_on_3"


def test_an_illegal_address_is_a_crash_of_its_case_and_the_run_goes_on(device):
    # Eager: the launcher reads seq_lens on the host, which graph capture forbids.
    config = Config(topk=2, num_steps=2, ctx=8, max_bs=2, mode="eager")
    cases = [Case(config, Batch((L,), (1,), i), kernel=FAULT) for i, L in enumerate([1, 3, 2, 4])]
    with RemoteSession(RunPlan(device=device, kernel=FAULT)) as rs:
        got = rs.check_many([launch_of(c) for c in cases])
        assert [[f.kind for f in r] for r in got] == [[], [Kind.CRASH], [], []], got
        assert rs.stats["worker_starts"] >= 2
    with RemoteSession(RunPlan(device=device)) as rs:  # the correct kernel passes the same cases
        assert rs.check_many([launch_of(Case(c.config, c.batch)) for c in cases]) == [[]] * 4
