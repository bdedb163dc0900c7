"""CUDA-graph replay as production does it (docs/contract.md §4): buckets captured once, then replays whose batch
size grows and shrinks, with buffers never cleared. After every replay the oracle's write set must be
there, every guard intact, and everything outside the write set exactly what the previous replays left.

On CPU the graphs are emulated (the bucket's launch runs directly); with ``--device cuda`` they are real
captured graphs. A runner that forgets to reset padded rows (a real bug class) must be caught.
"""

import pytest
import torch
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from kvfence.contracts.draft.case import Batch, Case
from kvfence.contracts.draft.runner import GraphRunner
from kvfence.contracts.draft.session import host_verdict
from kvfence.contracts.draft.strategies import batches, configs
from kvfence.contracts.draft.targets import resolve_kernel


def guards_intact(g) -> bool:
    """Every element of an output outside its rows (and, with ``column0_canary``, its column 0) holds its canary."""
    canary = torch.ones(len(g.flat), dtype=torch.bool)
    for row in range(g.rows):
        canary[g.position(row, int(g.column0_canary)):g.position(row, g.table.width)] = False
    return torch.equal(g.flat[canary], g.canaries(0, len(g.flat))[canary])


class ReplayMachine(RuleBasedStateMachine):
    device = "cpu"
    runner_class = GraphRunner

    @initialize(config=configs(sizing="safe", max_max_bs=4, max_ctx=16,
                               layout="production"))
    def capture(self, config):
        self.config = config
        self.runner = self.runner_class(config, resolve_kernel("reference", self.device), self.device, poison=False)
        self.runner.capture_all()
        self.previous = {g.table.name: g.flat.cpu().clone() for g in (self.runner.kv_indices, self.runner.kv_indptr)}
        self.replays = 0

    @rule(data=st.data())
    def replay(self, data):
        batch = data.draw(batches(self.config))
        obs = self.runner.run(batch)
        # Nothing touched the buffers between two replays.
        for name in ("kv_indices", "kv_indptr"):
            assert torch.equal(obs.before[name], self.previous[name]), f"{name} changed between replays"
        findings = host_verdict(obs)
        assert findings == [], f"{len(findings)} finding(s):\n" + "\n".join(f.headline() for f in findings)
        self.previous = obs.after
        self.replays += 1

    @invariant()
    def guards_intact(self):
        if hasattr(self, "runner"):
            # Column 0 of kv_indptr is never written: it still holds the canary kvfence put there (production
            # zeroes it).
            assert guards_intact(self.runner.kv_indices) and guards_intact(self.runner.kv_indptr)


class StalePaddingRunner(GraphRunner):
    """The bug class 'padded rows not reset': only the real requests are copied into the static inputs,
    so padded rows keep an earlier, larger batch's lengths and pool rows."""

    def run(self, batch: Batch):
        lb = Case(self.config, batch).launch()
        inputs = self.inputs
        inputs.load(self.config, batch, lb)
        if getattr(self, "_stale", None) is not None:
            raw = lb.raw_bs
            lens, rows = self._stale
            inputs.seq_lens[raw:len(lens)] = lens[raw:]
            inputs.req_pool_indices[raw:len(rows)] = rows[raw:]
        self._stale = (inputs.seq_lens.clone(), inputs.req_pool_indices.clone())
        launch = self._bucket_launch(lb.num_seqs)
        return self._observe(batch, lb, inputs, self.kv_indices, self.kv_indptr, launch)


def run_machine(device, runner_class, max_examples, **kw):
    machine = type("Machine", (ReplayMachine,), {"device": device, "runner_class": runner_class})
    run_state_machine_as_test(machine, settings=settings(max_examples=max_examples, stateful_step_count=8,
                                                        deadline=None, derandomize=True, **kw))


def test_replays_that_grow_and_shrink_keep_the_contract(device):
    run_machine(device, GraphRunner, max_examples=8 if device == "cpu" else 200)


def test_a_runner_that_leaves_padded_rows_stale_is_caught(device):
    # Detection is the point here, not a minimal example: no shrinking.
    with pytest.raises(AssertionError, match="finding"):
        run_machine(device, StalePaddingRunner, max_examples=60, phases=[Phase.generate])
