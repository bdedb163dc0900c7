"""The API and the pytest plugin never run a plug-in kernel in the test's own process (docs/security.md):
an import that exits, aborts or raises ``KeyboardInterrupt`` is ``BadInput`` (the plugin: a usage error,
exit 4), and a launch that exits, aborts, raises ``KeyboardInterrupt`` or never returns is a ``CRASH`` or
``HANG`` finding with a case file, so the test fails instead of ending pytest green, red or not at all."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvfence
from kvfence.errors import BadInput

pytestmark = [pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
CRASHERS = ROOT / "tests" / "targets" / "crashers.py"
HOSTILE_IMPORTS = {"exit": "import os\nos._exit(0)\n", "abort": "import os\nos.abort()\n",
                   "interrupt": "raise KeyboardInterrupt\n",
                   # Left to run later, in whichever process imported the plug-in (kvfence.engine.import_probe):
                   "thread": "import os, threading, time\n"
                             "threading.Thread(target=lambda: (time.sleep(1.5), os._exit(0)), daemon=True).start()\n",
                   "lingering-thread": "import os, threading, time\n"
                                       "threading.Thread(target=lambda: (time.sleep(30), os._exit(0)), "
                                       "daemon=True).start()\n",
                   "atexit": "import atexit, os\natexit.register(lambda: os._exit(0))\n"}
LAUNCH = "\ndef launch(**kw):\n    pass\n"


#: Each misbehaving launcher (tests/targets/crashers.py) and the finding kind its case must fail with.
MISBEHAVING = [("exit_zero", "LAUNCH_ERROR"), ("hard_exit", "CRASH"), ("abort", "CRASH"), ("interrupt", "CRASH"),
               ("spin", "HANG")]


def check_a_misbehaving_launch(launcher: str, kind: str, tmp_path: Path, **options) -> dict:
    """``check_kernel`` on ``launcher`` fails with ``kind`` and a case file holding it; the case file's record."""
    spec = f"{CRASHERS}:{launcher}"
    if launcher == "interrupt":
        (tmp_path / "kbd.py").write_text("def launch(**kw):\n    raise KeyboardInterrupt\n")
        spec = f"{tmp_path / 'kbd.py'}:launch"
    with pytest.raises(AssertionError) as info:
        kvfence.check_kernel(spec, max_examples=3, out_dir=tmp_path / "o", shrink_seconds=2, **options)
    text = str(info.value)
    assert kind in text and "repro: python -m kvfence repro" in text
    case = Path(text.split("case file: ", 1)[1].split("\n", 1)[0])
    record = json.loads(case.read_text())
    assert case.is_file() and kind in {f["kind"] for f in record["findings"]}
    return record


@pytest.mark.parametrize("launcher, kind", MISBEHAVING)
def test_check_kernel_turns_a_misbehaving_launch_into_a_failing_case(launcher, kind, tmp_path):
    check_a_misbehaving_launch(launcher, kind, tmp_path, case_timeout=3)


def test_check_kernel_passes_the_reference_in_its_worker(tmp_path):
    kvfence.check_kernel("reference", max_examples=3, out_dir=tmp_path / "o")
    assert not (tmp_path / "o" / "cases").exists()


@pytest.mark.parametrize("what", sorted(HOSTILE_IMPORTS))
def test_check_kernel_refuses_a_plug_in_whose_import_ends_its_process(what, tmp_path):
    (tmp_path / "k.py").write_text(HOSTILE_IMPORTS[what] + LAUNCH)
    with pytest.raises(BadInput, match="importing kernel"):
        kvfence.check_kernel(f"{tmp_path / 'k.py'}:launch", max_examples=2, out_dir=tmp_path / "o")


def _pytest(tmp_path, *args, timeout=300):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    for name in ("PYTEST_XDIST_WORKER", "HYPOTHESIS_PROFILE", "KVFENCE_KERNEL", "KVFENCE_SIZING"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("what", ["exit", "thread", "atexit"])
def test_the_plugin_refuses_a_kernel_option_whose_import_ends_pytest(tmp_path, what):
    """An import that ends the process, or leaves a thread or an exit handler that does (1.5 s later, or
    when pytest exits), is a usage error: pytest exit 4, never a session that ends 0 with no output."""
    (tmp_path / "k.py").write_text(HOSTILE_IMPORTS[what] + LAUNCH)
    (tmp_path / "test_x.py").write_text("def test_nothing():\n    pass\n")
    proc = _pytest(tmp_path, "--kvfence-kernel", "k.py:launch", "--kvfence-device", "cpu")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # a usage error, not a silent exit 0
    assert "kvfence: importing kernel 'k.py:launch' ends the process" in proc.stderr


@pytest.mark.parametrize("body, code", [("import os\n    os._exit(0)", 4), ("return n * topk * (ctx + num_steps)", 0)])
def test_the_plugin_asks_a_sizing_option_behind_the_boundary_before_pytest_calls_it(tmp_path, body, code):
    """``--kvfence-sizing file.py:attr`` is called in pytest's own process where a test draws cases: it is asked
    about a few drawn cases behind the boundary first, so one whose call ends its process is a usage error naming
    the sizing and the call (pytest exit 4), never a session that ends 0 with no output; a correct one passes."""
    (tmp_path / "sz.py").write_text(f"def width(n, topk, ctx, num_steps):\n    {body}\n")
    (tmp_path / "test_x.py").write_text("def test_nothing():\n    pass\n")
    proc = _pytest(tmp_path, "--kvfence-sizing", "sz.py:width", "--kvfence-device", "cpu")
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert code == 0 or "kvfence: sizing 'sz.py:width': its call for n=1" in proc.stderr, proc.stderr


@pytest.mark.parametrize("what", ["thread", "atexit"])
def test_fuzz_refuses_a_kernel_whose_import_leaves_an_exit_behind(tmp_path, what):
    """The same for ``fuzz``: one line, exit 2 (it ran to exit 0 with no output, or printed its findings
    and exited 0); the clean plug-in beside it runs (``test_check_kernel_passes_the_reference_in_its_worker``)."""
    (tmp_path / "k.py").write_text(HOSTILE_IMPORTS[what] + LAUNCH)
    proc = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--device", "cpu", "--kernel", "k.py:launch",
                           "--max-examples", "3", "--out", str(tmp_path / "o"), "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 2 and "ends the process (exit status 0)" in proc.stderr, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_the_session_fixture_checks_a_plug_in_in_a_worker(tmp_path):
    """A user's test through ``kvfence_session`` on a launcher that never returns fails with HANG; the same
    test on the reference passes."""
    (tmp_path / "test_mine.py").write_text(
        "from kvfence.contracts.draft.case import Batch, Case, Config\n"
        "from kvfence.contracts.draft.record import launch_of\n\n"
        "def test_mine(kvfence_session, kvfence_kernel):\n"
        "    case = launch_of(Case(Config(topk=1, num_steps=1, ctx=4, max_bs=1, sizing='safe'), Batch((2,), (0,), 0),"
        " kvfence_kernel))\n"
        "    assert [f.kind.value for f in kvfence_session(kvfence_kernel, case_timeout=3).check(case)] == []\n")
    hang = _pytest(tmp_path, "--kvfence-kernel", f"{CRASHERS}:spin", "--kvfence-device", "cpu")
    assert hang.returncode == 1 and "HANG" in hang.stdout, hang.stdout + hang.stderr
    clean = _pytest(tmp_path, "--kvfence-kernel", f"{ROOT / 'kernels' / 'draft' / 'draft_kv_indices.py'}:"
                    "generate_draft_decode_kv_indices", "--kvfence-device", "cpu")
    assert clean.returncode == 0, clean.stdout + clean.stderr


GIVEN_TEST = """from hypothesis import given
from kvfence.strategies import cases, configs


@given(case=cases(configs(sizing="safe", max_ctx=24), kernel="mykern.py:generate_draft_decode_kv_indices"))
def test_my_kernel(case, kvfence_session):
    assert kvfence_session(case.kernel).check(case) == []
"""


def test_a_users_given_test_passes_under_hypothesis_defaults_and_fails_with_a_case_file(tmp_path):
    """docs/own-kernel.md's ``@given`` test, verbatim, in a project of its own (Hypothesis's default settings,
    100 examples, 200 ms deadline): it passes on kvfence's kernel; on a planted bug it fails, writes the
    shrunk case as a case file and prints its repro line, which replays."""
    import runpy

    (tmp_path / "test_mine.py").write_text(GIVEN_TEST)
    reference = (ROOT / "kernels" / "draft" / "draft_kv_indices.py").read_text()
    (tmp_path / "mykern.py").write_text(reference)
    clean = _pytest(tmp_path)
    assert clean.returncode == 0 and "1 passed" in clean.stdout, clean.stdout[-3000:]
    mutant = runpy.run_path(str(ROOT / "kernels" / "draft" / "mutants" / "last_row_past_end.py"))
    for old, new in mutant["PATCH"]:
        reference = reference.replace(old, new)
    (tmp_path / "mykern.py").write_text(reference)
    bad = _pytest(tmp_path)
    assert bad.returncode == 1 and "kvfence: replay this case" in bad.stdout, bad.stdout[-3000:]
    line = next(t for t in bad.stdout.splitlines() if t.startswith("python -m kvfence repro "))
    case = Path(bad.stdout.split("case file: ", 1)[1].split(" ", 1)[0])
    assert case.is_file() and case.parent == tmp_path / "reports" / "out" / "cases"
    replay = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TRITON_INTERPRET="1"))
    assert replay.returncode == 1, replay.stdout[-2000:] + replay.stderr[-2000:]


def test_a_hung_job_is_stopped_within_the_budget_and_named(tmp_path):
    """``--jobs``: a job that never returns (its sizing plug-in hangs past the parent's one-request probe)
    is stopped by the parent once the run's budget and ``JOB_OVERRUN_GRACE_S`` are spent, and named."""
    import time

    from kvfence.engine.jobs import JOB_OVERRUN_GRACE_S, STOP_WAIT_S

    out = tmp_path / "out"
    # --max-seconds counts from the command's start: the jobs' start-up (a few seconds) is inside it, and the
    # budget must leave them time to draw past the first, one-request example, where the sizing hangs.
    budget_s = 8
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--device", "cpu", "--jobs", "2", "--sizing",
                           str(ROOT / "tests" / "targets" / "sizings.py") + ":hangs_past_one_request",
                           "--max-seconds", str(budget_s), "--shrink-seconds", "0", "--seed", "0", "--out", str(out),
                           "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=240)
    wall = time.monotonic() - start
    assert wall < budget_s + JOB_OVERRUN_GRACE_S + STOP_WAIT_S + 20, (wall, proc.stderr)  # 20: start-up and merging
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a run with a stopped job is not a clean run
    assert "job 0 was still running" in proc.stderr and "grace" in proc.stderr, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert any("was still running" in p for p in summary["job_problems"])


def _children(pid: int) -> list:
    """The processes whose parent is ``pid`` (from /proc: a job the ``--jobs`` parent started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the jobs through /proc")
def test_a_ctrl_c_while_every_job_is_stopped_ends_the_run_within_its_grace_with_outputs(tmp_path):
    """``--jobs``: with every job frozen (SIGSTOP, as a debugger or a job-control slip leaves it), a Ctrl-C
    ends the run within ``GRACE_S + STOP_WAIT_S`` and merging: the parent continues and signals each job,
    kills what still does not stop, names it, and writes the summary, exit 130."""
    import signal
    import time

    from kvfence.engine.jobs import GRACE_S, STOP_WAIT_S

    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "kvfence", "fuzz", "--device", "cpu", "--jobs", "2",
                             "--max-seconds", "120", "--seed", "0", "--out", str(out), "--quiet"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TRITON_INTERPRET="1"))
    try:
        deadline = time.monotonic() + 90
        while len(list((out / "jobs").glob("*/progress.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # both jobs are checking cases
        jobs = _children(proc.pid)
        assert len(jobs) == 2 and proc.poll() is None, (jobs, proc.poll())
        for pid in jobs:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(0.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=GRACE_S + STOP_WAIT_S + 30)
        wall = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert wall < GRACE_S + STOP_WAIT_S + 15, (wall, stderr)  # 15: merging and the reports
    assert proc.returncode == 130, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == "SIGINT" and "jobs stopped" in stderr, stderr
    # Continued, each job stops on the SIGINT it is sent (a partial run), or is killed and named.
    stopped = [p for p in summary["job_problems"] if "did not stop" in p]
    assert all("killed" in p for p in stopped), summary["job_problems"]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="the target reads its job from /proc")
def test_a_job_in_a_long_check_does_not_hold_back_the_verdict_of_anothers_failure(tmp_path):
    """``--jobs 2``: job 0 finds a failure at once while job 1 sits in one long check (its launcher sleeps
    120 s: a large config compiling on a shared GPU). Job 1 reads the stop file only between examples, so
    once job 0 has ended the parent stops it (``AFTER_FAILURE_GRACE_S``): the run ends in seconds with job 0's
    failure and no job problem, not when job 1's check or the budget's grace runs out (75 s here). The
    correct kernel is the other half: the same command on it is clean (tests of --jobs above)."""
    import time

    out = tmp_path / "out"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--device", "cpu", "--jobs", "2",
                           "--kernel", f"{ROOT / 'tests' / 'targets' / 'job_split.py'}:wrong_in_job_0_slow_elsewhere",
                           "--max-seconds", "60", "--shrink-seconds", "2", "--case-timeout", "300", "--seed", "0",
                           "--no-audit", "--out", str(out), "--quiet"],
                          cwd=ROOT, capture_output=True, text=True, timeout=200,
                          env=dict(os.environ, TRITON_INTERPRET="1"))
    wall = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert "MISSING_WRITE" in {f["kind"] for f in summary["findings"]} and not summary["job_problems"]
    assert summary["interrupted"] is None and "Traceback" not in proc.stderr
    assert wall < 45, wall  # start-up, the failure and its 2 s shrink, the grace, the stop: not 75 s or 120 s
