"""The mutation self-test (harness.mutants, ``python -m harness mutants``): every shipped mutant is
detected under its fixed example budget, and the reference stays clean under the same configs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parents[1]
#: docs/contract.md §5 classes the shipped mutants must cover (file stems).
REQUIRED = {"off_by_one_n", "prefix_sum_inclusive", "no_z0_rule", "step_major_drafts", "paged_no_last",
            "bs_upper_small", "num_tokens_upper_small", "iter_upper_small", "indptr_stride_rows",
            "sizing_missing_topk", "sizing_draft_ctx", "last_row_past_end"}


def test_shipped_mutants_are_well_formed(device):
    from harness.mutants import discover
    from harness.targets import resolve_kernel, resolve_sizing

    mutants = discover()
    assert len(mutants) >= 12 and REQUIRED <= {m.name for m in mutants}
    assert {m.kind for m in mutants} == {"kernel", "sizing"}
    for m in mutants:
        assert m.bug.startswith("Mutant (")
        if m.kind == "kernel":
            assert resolve_kernel(m.kernel, device).request_axis == 1  # a classic-ABI @triton.jit kernel
        else:
            assert resolve_sizing(m.sizing)(2, 2, 8, 2) >= 1


def test_every_mutant_is_detected_and_the_reference_is_clean(device):
    from harness.mutants import run_all

    report = run_all(device, max_examples=30, seed=0)
    missed = [m.name for m in report.mutants if not m.detected]
    assert not missed, f"mutants not detected: {missed}"
    assert not report.reference.detected, report.reference.headline
    assert report.reference.examples == 60  # the whole budget ran clean
    assert report.passed
    by_name = {m.name: m for m in report.mutants}
    assert all(m.examples_to_detection >= 1 and m.kinds for m in report.mutants)
    assert "SIZING_VIOLATION" in by_name["sizing_missing_topk"].kinds
    assert "INDPTR_MISMATCH" in by_name["no_z0_rule"].kinds
    assert "OOB_READ" in by_name["row_from_request_index"].kinds


def test_a_mutant_that_is_not_a_bug_fails_the_self_test(device, tmp_path):
    """The pair of the test above: a correct kernel posing as a mutant is not 'detected'."""
    from harness.mutants import run_all

    src = (ROOT / "kernels" / "mutants" / "off_by_one_n.py").read_text()
    # The same patch site, "mutated" into the correct line: a kernel identical in behaviour.
    fixed = src.replace("\"    n = s  # BUG: the spec's n is s + 1\\n\"", "'    n = (s + 1)\\n'")
    assert fixed != src
    (tmp_path / "not_a_bug.py").write_text(fixed)
    shutil.copy(ROOT / "kernels" / "mutants" / "no_z0_rule.py", tmp_path / "no_z0_rule.py")
    report = run_all(device, max_examples=10, seed=0, directory=tmp_path)
    by_name = {m.name: m for m in report.mutants}
    assert by_name["no_z0_rule"].detected and not by_name["not_a_bug"].detected
    assert by_name["not_a_bug"].examples == 10
    assert not report.passed


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "harness", "mutants", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_cli_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "m.json"
    proc = run_cli("--device", "cpu", "--json", str(out), "--only", "no_z0_rule", "sizing_missing_topk",
                   "--max-examples", "10", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:4] == ["mutant", "kind", "verdict", "examples/budget"]
    # The reference is reported as what it should be, with the examples it ran out of its own budget.
    (ref,) = [line for line in lines if line.startswith("reference ")]
    assert "clean (expected)" in ref and "20/20" in ref and "not detected" not in ref
    assert "PASS: 2/2 mutants detected (budget 10 examples each), reference clean in 20 examples (budget 20)" \
        in proc.stdout
    data = json.loads(out.read_text())
    assert [m["name"] for m in data["mutants"]] == ["no_z0_rule", "sizing_missing_topk"]
    for m in data["mutants"]:
        assert {"name", "detected", "examples_to_detection", "kinds", "seconds"} <= set(m) and m["detected"]
    assert data["reference"]["detected"] is False and data["passed"] is True
    assert data["reference"]["examples"] == data["reference_examples"] == 20


def test_cli_unknown_mutant_is_one_line_exit_2():
    proc = run_cli("--device", "cpu", "--only", "no_such_mutant")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "unknown mutant" in proc.stderr
