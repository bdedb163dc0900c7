"""``python -m kvfence fuzz`` as a user runs it: exit codes, the JSON summary, one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def kvfence(*args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "kvfence", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.cpu_only
def test_fuzz_catches_the_seed_bug_and_writes_the_summary(tmp_path):
    out = tmp_path / "s.json"
    proc = kvfence("fuzz", "--sizing", "prefix", "--device", "cpu", "--max-examples", "200", "--seed", "1",
                   "--json", str(out), "--out", str(tmp_path / "out"))
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(out.read_text())
    assert {"examples", "elapsed_s", "cases_per_s", "findings"} <= set(summary)
    kinds = {f["kind"] for f in summary["findings"]}
    assert kinds & {"GUARD_OVERWRITE", "STRAY_WRITE"}
    assert all({"kind", "region", "case"} <= set(f) for f in summary["findings"])
    assert "GUARD_OVERWRITE" in proc.stdout


@pytest.mark.cpu_only
def test_fuzz_fixed_sizing_with_draft_headroom_is_clean(tmp_path):
    proc = kvfence("fuzz", "--sizing", "fixed", "--seq-len-limit", "ctx-steps", "--device", "cpu",
                   "--max-examples", "40", "--seed", "2", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no findings" in proc.stdout


@pytest.mark.cpu_only
def test_auto_device_says_it_falls_back_to_the_interpreter(tmp_path):
    proc = kvfence("fuzz", "--device", "auto", "--max-examples", "3", "--seed", "0", "--quiet",
                   "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "Triton interpreter" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["fuzz", "--sizing", "huge"], "unknown sizing 'huge'"),
    (["fuzz", "--max-examples", "0"], "--max-examples"),
    (["fuzz", "--mode", "lazy"], "--mode"),
    pytest.param(["fuzz", "--kernel", "no_such_module:kernel", "--device", "cpu"], "cannot import kernel",
                 marks=pytest.mark.cpu_only),
    (["frobnicate"], "invalid choice"),
])
def test_usage_errors_are_one_line_and_exit_2(args, message):
    proc = kvfence(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
