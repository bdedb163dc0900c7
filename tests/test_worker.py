"""The worker process (kvfence.engine.worker): crashes, hangs and exits of the kernel become findings, the
supervisor lives on, and only the guilty case of a ``check_many`` list is blamed."""

import os
import random
import signal
import threading
from pathlib import Path

import pytest

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.record import DRAFT, launch_of
from kvfence.contracts.draft.session import Session
from kvfence.engine.findings import Kind
from kvfence.engine.plan import RunPlan
from kvfence.engine.supervisor import RemoteSession
from kvfence.errors import BadInput

pytestmark = pytest.mark.cpu_only  # the plug-ins below crash the interpreter's process on purpose

TARGETS = Path(__file__).resolve().parent / "targets"
CRASHERS = TARGETS / "crashers.py"
CONFIG = Config(topk=2, num_steps=2, ctx=6, max_bs=2, sizing="safe", mode="eager")


def batch_cases(kernel: str, lengths, config: Config = CONFIG):
    return [launch_of(Case(config, Batch((L,), (1,), i), kernel=kernel)) for i, L in enumerate(lengths)]


def remote(device, kernel, *, contract="draft", case_timeout=None, audit=None, **session):
    """A checking worker of ``kernel`` under the plan a ``fuzz`` run of these settings makes."""
    plan = RunPlan(contract=contract, device=device, kernel=kernel, audit=audit,
                   **({"case_timeout": case_timeout} if case_timeout is not None else {}))
    return RemoteSession(plan, **session)


def kinds(results):
    return [sorted({f.kind.value for f in r}) for r in results]


def test_each_way_of_dying_is_blamed_on_its_own_case_and_the_correct_kernel_passes(device):
    """One list through a launcher that spins (L=2), segfaults (3), aborts (4), calls sys.exit (5) or
    os._exit (6): each case gets its own verdict, the others stay clean, the supervisor goes on."""
    spec = f"{CRASHERS}:misbehave"
    lengths = [1, 2, 3, 4, 5, 6, 1]
    with remote(device, spec, case_timeout=0.4, warmup_s=1.0) as rs:
        got = rs.check_many(batch_cases(spec, lengths))
        assert kinds(got) == [[], ["HANG"], ["CRASH"], ["CRASH"], ["LAUNCH_ERROR"], ["CRASH"], []]
        hang, segv, abrt, exit_, gone = (got[i][0].detail for i in range(1, 6))
        assert "--case-timeout" in hang and "SIGSEGV" in segv and "SIGABRT" in abrt
        assert "SystemExit: 3" in exit_ and "exit status 0" in gone
        assert rs.stats["hangs"] >= 1 and rs.stats["deaths"] >= 3  # (a stalled list, then the case alone)
        assert rs.check(batch_cases(spec, [1])[0]) == []  # a fresh worker carries on
    with remote(device, "reference", case_timeout=5) as rs:
        assert kinds(rs.check_many(batch_cases("reference", lengths))) == [[]] * len(lengths)
        assert rs.stats["worker_starts"] == 1  # one worker, reused for every case
    # In-process, sys.exit() in a launch is a LAUNCH_ERROR too (kvfence.contracts.draft.runner catches SystemExit).
    assert [f.kind for f in Session(device, spec).check(batch_cases(spec, [5])[0])] == [Kind.LAUNCH_ERROR]


def test_remote_findings_equal_in_process_findings(device):
    spec = f"{TARGETS / 'bad_writes.py'}:row_guard_write"
    config = Config(topk=2, num_steps=2, ctx=6, max_bs=2, sizing="safe")
    cases = batch_cases(spec, [1, 4, 6], config)
    local = [[f.to_dict() for f in Session(device, spec).check(c)] for c in cases]
    with remote(device, spec) as rs:
        far = [[f.to_dict() for f in r] for r in rs.check_many(cases)]
    assert far == local and all(local)


def test_a_drawn_page_table_reaches_the_worker_negative_pages_and_all(device):
    """translate_negative_unclipped needs a drawn table with a negative page: through the worker it is
    caught on the case that catches it in-process, and the reference passes there too."""

    spec = "mutant:translate_negative_unclipped"
    config = Config(topk=2, num_steps=2, page_size=4, ctx=16, max_bs=2, translate=True)
    from kvfence.contracts.draft.tokens import v2p_table

    seed = next(s for s in range(1, 500) if any(p < 0 for p in v2p_table(config, s)[:5]))
    case = launch_of(Case(config, Batch((16, 12), (1, 0), 3, seed), kernel=spec))
    local = sorted({f.kind.value for f in Session(device, spec).check(case)})
    with remote(device, spec) as rs:
        assert sorted({f.kind.value for f in rs.check(case)}) == local and "VALUE_MISMATCH" in local
    with remote(device, "reference") as rs:
        assert rs.check(launch_of(Case(config, case.case.batch))) == []


def test_a_kernel_that_cannot_be_loaded_is_bad_input_before_any_case(device, tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        remote(device, f"{tmp_path}/gone.py:launch")
    dying = tmp_path / "dies_on_import.py"
    dying.write_text("import os\nos.abort()\n")
    with pytest.raises(BadInput, match="died while starting"):
        remote(device, f"{dying}:launch")


@pytest.mark.long
def test_chaos_sigkill_at_random_moments_loses_no_failing_case(device):
    """SIGKILL the worker at random moments over 100 cases: every verdict is still the true one."""
    config = Config(topk=2, num_steps=1, ctx=6, max_bs=1, sizing="prefix", mode="eager")
    rng = random.Random(7)
    runtime = [Case(config, Batch((rng.randint(1, 6),), (rng.randint(0, 1),), i)) for i in range(100)]
    # The truth: under the prefix sizing (width ctx) a length L overflows when 2*L + 2 > 6.
    failing = {i for i, c in enumerate(runtime) if c.sizing_summary()["need"] > c.sizing_summary()["width"]}
    cases = [launch_of(c) for c in runtime]
    assert 10 < len(failing) < 90
    kills = []
    stop = threading.Event()
    with remote(device, "reference", case_timeout=5) as rs:
        def killer():
            # After each kill, wait for a verdict to come back before the next random moment, so the
            # run makes progress (a worker killed while it starts is retried a few times, not forever).
            chaos = random.Random(11)
            done = rs.stats["cases"]
            while len(kills) < 4 and not stop.wait(chaos.uniform(0.05, 0.6)):
                pid = rs.worker_pid
                if pid is None or rs.stats["cases"] == done:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                except ProcessLookupError:
                    pass
                done = rs.stats["cases"]

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            results = []
            for start in range(0, len(cases), 10):
                results += rs.check_many(cases[start:start + 10])
        finally:
            stop.set()
            thread.join()
    # The chaos really happened (how many kills land before the 100 cases are done depends on the load).
    assert kills and rs.stats["external_kills"] >= 1, (kills, rs.stats)
    lost = [i for i in failing if Kind.SIZING_VIOLATION not in {f.kind for f in results[i]}]
    assert lost == []
    # The killer waits for a verdict between kills, so no case dies the 3 times (EXTERNAL_RETRIES) that
    # would make it a CRASH: every verdict is the true one, clean cases included.
    assert [i for i, r in enumerate(results) if bool(r) != (i in failing)] == []
    assert not any(f.kind is Kind.CRASH for r in results for f in r)


def test_a_wild_store_without_the_audit_is_a_crash_and_with_it_an_oob_write(device):
    """The interpreter with --no-audit really writes host memory 256 GiB past kv_indices: the worker
    segfaults and the case is a CRASH. With the address audit (the default) the store is dropped and
    reported as OOB_WRITE, and the process never faults."""
    spec = f"{TARGETS / 'far_store.py'}:fault_on_3"
    cases = batch_cases(spec, [1, 3])
    with remote(device, spec, audit=False) as rs:
        got = rs.check_many(cases)
    assert kinds(got) == [[], ["CRASH"]] and "SIGSEGV" in got[1][0].detail
    with remote(device, spec) as rs:
        got = rs.check_many(cases)
    assert kinds(got)[0] == [] and "OOB_WRITE" in kinds(got)[1] and "CRASH" not in kinds(got)[1]


def test_the_one_case_reruns_after_a_crash_stop_once_enough_says_so(device):
    """A list whose every case crashes: after the list's death each case re-runs alone, and each is one
    more death. With ``enough`` (the fuzz loop's: a first failure, or a spent budget) the re-runs stop
    at the first CRASH and the rest keep no verdict: two deaths, not one per case."""
    spec = f"{CRASHERS}:segfault_on_3"
    cases = batch_cases(spec, [1, 3, 3, 3, 3])
    with remote(device, spec, spares=0) as rs:
        got = rs.check_many(cases, enough=bool)
        assert kinds(got[:2]) == [[], ["CRASH"]] and got[2:] == [None] * 3
        assert rs.stats["deaths"] == 2, rs.stats
        # One case per message from the start (the candidates of a CRASH being shrunk): one death.
        got = rs.check_many(cases, enough=bool, one_at_a_time=True)
        assert kinds(got[:2]) == [[], ["CRASH"]] and got[2:] == [None] * 3
        assert rs.stats["deaths"] == 3, rs.stats


def test_a_spare_warms_up_on_the_last_clean_case_and_one_that_fails_it_is_set_aside(device):
    """A spare started after a crash is sent the session's last clean case to check once ready (its config
    compiled and captured before it takes over): adopting it then counts a warm-up and verdicts stay true.
    A spare whose warm-up does not come back clean (here: a crashing case passed off as the last clean one)
    is discarded without a death counted, and a fresh worker takes the case."""
    spec = f"{CRASHERS}:segfault_on_3"
    clean, crash = batch_cases(spec, [1, 3])
    with remote(device, spec, spares=1) as rs:
        assert kinds([rs.check(clean), rs.check(crash), rs.check(clean)]) == [[], ["CRASH"], []]
        assert rs.stats["warm_ups"] == 1 and rs.stats["deaths"] == 1, rs.stats
        rs._last_clean = crash  # the spare started next warms up on a case that kills it
        assert kinds([rs.check(crash), rs.check(clean)]) == [["CRASH"], []]  # (the spare warmed before)
        assert rs.stats["deaths"] == 2 and rs.stats["warm_ups"] == 2, rs.stats
        assert kinds([rs.check(crash), rs.check(clean)]) == [["CRASH"], []]  # (that spare is set aside)
        assert rs.stats["deaths"] == 3 and rs.stats["warm_ups"] == 2 and rs.stats["worker_starts"] == 6, rs.stats


def test_a_dying_workers_output_goes_with_its_crash_not_to_the_terminal(device, capfd):
    """What a worker prints (here a kernel's prints and the abort text a dying CUDA context leaves) is
    not the terminal's: the dead worker's last lines are its case's CRASH finding's ``worker_output``
    (so its case file's), and a worker that ends cleanly has its prints relayed when it ends."""
    spec = f"{CRASHERS}:noisy_abort_on_3"
    with remote(device, spec, spares=0) as rs:
        got = rs.check_many(batch_cases(spec, [1, 3, 1]))
        assert kinds(got) == [[], ["CRASH"], []]
        crash = got[1][0]
        assert "terminate called after throwing" in crash.extra["worker_output"], crash.extra
        assert "is in the case file" in crash.detail and crash.to_dict()["extra"] == crash.extra
        assert "terminate called" not in capfd.readouterr().err  # nothing of it while the run goes on
    relayed = capfd.readouterr().err  # the replacement worker ended cleanly: its prints, once
    assert "kvfence: the checking worker printed:" in relayed and "launch of" in relayed, relayed
    assert "terminate called" not in relayed


def child_pids() -> set:
    me = os.getpid()
    try:
        return {int(p) for p in Path(f"/proc/{me}/task/{me}/children").read_text().split()}
    except OSError:
        return set()


@pytest.mark.long
def test_after_a_crash_a_spare_worker_takes_over_and_close_ends_every_worker(device):
    """Once a session has crashed, replacement workers start in the background (kvfence.engine.worker.SPARES):
    the next restart adopts one, verdicts stay the true ones, and close() leaves no process behind."""
    spec = f"{CRASHERS}:segfault_on_3"
    before = child_pids()
    for spares, used in ((0, 0), (1, 2)):
        with remote(device, spec, spares=spares) as rs:
            for _ in range(2):
                assert kinds([rs.check(c) for c in batch_cases(spec, [3, 1])]) == [["CRASH"], []]
            assert rs.stats["deaths"] == 2 and rs.stats["spares_used"] == used, rs.stats
            if spares:
                assert len(child_pids() - before) == 2  # the worker and one spare, already starting
        assert child_pids() - before == set()
    # A session that keeps dying (CRASHING_AFTER deaths: a crash being shrunk) keeps spares_crashing starting.
    with remote(device, spec, spares=1, spares_crashing=3) as rs:
        assert kinds([rs.check(c) for c in batch_cases(spec, [3, 1])]) == [["CRASH"], []]
        assert len(child_pids() - before) == 2  # one death: the worker and one spare
        assert kinds([rs.check(c) for c in batch_cases(spec, [3, 1])]) == [["CRASH"], []]
        assert len(child_pids() - before) == 4, rs.stats  # two deaths: the worker and three spares
    assert child_pids() - before == set()


def test_the_wire_form_keeps_every_batch_field():
    """The engine's wire form and the worker's decoder round-trip a launch exactly, the page table's seed included
    (a TRANSLATE case checked with another table than its own would be judged on the wrong case)."""
    import json

    from kvfence.engine.launch import from_record
    from kvfence.engine.workers import Wire

    config = Config(topk=1, num_steps=1, ctx=4, max_bs=2, translate=True)
    cases = [launch_of(Case(config, Batch((2, 1), (1, 0), 5, 77))), launch_of(Case(config, Batch((3,), (2,), 6, 0)))]
    wire = Wire(DRAFT)
    message = json.loads(json.dumps(wire.encode(cases)))
    decoded = [from_record(DRAFT, data) for data in message["launches"]]
    assert decoded == cases and [c.case.batch.v2p_seed for c in decoded] == [77, 0]
    assert message["groups"] == [0, 0]  # one config: one run the worker may batch


def test_a_crashing_session_gets_its_share_of_the_cores_in_spares(monkeypatch, tmp_path):
    """``crash_spares``: a run's process that keeps crashing keeps up to ``CRASH_SPARES`` starting on CUDA, no
    more than its share of the host's cores (the usable cores over the run's processes on the host), never
    fewer than ``SPARES``; a ``--jobs`` child is told how many processes share the host (``--host-jobs``)."""
    from kvfence import device
    from kvfence.engine import campaign
    from kvfence.engine.fuzzrun import Outputs, Run
    from kvfence.engine.workers import crash_spares

    monkeypatch.setattr(device, "usable_cores", lambda: 16)
    assert [crash_spares("cuda", n) for n in (1, 2, 4, 5, 8, 15)] == [4, 4, 4, 3, 2, 2]
    assert [crash_spares("cpu", n) for n in (1, 2)] == [1, 1]
    monkeypatch.setattr(device, "usable_cores", lambda: 2)
    assert crash_spares("cuda", 1) == 2
    run = Run(RunPlan(jobs=15, max_examples=30, out=str(tmp_path)), Outputs(), print, print)
    children = run.child_plans(3, campaign.parse_database("none"))
    assert len(children) == 15 and all(c.host_jobs == 15 and c.jobs == 1 for c in children)
