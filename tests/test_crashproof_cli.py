"""Crash-proof runs through the real CLI: a crashing kernel is a minimal CRASH case, signals end a run
with its results written, and --resume adds to a folder instead of replacing it."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvfence.engine import casefile, journal
from kvfence.engine.findings import Kind

pytestmark = pytest.mark.cpu_only  # the plug-ins crash or stall the interpreter's process on purpose

ROOT = Path(__file__).resolve().parent.parent
CRASHERS = ROOT / "tests" / "targets" / "crashers.py"
SMALL = ["--device", "cpu", "--mode", "eager", "--topk", "2", "--num-steps", "1", "--ctx", "6", "--max-bs", "2",
         "--seed", "1", "--quiet"]


def env_without_interpreter(**extra):
    env = dict(os.environ, **extra)
    env.pop("TRITON_INTERPRET", None)
    return env


def harness(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kvfence", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env or env_without_interpreter())


def all_json_valid(folder: Path) -> list:
    bad = []
    for p in folder.rglob("*.json"):
        try:
            json.loads(p.read_text())
        except ValueError:
            bad.append(p)
    return bad


def test_a_segfaulting_kernel_is_a_minimal_crash_case_and_repro_reports_it(tmp_path):
    out = tmp_path / "out"
    spec = f"{CRASHERS}:segfault_on_3"
    # The trigger (a first request of 3 tokens, not an edge length of this config) is one draw in about 20:
    # the budget is room to reach it, the run ends at the first failure.
    res = harness("fuzz", "--kernel", spec, "--out", out, "--max-examples", "300", *SMALL)
    assert res.returncode == 1, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [f["kind"] for f in summary["findings"]] == ["CRASH"]
    loaded = casefile.load_case(summary["findings"][0]["case"])
    # Shrunk like any failure: the one request of length 3 that kills the worker, smallest other fields.
    batch = loaded.case.case.batch  # the file's launch; its case is the draft's (config, batch)
    assert list(batch.seq_lens) == [3] and list(batch.req_pool_indices) == [0]
    assert batch.token_seed == 0 and "SIGSEGV" in loaded.findings[0].detail
    assert all_json_valid(out) == []
    # repro runs it in a worker: exit 1 with CRASH, never dies with the kernel. The plug-in named in the
    # file is named again on the command line (a case file's plug-ins are never imported on their own).
    rep = harness("repro", loaded.path, "--kernel", spec, "--device", "cpu")
    assert rep.returncode == 1 and "CRASH" in rep.stdout and "SIGSEGV" in rep.stdout, rep.stderr
    # The fixed kernel passes the same case.
    fixed = harness("repro", loaded.path, "--kernel", "reference", "--device", "cpu")
    assert fixed.returncode == 0 and "PASS" in fixed.stdout, fixed.stderr


def test_repro_never_imports_a_plugin_named_only_by_the_case_file(tmp_path):
    evidence = tmp_path / "imported"
    plugin = tmp_path / "evil.py"
    plugin.write_text(f"open({str(evidence)!r}, 'w').write('ran')\n"
                      "def launch(**kw):\n    pass\n")
    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.record import launch_of

    doc = json.loads(json.dumps(casefile.document(
        launch_of(Case(Config(topk=1, num_steps=1, ctx=4, max_bs=1), Batch((2,), (0,), 0))), [], device="cpu",
        source="test")))
    doc["case"]["kernel"] = f"{plugin}:launch"
    case = tmp_path / "case.json"
    case.write_text(json.dumps(doc))
    res = harness("repro", case, "--device", "cpu")
    assert res.returncode == 2 and not evidence.exists()
    line = res.stderr.strip().splitlines()[-1]
    assert "plug-in" in line and f"--kernel {plugin}:launch" in line and "--trust-case" in line
    doc["case"]["kernel"] = "reference"
    doc["case"]["sizing"] = f"{plugin}:launch"  # a launch's sizing (the file's "case" holds the launch)
    case.write_text(json.dumps(doc))
    res = harness("repro", case, "--device", "cpu")
    assert res.returncode == 2 and "--sizing" in res.stderr and not evidence.exists()
    # A builtin-only case file runs (the correct half of the pair).
    doc["case"]["sizing"] = "safe"
    case.write_text(json.dumps(doc))
    assert harness("repro", case, "--device", "cpu").returncode == 0


def signal_a_failing_run(tmp_path, out, sig, *extra):
    """Start a fuzz run of a kernel that fails slowly, send ``sig`` once a failing case has launched twice
    (Hypothesis is shrinking it from there), and return ``(process, stdout, stderr)`` once it has ended."""
    marker = tmp_path / "launches"
    env = env_without_interpreter(KVFENCE_TEST_MARKER=str(marker))
    proc = subprocess.Popen([sys.executable, "-m", "kvfence", "fuzz", "--kernel", f"{CRASHERS}:slow_wrong",
                             "--out", str(out), "--max-examples", "50", *extra, *SMALL], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (marker.exists() and len(marker.read_text()) >= 2):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        proc.kill()
    return proc, stdout, stderr


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_run_with_its_results_written(tmp_path, sig, code):
    out = tmp_path / "out"
    proc, stdout, stderr = signal_a_failing_run(tmp_path, out, sig)
    assert proc.returncode == code, (stdout, stderr)
    assert "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == sig.name
    assert {f["kind"] for f in summary["findings"]} == {Kind.VALUE_MISMATCH.value}
    loaded = casefile.load_case(summary["findings"][0]["case"])
    assert loaded.extras["interrupted"]["signal"] == sig.name and loaded.extras["interrupted"]["shrunk"] is False
    assert (out / "report.html").exists() and all_json_valid(out) == []
    # The journal is consistent: the interrupted case is not a crash for the next run.
    assert not list((out / journal.JOURNAL_DIR).glob("*" + journal.SUFFIX))
    again = harness("fuzz", "--resume", "--out", out, "--device", "cpu")
    assert again.returncode == 0 and "0 crashed case(s)" in again.stdout, again.stderr


def test_a_signal_to_a_jobs_run_merges_what_the_jobs_checked(tmp_path):
    """--jobs 2: SIGTERM to the parent stops both jobs the way one run stops (each writes its summary and
    its failure so far); the parent merges them into one summary and exits 143."""
    out = tmp_path / "out"
    proc, stdout, stderr = signal_a_failing_run(tmp_path, out, signal.SIGTERM, "--jobs", "2")
    assert proc.returncode == 143, (stdout, stderr)
    assert "Traceback" not in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "SIGTERM" and summary["jobs"] == 2 and not summary["job_problems"]
    children = [json.loads((out / "jobs" / f"job-{i}" / "summary.json").read_text()) for i in range(2)]
    assert summary["verified_cases"] == sum(c["verified_cases"] for c in children)
    assert Kind.VALUE_MISMATCH.value in {f["kind"] for f in summary["findings"]}
    assert all(Path(f["case"]).parent == out / "cases" for f in summary["findings"])
    assert (out / "report.html").exists() and all_json_valid(out) == []


def test_resume_adds_to_the_folder_instead_of_replacing_it(tmp_path):
    out = tmp_path / "out"
    first = harness("fuzz", "--sizing", "prefix", "--out", out, "--max-examples", "20", "--shrink-seconds", "5",
                    *SMALL)
    assert first.returncode == 1, first.stderr
    before = json.loads((out / "summary.json").read_text())
    assert before["findings"]
    res = harness("fuzz", "--resume", "--out", out, "--device", "cpu")
    assert res.returncode == 0, res.stderr  # nothing new was recovered
    after = json.loads((out / "summary.json").read_text())
    assert after["findings"] == before["findings"] and after["examples"] == before["examples"]
    assert after["resumed"] == 1
    # --resume with a flag it would ignore is refused (and touches nothing).
    bad = harness("fuzz", "--resume", "--out", out, "--device", "cpu", "--max-examples", "5", "--sizing", "fixed")
    assert bad.returncode == 2 and "--max-examples" in bad.stderr and "--sizing" in bad.stderr
    assert json.loads((out / "summary.json").read_text()) == after


def children(pid: int) -> list:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.mark.long
def test_chaos_sigkill_of_workers_during_a_fuzz_run_loses_no_failure_and_leaves_valid_json(tmp_path):
    """A fuzz run whose workers are SIGKILLed at random moments still reports its failure, and every
    file it leaves is valid JSON (no torn summary, case file or temp file)."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "kvfence", "fuzz", "--sizing", "prefix", "--out", str(out),
                             "--max-examples", "100", "--shrink-seconds", "20", *SMALL], cwd=ROOT,
                            env=env_without_interpreter(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rng = random.Random(3)
    killed, seen = [], {}
    try:
        while proc.poll() is None and len(killed) < 5:
            now = time.monotonic()
            for pid in children(proc.pid):  # each worker once, at a random moment of its life
                due = seen.setdefault(pid, now + rng.uniform(0.2, 3.0))
                if now >= due and pid not in killed:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 1, (stdout, stderr)
    assert killed, "no worker was killed: the chaos did not happen"
    summary = json.loads((out / "summary.json").read_text())
    assert Kind.SIZING_VIOLATION.value in {f["kind"] for f in summary["findings"]}
    assert Kind.CRASH.value not in {f["kind"] for f in summary["findings"]}
    # (A kill after the last case changes nothing, so how many were noticed is not asserted.)
    assert summary["worker"]["worker_starts"] >= 1
    assert all_json_valid(out) == [] and not list(out.rglob("*.tmp"))
    assert not list((out / journal.JOURNAL_DIR).glob("*" + journal.SUFFIX))
