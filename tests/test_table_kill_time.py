"""``benchmarks/table_kill_time.py``: the kill-time benchmark over the table contracts' planted bugs (issue 56,
item 5's command; the GPU sitting runs it at full size) runs on the CPU with tiny settings and writes its file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]


def test_the_table_kill_time_benchmark_runs_on_the_cpu_with_tiny_settings(tmp_path):
    """One mutant of kvfence's own text (no wheel needed), one seed, the reference once: the plain command per
    run, the row ``CONTRACT.NAME`` detected with its search time, the reference clean, exit 0; rows are named per
    contract (mutant names repeat across them) and an unknown row is one line, exit 2."""
    out = tmp_path / "kill.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "table_kill_time.py"), "--device", "cpu",
                          "--seeds", "1", "--reference-seeds", "1", "--only", "trtllm-mha-page-table.one_page_more",
                          "--json", str(out), "--", "--max-examples", "20"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "PASS" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]
    doc = json.loads(out.read_text())
    row = doc["mutants"]["trtllm-mha-page-table.one_page_more"]
    assert row["detected"] == 1 and row["contract"] == "trtllm-mha-page-table" and row["search_s"][0] is not None
    assert "--kernel mutant:one_page_more --contract trtllm-mha-page-table" in row["command"]
    assert doc["reference"]["reference (trtllm-mha-page-table)"]["clean"] is True
    assert set(doc["kill_search_s"]) == {"trtllm-mha-page-table.one_page_more"}
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "table_kill_time.py"), "--device", "cpu",
                          "--only", "one_page_more"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "unknown mutant(s) one_page_more" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
