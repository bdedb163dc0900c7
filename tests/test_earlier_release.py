"""Case files and summaries written by the release before the contract interface (6ce69b5: ``kvfence fuzz --sizing
prefix`` and ``kvfence fuzz --contract flashmla-page-table --sizing context``, seed 0, on the CPU; committed as
written, their absolute paths included) replay and render with today's code."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EARLIER = ROOT / "tests" / "fixtures" / "release_6ce69b5"


def kvfence(*argv, cwd):
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.interpreter
@pytest.mark.parametrize("run", ["draft", "flashmla"])
def test_an_earlier_releases_case_file_replays_with_the_kinds_it_recorded(run, tmp_path):
    (case,) = sorted((EARLIER / run / "cases").glob("*.json"))
    recorded = sorted({f["kind"] for f in json.loads(case.read_text())["findings"]})
    proc = kvfence("repro", str(case), "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"the file recorded {len(recorded)}: {', '.join(recorded)}" in proc.stdout, proc.stdout


@pytest.mark.parametrize("run", ["draft", "flashmla"])
def test_an_earlier_releases_summary_renders(run, tmp_path):
    folder = tmp_path / run
    shutil.copytree(EARLIER / run, folder)
    proc = kvfence("report", str(folder), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the run had findings: the report says so
    kinds = sorted({f["kind"] for f in json.loads((folder / "summary.json").read_text())["findings"]})
    report = (folder / "report.md").read_text()
    assert all(kind in report for kind in kinds), report[:2000]
    assert (folder / "report.html").stat().st_size > 0
