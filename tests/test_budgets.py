"""Budgets hold when every case is hard: a run whose every case crashes ends within one worker restart of
its budget (``kvfence.engine.loop``: the one-case re-runs after a crash stop once the budget is spent)."""

import time

from hypothesis import strategies as hst

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.record import launch_of
from kvfence.engine.findings import Finding, Kind
from kvfence.engine.keepgoing import fuzz_keep_going
from kvfence.engine.loop import fuzz
from kvfence.engine.plan import RunPlan

CONFIG = Config(topk=1, num_steps=1, page_size=1, ctx=64, max_bs=1)
#: One example: 32 batches of one config (the engine's launches), every one of which kills the worker.
EXAMPLE = [launch_of(Case(CONFIG, Batch((length,), (0,), 0))) for length in range(1, 33)]


class EveryCaseCrashes:
    """A checking worker (``kvfence.engine.supervisor.RemoteSession``'s ``check_many`` contract) whose every
    case (``crashes(launch)``: by default every one) kills it: the list dies, then each case re-runs alone
    and dies too, each death a restart of ``RESTART_S``; ``enough`` stops the re-runs as the real one does.
    With ``one_at_a_time`` each case goes in a message of its own from the start (no list death)."""

    STOPS_EARLY = True
    RESTART_S = 0.1

    def __init__(self, crashes=lambda case: True):
        self.crashes = crashes
        self.restarts = 0
        self.calls = []  # (cases in the list, one_at_a_time, restarts it cost)
        self.stats = {}

    def check(self, case):
        if not self.crashes(case):
            return []
        time.sleep(self.RESTART_S)
        self.restarts += 1
        return [Finding(Kind.CRASH, "kernel", "launch", detail="the checking worker died with SIGSEGV")]

    def check_many(self, cases, enough=None, one_at_a_time=False):
        before = self.restarts
        if not one_at_a_time and any(map(self.crashes, cases)):
            time.sleep(self.RESTART_S)
            self.restarts += 1  # the list's own death
        out = [None] * len(cases)
        for i, case in enumerate(cases):
            out[i] = self.check(case)
            if (one_at_a_time or any(map(self.crashes, cases))) and enough is not None and enough(out[i]):
                break
        self.calls.append((len(cases), one_at_a_time, self.restarts - before))
        return out


def test_a_first_failure_costs_two_restarts_not_one_per_case():
    """Exploring without --keep-going, an example fails at its first failing case: the re-runs stop there."""
    session = EveryCaseCrashes()
    result = fuzz(session, hst.just(EXAMPLE), RunPlan(max_examples=1, seed=0, targeting=False, shrink_seconds=0))
    assert [f.kind for f in result.findings] == [Kind.CRASH]
    assert session.restarts == 2 and result.verified_cases == 1


def test_keep_going_over_a_kernel_whose_every_case_crashes_ends_within_a_restart_of_its_budgets():
    """--keep-going checks every case of an example (a known failure passes), so an example of 32 crashing
    cases costs 33 restarts (3.3 s here). The explore budget (1 s) and the shrink budget (0.5 s) still
    hold within about one restart, and the crash is kept."""
    session = EveryCaseCrashes()
    start = time.monotonic()
    result = fuzz_keep_going(session, hst.just(EXAMPLE), RunPlan(max_examples=50, seed=0, max_seconds=1.0,
                                                                 targeting=False, shrink_seconds=0.5))
    elapsed = time.monotonic() - start
    assert elapsed < 1.0 + 0.5 + 3 * EveryCaseCrashes.RESTART_S + 0.5, (elapsed, session.restarts)
    assert [f.kind for f in result.findings] == [Kind.CRASH] and result.time_cut


def test_a_crash_is_shrunk_one_case_per_message_so_each_crashing_candidate_costs_one_restart():
    """Shrinking a CRASH, every candidate list is checked one case per message (``one_at_a_time``): a
    candidate that crashes costs one restart, where the list's death and then its re-run alone cost two.
    Exploring still sends whole lists (one device round trip). Every case of two or more requests crashes
    here; the shrink reaches the minimal case (two requests)."""
    session = EveryCaseCrashes(crashes=lambda launch: len(launch.case.batch.seq_lens) >= 2)
    session.RESTART_S = 0.0
    config = Config(topk=1, num_steps=1, page_size=1, ctx=64, max_bs=6)
    batches = hst.lists(hst.integers(1, 64), min_size=1, max_size=6).map(
        lambda ls: launch_of(Case(config, Batch(tuple(ls), tuple(range(len(ls))), 0))))
    result = fuzz(session, hst.lists(batches, min_size=2, max_size=4),
                  RunPlan(max_examples=200, seed=0, targeting=False, shrink_seconds=30))
    assert [f.kind for f in result.findings] == [Kind.CRASH]
    assert len(result.case.case.batch.seq_lens) == 2 and not result.shrink_cut
    first = next(i for i, call in enumerate(session.calls) if call[2])  # the first list that crashed
    assert not any(alone for _, alone, _ in session.calls[:first + 1])  # exploring: whole lists
    shrink = session.calls[first + 1:]
    assert shrink and all(alone for _, alone, _ in shrink), session.calls
    assert session.calls[first][2] == 2  # the first failure: the list's death, then the case alone
    assert {restarts for _, _, restarts in shrink} <= {0, 1}, shrink  # a crashing candidate: one restart


def test_max_seconds_counts_from_the_commands_start_and_still_checks_one_example(tmp_path, device):
    """``fuzz --max-seconds S`` bounds the command's wall time, start-up included (the clock starts when the
    command did, ``KVFENCE_COMMAND_START``): a command that started longer than S ago explores one example (a
    budget spent in start-up never ends a run with no verdict) and stops, where before it explored for S more
    seconds from its fuzz loop's own start."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, KVFENCE_COMMAND_START=repr(time.time() - 60))
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--device", device, "--jobs", "1", "--max-seconds",
                           "20", "--quiet", "--out", str(tmp_path / "out")], env=env, capture_output=True, text=True,
                          timeout=300)
    wall = time.perf_counter() - t0
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["examples"] == 1 and summary["ended_by"] == "time", \
        {k: summary.get(k) for k in ("examples", "ended_by")}
    assert wall < 20, wall  # the 20 s were spent before the command's loop began: not given again
