"""``benchmarks/kill_time.py``: one command and one results file for the kill time of every contract's planted
bugs, the first verdict and the two verifiers (issue 65). The GPU sitting runs each part at full size; here a
plain part runs on the CPU with one mutant and one seed, cut before its first run and resumed, then skipped once
complete; a verifiers part adds its seeds to the same file (a long test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
ROW = "slot-mapping.tail_starts_one_late"


def _kill_time(tmp_path, *argv):
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "kill_time.py"), "--device", "cpu", *argv],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_a_part_is_cut_resumed_and_skipped_and_every_part_lands_in_one_file(tmp_path):
    out = tmp_path / "kill.json"
    part = ["--part", "r2t-slot", "--seeds", "1", "--reference-seeds", "1", "--only", ROW, "--json", str(out)]
    tiny = ["--", "--max-examples", "20"]
    cut = _kill_time(tmp_path, *part, "--max-seconds", "0", *tiny)
    assert cut.returncode == 3 and "CUT" in cut.stdout, cut.stdout[-2000:] + cut.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["parts"]["r2t-slot"]["complete"] is False and doc["complete"] is False
    assert doc["parts"]["r2t-slot"]["mutants"][ROW]["seeds_run"] == []
    other = [a if a != "1" else "2" for a in part]  # another plan: two seeds, two reference seeds
    refused = _kill_time(tmp_path, *other, "--resume", *tiny)
    assert refused.returncode == 2 and "its seeds is 1, this command's 2" in refused.stderr, refused.stderr[-2000:]
    assert len(refused.stderr.strip().splitlines()) == 1 and json.loads(out.read_text()) == doc
    resumed = _kill_time(tmp_path, *part, "--resume", *tiny)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    doc = json.loads(out.read_text())
    row = doc["parts"]["r2t-slot"]["mutants"][ROW]
    assert row["detected"] == 1 and row["search_s"][0] is not None and row["kinds"] == ["MISSING_WRITE"]
    assert "--kernel mutant:tail_starts_one_late --contract slot-mapping" in row["command"]
    assert doc["parts"]["r2t-slot"]["reference"]["reference (slot-mapping)"]["clean"] is True
    assert len(doc["parts"]["r2t-slot"]["sessions"]) == 2
    assert doc["kill_search_s"][ROW]["median"] == row["median_search_s"]
    assert doc["kill_targets"]["mutants"] == 1 and doc["code"]["digest"]
    assert doc["kill_where"][ROW]["examples_to_failure"] == row["examples_to_failure"][0] >= 1
    again = _kill_time(tmp_path, *part, "--resume", *tiny)
    assert again.returncode == 0 and "is complete" in again.stdout
    assert json.loads(out.read_text())["parts"]["r2t-slot"]["sessions"] == doc["parts"]["r2t-slot"]["sessions"]
    assert doc["complete"] is False  # the other parts are not run


@pytest.mark.long
def test_a_verifiers_part_adds_its_seeds_beside_a_plain_part(tmp_path):
    """Five ``mutants --verifiers both`` side by side (the reference only, one config each), into a file that
    holds a plain part: both parts and their totals in the one file."""
    out = tmp_path / "kill.json"
    plain = _kill_time(tmp_path, "--part", "r2t-slot", "--seeds", "1", "--reference-seeds", "0", "--only", ROW,
                       "--json", str(out), "--", "--max-examples", "20")
    assert plain.returncode == 0, plain.stdout[-2000:] + plain.stderr[-2000:]
    verifiers = _kill_time(tmp_path, "--part", "verifiers-0-4", "--json", str(out), "--", "--only", "reference",
                           "--max-examples", "1")
    assert verifiers.returncode == 0, verifiers.stdout[-2000:] + verifiers.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["verifiers"] == {str(s): True for s in range(5)}
    assert set(doc["parts"]) == {"r2t-slot", "verifiers-0-4"} and ROW in doc["kill_search_s"]
    assert doc["complete"] is False  # the other parts are not run


def test_an_unknown_mutant_of_a_part_is_one_line_exit_2(tmp_path):
    bad = _kill_time(tmp_path, "--part", "pages", "--only", "slot-mapping.tail_starts_one_late")
    assert bad.returncode == 2 and "unknown mutant(s) slot-mapping.tail_starts_one_late" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
