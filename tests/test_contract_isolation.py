"""A plug-in contract's kernel runs in a checking worker (kvfence.workflow.contract_run.checking_worker): a
kernel that exits, aborts, raises KeyboardInterrupt or hangs is that case's CRASH or HANG finding, with a case
file that ``repro`` replays the same way, never the end of the run or a silent exit 0. Each hostile kernel is
paired with the correct one, which passes on the same engine. CPU: the interpreter runs a jit body as Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.cases import contract as registry

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TOY = FIXTURES / "toy_contract"


def _kvfence(*argv, cwd):
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.syspath_prepend(str(TOY))
    monkeypatch.setitem(registry._entry_points(), "toy-copy", "toy_contract:TOY")
    yield registry.get("toy-copy")
    registry._LOADED.pop("toy-copy", None)


@pytest.mark.parametrize("how, kind, detail", [
    ("exits", "CRASH", "exit status 0"), ("aborts", "CRASH", "SIGABRT"),
    ("interrupts", "CRASH", "KeyboardInterrupt"), ("hangs", "HANG", "no verdict after")])
def test_a_kernel_that_ends_or_stalls_its_process_is_a_finding_of_its_case(toy, how, kind, detail):
    """The toy contract's hostile kernels misbehave only on a request of length 3: the run goes on, and the
    failing case is one holding that request, named by the kind and the way the worker ended."""
    from kvfence.workflow.contract_run import fuzz

    result = fuzz(toy, f"{TOY / 'hostile_toy_kernels.py'}:{how}", "safe", "cpu", max_examples=50, seed=0,
                  case_timeout=2.5, shrink_seconds=1)
    assert result.failed and result.to_dict()["kinds"] == [kind], result.headlines
    assert 3 in result.case["lens"] and detail in result.headlines[0]


def test_the_correct_toy_kernel_passes_in_the_checking_worker(toy):
    from kvfence.workflow.contract_run import fuzz

    clean = fuzz(toy, "reference", "safe", "cpu", max_examples=30, seed=0, case_timeout=2.5)
    assert not clean.failed and clean.examples == 30


def test_fuzz_and_repro_of_a_kernel_that_exits_0_fail_with_its_crash_and_the_reference_passes(tmp_path):
    """The user's commands: ``fuzz --contract`` exits 1 with a CRASH case file, ``repro`` of it exits 1 with
    the CRASH (in one process each would have ended with status 0), the reference kernel passes the same
    case; a kernel whose import ends the process is one line and exit 2."""
    kernel = f"{FIXTURES / 'hostile_flashmla.py'}:exits"
    run = _kvfence("fuzz", "--contract", "flashmla-page-table", "--kernel", kernel, "--device", "cpu",
                   "--seed", "0", "--shrink-seconds", "1", "--out", str(tmp_path / "out"), "--quiet", cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "CRASH" in run.stdout and "died with exit status 0" in run.stdout
    case_file = next((tmp_path / "out" / "cases").glob("*.json"))
    assert [f["kind"] for f in json.loads(case_file.read_text())["findings"]] == ["CRASH"]
    again = _kvfence("repro", str(case_file), "--kernel", kernel, "--device", "cpu", cwd=tmp_path)
    assert again.returncode == 1 and "CRASH" in again.stdout and "reproduces" in again.stdout, again.stdout
    fixed = _kvfence("repro", str(case_file), "--kernel", "reference", "--device", "cpu", cwd=tmp_path)
    assert fixed.returncode == 0 and "passes" in fixed.stdout, fixed.stdout + fixed.stderr
    dies = _kvfence("fuzz", "--contract", "flashmla-page-table", "--kernel", f"{FIXTURES / 'exits_at_import.py'}:k",
                    "--device", "cpu", "--out", str(tmp_path / "out2"), cwd=tmp_path)
    assert dies.returncode == 2 and "the checking worker died while starting (exit status 0)" in dies.stderr
    assert "Traceback" not in dies.stderr and len(dies.stderr.strip().splitlines()) == 2  # the banner, the error
