"""Two runs into one ``--out`` (kvfence.engine.outlock): the second is refused with one line naming the first,
so neither loses the other's findings; a lock left by a run that died is taken over with a note."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvfence.engine.findings import Kind

pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parent.parent
CRASHERS = ROOT / "tests" / "targets" / "crashers.py"
SMALL = ["--device", "cpu", "--mode", "eager", "--topk", "2", "--num-steps", "1", "--ctx", "6", "--max-bs", "2",
         "--seed", "1", "--quiet", "--database", "none"]


def env(**extra):
    e = dict(os.environ, **extra)
    e.pop("TRITON_INTERPRET", None)
    return e


def fuzz(*args, **popen):
    return subprocess.Popen([sys.executable, "-m", "kvfence", "fuzz", *map(str, args)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def test_a_second_run_into_a_busy_folder_is_refused_and_the_first_keeps_its_findings(tmp_path):
    out, marker = tmp_path / "out", tmp_path / "launches"
    first = fuzz("--kernel", f"{CRASHERS}:slow_wrong", "--out", out, "--max-examples", "20", "--shrink-seconds", "15",
                 *SMALL, env=env(KVFENCE_TEST_MARKER=str(marker)))
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():  # the first run is checking cases: it holds the folder
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.05)
        second = fuzz("--sizing", "prefix", "--out", out, "--max-examples", "5", *SMALL, env=env())
        stdout, stderr = second.communicate(timeout=300)
        assert first.poll() is None  # refused while the first one was still running
        assert second.returncode == 2, (stdout, stderr)
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and f"pid {first.pid}" in lines[0] and "started" in lines[0], stderr
        assert "in use by another kvfence run" in lines[0] and "Traceback" not in stderr
        out1, err1 = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 1, (out1, err1)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["kernel"].endswith("slow_wrong")  # the second run replaced nothing
    assert {f["kind"] for f in summary["findings"]} == {Kind.VALUE_MISMATCH.value}
    assert all(Path(p).exists() for p in summary["cases"])
    # The lock ends with the run: the next one goes ahead without any note.
    third = fuzz("--out", out, "--max-examples", "3", *SMALL, env=env())
    _, err3 = third.communicate(timeout=300)
    assert third.returncode == 0 and "lock" not in err3, err3


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_note(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from kvfence.engine import outlock; "
                               f"outlock.acquire({str(out)!r}, print); print('held', flush=True); time.sleep(600)"],
                              cwd=ROOT, env=env(PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        busy = fuzz("--out", out, "--max-examples", "3", *SMALL, env=env())
        _, err = busy.communicate(timeout=300)
        assert busy.returncode == 2 and f"pid {holder.pid}" in err
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    finally:
        holder.kill()
    after = fuzz("--out", out, "--max-examples", "3", *SMALL, env=env())
    stdout, err = after.communicate(timeout=300)
    assert after.returncode == 0, (stdout, err)
    note = [line for line in err.splitlines() if "took over the lock" in line]
    assert len(note) == 1 and f"pid {holder.pid}" in note[0]
    assert json.loads((out / "summary.json").read_text())["findings"] == []
