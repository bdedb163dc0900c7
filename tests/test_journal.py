"""Crash safety: a fuzz process killed mid-launch leaves its case on disk, reported as CRASH."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.record import launch_of
from kvfence.engine import casefile, journal
from kvfence.engine.findings import Kind

ROOT = Path(__file__).resolve().parent.parent
#: A launcher plug-in (harness/contracts/draft/targets.py LAUNCH_KWARGS) that records the batch it got, then hangs or
#: aborts.
LAUNCHER = '''
import json, os, time

def _record(seq_lens):
    marker = os.environ["KVFENCE_TEST_MARKER"]
    with open(marker + ".tmp", "w") as fh:
        json.dump(seq_lens.tolist(), fh)
    os.replace(marker + ".tmp", marker)

def hang(*, req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions, topk, num_steps, page_size):
    _record(seq_lens)
    time.sleep(300)

def abort(*, req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions, topk, num_steps, page_size):
    _record(seq_lens)
    os.abort()
'''
# --in-process: the journal is about the fuzzing process itself dying mid-launch, which only happens when it
# launches the kernel (a worker's death is a CRASH finding at once: tests/test_worker.py).
SMALL = ["--in-process", "--device", "cpu", "--mode", "eager", "--topk", "2", "--num-steps", "1", "--ctx", "4",
         "--max-bs", "2", "--seed", "1", "--quiet"]


def harness(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "kvfence", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env, **kw)


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "dying.py"
    path.write_text(LAUNCHER)
    marker = tmp_path / "launched.json"
    env = dict(os.environ, KVFENCE_TEST_MARKER=str(marker))
    env.pop("TRITON_INTERPRET", None)
    return path, marker, env


def wait_for(path: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def crash_findings(summary_path: Path):
    summary = json.loads(summary_path.read_text())
    return [f for f in summary["findings"] if f["kind"] == Kind.CRASH.value]


@pytest.mark.cpu_only  # the fuzz subprocess runs --device cpu (the interpreter)
def test_sigkill_mid_launch_is_reported_as_crash_by_resume(tmp_path, plugin):
    launcher, marker, env = plugin
    out = tmp_path / "out"
    spec = f"{launcher}:hang"
    proc = subprocess.Popen([sys.executable, "-m", "kvfence", "fuzz", "--kernel", spec, "--out", str(out), *SMALL],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(marker)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    launched = json.loads(marker.read_text())
    assert len(list((out / journal.JOURNAL_DIR).glob("*" + journal.SUFFIX))) == 1  # the slot outlived its process

    res = harness("fuzz", "--resume", "--out", out, "--device", "cpu", env=env)
    assert res.returncode == 1, res.stderr
    assert "CRASH" in res.stdout and "CRASH" in res.stderr
    crashes = crash_findings(out / "summary.json")
    assert len(crashes) == 1 and crashes[0]["region"] == "launch"
    loaded = casefile.load_case(crashes[0]["case"])
    assert [f.kind for f in loaded.findings] == [Kind.CRASH]
    assert list(loaded.case.case.batch.seq_lens) == launched  # exactly the batch the dead process was launching
    assert loaded.case.kernel == spec and loaded.source == "journal"
    assert "died during this launch" in loaded.findings[0].detail
    assert not list((out / journal.JOURNAL_DIR).glob("*" + journal.SUFFIX))
    # Recovered once: a second --resume finds nothing.
    again = harness("fuzz", "--resume", "--out", out, "--device", "cpu", env=env)
    assert again.returncode == 0 and "0 crashed case(s)" in again.stdout


@pytest.mark.cpu_only  # the fuzz subprocess runs --device cpu (the interpreter)
def test_interpreter_abort_is_reported_by_the_next_run(tmp_path, plugin):
    launcher, marker, env = plugin
    out = tmp_path / "out"
    died = harness("fuzz", "--kernel", f"{launcher}:abort", "--out", out, *SMALL, env=env)
    assert died.returncode == -signal.SIGABRT
    launched = json.loads(marker.read_text())
    # The next ordinary run (the reference kernel, safe sizing: clean) reports the crash and exits 1.
    nxt = harness("fuzz", "--out", out, "--max-examples", "3", "--sizing", "safe", *SMALL, env=env)
    assert nxt.returncode == 1, nxt.stderr
    crashes = crash_findings(out / "summary.json")
    assert len(crashes) == 1
    assert list(casefile.load_case(crashes[0]["case"]).case.case.batch.seq_lens) == launched
    assert "CRASH" in (out / "report.md").read_text()


def test_a_live_process_slot_is_left_alone_and_a_clean_end_removes_it(tmp_path):
    case = launch_of(Case(Config(topk=2, num_steps=1, ctx=4, max_bs=2), Batch((3, 1), (2, 0), 7)))
    with journal.Journal(tmp_path, device="cpu") as j:
        j.begin(case)
        assert journal.recover(tmp_path) == []  # locked by us: alive
        assert j.path.read_bytes().startswith(journal.IN_FLIGHT)
        j.end()
        assert j.path.read_bytes().startswith(journal.DONE)
        slot = j.path
    assert not slot.exists()


def test_journal_overhead_per_case_is_small(tmp_path):
    cases = [launch_of(Case(Config(topk=2, num_steps=2, ctx=16, max_bs=4), Batch((i % 16 + 1, 3), (1, 0), i)))
             for i in range(2000)]
    with journal.Journal(tmp_path, device="cpu") as j:
        t0 = time.perf_counter()
        for case in cases:
            j.begin(case)
            j.end()
        per_case_us = (time.perf_counter() - t0) / len(cases) * 1e6
    print(f"journal overhead: {per_case_us:.1f} us per case")
    # Generous bound for a loaded CI box; measured ~10 us (README/BENCHMARKS).
    assert per_case_us < 500
