"""The mutation self-test (kvfence.selftest.mutants, ``python -m kvfence mutants``): every shipped mutant is
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
#: docs/contract.md §6 paths the shipped mutants must cover: window clip, sink, recent start, entry-page
#: arithmetic, translation, the rail's prefix/chain split and indptr, the rail's sizing.
FAMILY = {"window_offsets_unclipped", "window_sinks_dropped", "window_recent_off_by_one", "entry_page_no_offset",
          "translate_page_unscaled", "translate_negative_unclipped", "rail_prefix_from_start", "rail_chain_from_zero",
          "rail_indptr_without_chain", "sizing_window_no_topk"}
#: Scale classes (issue: GPU-scale domain): bugs that appear only past a copy block, a lane width, a page of 64.
SCALE = {"copy_first_block_only", "prefix_sum_16_lanes", "indptr_sum_64_branches", "page_last_capped_64"}


def test_shipped_mutants_are_well_formed(device):
    from kvfence.selftest.mutants import discover
    from kvfence.contracts.draft.targets import resolve_kernel, resolve_sizing

    mutants = discover()
    assert len(mutants) >= 16 and REQUIRED | SCALE | FAMILY <= {m.name for m in mutants}
    assert {m.name for m in mutants if m.contract == "window-rail"} == {
        "rail_prefix_from_start", "rail_chain_from_zero", "rail_indptr_without_chain", "sizing_window_no_topk"}
    assert {m.name for m in mutants if m.domain == "gpu"} == SCALE
    assert {m.kind for m in mutants} == {"kernel", "sizing"}
    for m in mutants:
        assert m.bug.startswith("Mutant (")
        assert m.detects and "LAUNCH_ERROR" not in m.detects  # a shipped bug is a wrong write, not a crash
        if m.kind == "kernel":
            assert resolve_kernel(m.kernel, device).request_axis == 1  # a classic-ABI @triton.jit kernel
        else:
            assert resolve_sizing(m.sizing)(2, 2, 8, 2, window_size=3) >= 1


def test_every_mutant_is_detected_and_the_reference_is_clean(device):
    """``kvfence mutants`` as users run it (its seed, example budget and memory budget: the budget shapes
    the draws) catches every CPU mutant; the reference stays clean. (The scale mutants need sizes the
    interpreter never draws: their rows would spend the whole budget each, a third of this test's time, to
    show a miss; the GPU self-test runs them.)"""
    from kvfence.cli import build_parser
    from kvfence.selftest.mutants import discover, run_all

    args = build_parser().parse_args(["mutants"])
    assert (args.seed, args.seeds, args.max_examples, args.max_gpu_mem) == (0, 1, None, None)
    # The reference over 20 draws per contract (the CLI's default doubles the mutants' budget): its
    # clean verdict over the full domain is tests/test_properties.py's; here it is the pair of each row.
    report = run_all(device, reference_examples=20, seeds=[args.seed],
                     names=[m.name for m in discover() if m.name not in SCALE])
    missed = [m.name for m in report.mutants if m.expected and not m.detected]
    assert not missed, f"mutants not detected: {missed}"
    assert all(m.expected for m in report.mutants)
    # One reference row per contract the mutants break (docs/contract.md §6): draft and window-rail.
    assert [r.detected for r in report.reference] == [False, False]
    assert report.passed
    by_name = {m.name: m for m in report.mutants}
    assert all(m.examples_to_detection >= 1 and m.kinds for m in report.mutants if m.expected)
    assert "SIZING_VIOLATION" in by_name["sizing_missing_topk"].kinds
    assert "INDPTR_MISMATCH" in by_name["no_z0_rule"].kinds
    assert "OOB_READ" in by_name["row_from_request_index"].kinds


def test_a_mutant_that_is_not_a_bug_fails_the_self_test(device, tmp_path):
    """The pair of the test above: a correct kernel posing as a mutant is not 'detected'."""
    from kvfence.selftest.mutants import run_all

    src = (ROOT / "kernels" / "draft" / "mutants" / "off_by_one_n.py").read_text()
    # The same patch site, "mutated" into the correct line: a kernel identical in behaviour.
    fixed = src.replace("\"    n = s  # BUG: the spec's n is s + 1\\n\"", "'    n = (s + 1)\\n'")
    assert fixed != src
    (tmp_path / "not_a_bug.py").write_text(fixed)
    shutil.copy(ROOT / "kernels" / "draft" / "mutants" / "no_z0_rule.py", tmp_path / "no_z0_rule.py")
    # The reference rows are not what this test is about: one draw each.
    report = run_all(device, max_examples=10, seeds=[0, 1], directory=tmp_path, reference_examples=1)
    by_name = {m.name: m for m in report.mutants}
    assert by_name["no_z0_rule"].rate == 1.0 and by_name["not_a_bug"].detections == 0
    assert by_name["not_a_bug"].budget == 10 and by_name["not_a_bug"].seeds == [0, 1]
    assert not report.passed


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "kvfence", "mutants", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_cli_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "m.json"
    proc = run_cli("--device", "cpu", "--json", str(out), "--only", "no_z0_rule", "sizing_missing_topk",
                   "--max-examples", "10", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].split()[:5] == ["mutant", "kind", "domain", "ran", "on"]
    assert "PASS: 2/2 mutants detected in >= 95% of 1 seed(s) on their domain, reference clean" in proc.stdout
    assert "clean (expected)" in proc.stdout
    data = json.loads(out.read_text())
    assert [m["name"] for m in data["mutants"]] == ["no_z0_rule", "sizing_missing_topk"]
    for m in data["mutants"]:
        assert {"name", "detected", "rate", "examples_to_detection", "kinds", "seconds"} <= set(m) and m["detected"]
    assert [r["detected"] for r in data["reference"]] == [False] and data["passed"] is True


def test_cli_unknown_mutant_is_one_line_exit_2():
    proc = run_cli("--device", "cpu", "--only", "no_such_mutant")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "unknown mutant" in proc.stderr


def test_a_mutant_is_detected_only_by_the_kinds_it_declares(device, tmp_path):
    """A patch that does not compile fails every launch (LAUNCH_ERROR, which it does not declare): no
    seed detects it and the self-test fails; the same bug declared by its real kinds is detected. The
    reference control runs under every seed."""
    from kvfence.selftest.mutants import run_all

    src = (ROOT / "kernels" / "draft" / "mutants" / "off_by_one_n.py").read_text()
    broken = src.replace("\"    n = s  # BUG: the spec's n is s + 1\\n\"", "'    n = no_such_name\\n'")
    assert broken != src
    (tmp_path / "does_not_compile.py").write_text(broken)
    shutil.copy(ROOT / "kernels" / "draft" / "mutants" / "off_by_one_n.py", tmp_path / "off_by_one_n.py")
    report = run_all(device, max_examples=5, seeds=[0, 1], directory=tmp_path, reference_examples=3)
    by_name = {m.name: m for m in report.mutants}
    assert by_name["does_not_compile"].detections == 0
    assert by_name["does_not_compile"].undeclared == [["LAUNCH_ERROR"], ["LAUNCH_ERROR"]]
    assert by_name["off_by_one_n"].rate == 1.0 and set(by_name["off_by_one_n"].kinds) & {"MISSING_WRITE", "INDPTR_MISMATCH"}
    assert not report.passed
    assert [r.seeds for r in report.reference] == [[0, 1]]


@pytest.mark.parametrize("line, message", [("", "DETECTS must be a non-empty tuple"),
                                           ("DETECTS = ()", "DETECTS must be a non-empty tuple"),
                                           ("DETECTS = ('VALUE_MISMATCH', 'WRONG_KIND')", "unknown kind(s) WRONG_KIND"),
                                           ("DETECTS = 'VALUE_MISMATCH'", "DETECTS must be a non-empty tuple")])
def test_a_mutant_file_without_valid_detects_is_bad_input(tmp_path, line, message):
    from kvfence.errors import BadInput
    from kvfence.selftest.mutants import discover

    src = (ROOT / "kernels" / "draft" / "mutants" / "sizing_missing_topk.py").read_text()
    lines = [l for l in src.splitlines() if not l.startswith("DETECTS")]
    (tmp_path / "m.py").write_text("\n".join(lines + [line]) + "\n")
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        discover(tmp_path)


# -- benchmarks/plain_fuzz_mutants.py: the plain command per mutant and seed -----------------------------
def _plain_benchmark():
    import importlib.util

    sys.path.insert(0, str(ROOT / "benchmarks"))  # its sibling result_file.py
    spec = importlib.util.spec_from_file_location("kvfence_plain_fuzz_mutants", ROOT / "benchmarks" / "plain_fuzz_mutants.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look it up there
    spec.loader.exec_module(module)
    return module


def test_plain_benchmark_pins_each_run_to_its_own_gpu_and_cores(tmp_path, monkeypatch):
    """--parallel: disjoint cores per slot, one GPU each, and a started run really is held to them (its
    affinity mask and CUDA_VISIBLE_DEVICES, read back by the child itself); more runs than cores or GPUs
    is refused."""
    import os

    from kvfence.errors import BadInput

    bench = _plain_benchmark()
    usable = sorted(os.sched_getaffinity(0))
    monkeypatch.setattr(bench, "_gpu_count", lambda: len(usable))
    layout = bench.slots(len(usable), 1, None, "cuda")
    assert [s["gpu"] for s in layout] == list(range(len(usable)))
    assert sorted(c for s in layout for c in s["cpus"]) == usable
    with pytest.raises(BadInput, match="needs"):
        bench.slots(len(usable) + 1, 1, None, "cpu")
    monkeypatch.setattr(bench, "_gpu_count", lambda: 1)
    with pytest.raises(BadInput, match="has 1 GPU"):
        bench.slots(1, 1, [1], "cuda")
    with pytest.raises(BadInput, match="names 1 GPUs for --parallel 2"):
        bench.slots(2, 1, [0], "cuda")
    # One GPU named twice: two runs share it, each on its own cores.
    shared = bench.slots(2, 1, [0, 0], "cuda")
    assert [s["gpu"] for s in shared] == [0, 0] and not set(shared[0]["cpus"]) & set(shared[1]["cpus"])
    probe = tmp_path / "probe"
    run = bench.Run("probe", 0, [sys.executable, "-c", "import os, sys; sys.stderr.write(repr((sorted("
                                 "os.sched_getaffinity(0)), os.environ.get('CUDA_VISIBLE_DEVICES'))))"], probe)
    bench._start(run, {"gpu": 5, "cpus": [usable[-1]]}, 0)
    assert run.proc.wait(timeout=60) == 0
    assert run.stderr.read_text() == repr(([usable[-1]], "5"))


@pytest.mark.long
def test_plain_benchmark_compares_the_default_with_the_bulk_on(tmp_path):
    """``--compare-bulk N``: every mutant and seed again with ``--bulk-per-example N``, a row of its own; the
    kill table holds both rows' search times and whether the bulk was slower, ``bulk_comparison`` the counts."""
    out = tmp_path / "bulk.json"
    proc = subprocess.run([sys.executable, "benchmarks/plain_fuzz_mutants.py", "--device", "cpu", "--seeds", "2",
                           "--parallel", "2", "--cores-per-run", "1", "--reference-seeds", "0", "--only",
                           "indptr_without_drafts", "--compare-bulk", "4", "--json", str(out), "--",
                           "--max-examples", "15"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    on = doc["mutants"]["indptr_without_drafts [--bulk-per-example 4]"]
    assert on["detected"] == 2 and on["flags"][-2:] == ["--bulk-per-example", "4"]
    assert "--bulk-per-example" not in doc["mutants"]["indptr_without_drafts"]["command"]
    entry = doc["kill_search_s"]["indptr_without_drafts"]
    assert list(doc["kill_search_s"]) == ["indptr_without_drafts"] and entry["median_bulk_on"] == on["median_search_s"]
    assert entry["bulk_slower"] == (on["median_search_s"] > entry["median"])
    assert doc["bulk_comparison"] == {"flags": ["--bulk-per-example", "4"], "mutants": 1,
                                      "slower_with_bulk": int(entry["bulk_slower"]),
                                      "faster_with_bulk": int(on["median_search_s"] < entry["median"])}
    bad = subprocess.run([sys.executable, "benchmarks/plain_fuzz_mutants.py", "--device", "cpu", "--compare-bulk", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--compare-bulk 0" in bad.stderr, bad.stderr


@pytest.mark.long
def test_plain_benchmark_detects_a_mutant_and_keeps_the_reference_clean(tmp_path):
    """Two runs at once on the CPU: a mutant detected under both seeds by a kind it declares, the
    reference clean, one results file with the rates and the commands. The plan is measured in two
    sittings: the first is cut after the runs it started (``--max-seconds``), ``--resume`` runs only
    what it lacks into the same file; a resume of another plan is refused in one line."""
    out = tmp_path / "plain.json"
    base = [sys.executable, "benchmarks/plain_fuzz_mutants.py", "--device", "cpu", "--seeds", "2",
            "--parallel", "2", "--cores-per-run", "1", "--reference-seeds", "1", "--only", "indptr_without_drafts"]
    extra = ["--", "--max-examples", "15"]
    first = subprocess.run(base + ["--max-seconds", "0.5", "--json", str(out)] + extra,
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    doc = json.loads(out.read_text())
    assert doc["cut"] is True and doc["mutants"]["indptr_without_drafts"]["seeds_run"] == [0], first.stdout
    assert first.returncode == 3 and "INCOMPLETE" in first.stdout and doc["passed"] is False  # one seed of two
    proc = subprocess.run(base + ["--resume", str(out)] + extra, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "PASS" in proc.stdout, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    row = doc["mutants"]["indptr_without_drafts"]
    assert row["seeds_run"] == [0, 1] and doc["reference"]["reference (draft)"]["seeds_run"] == [0]
    assert row["detected"] == 2 and row["rate"] == 1.0 and row["passed"] and row["median_first_failure_s"] > 0
    assert set(row["kinds"]) & set(row["detects"]) and "--seed SEED" in row["command"]
    # Each detection says how many examples its failing job took and what that job's session spent.
    assert all(1 <= n <= 15 for n in row["examples_to_failure"]) and len(row["examples_to_failure"]) == 2
    assert all(set(w) == {"compiles", "compile_s", "runner_s", "captures", "capture_s"} and w["runner_s"] > 0
               for w in row["failing_job_work"])
    assert doc["reference"]["reference (draft)"]["clean"] is True and doc["passed"] is True and doc["cut"] is False
    assert [s["cut"] for s in doc["sessions"]] == [True, False] and "--resume" in doc["sessions"][1]["command"]
    assert doc["wall_s"] == pytest.approx(sum(s["wall_s"] for s in doc["sessions"]), abs=0.2)
    assert len(doc["slots"]) == 2 and doc["command"].startswith("python benchmarks/plain_fuzz_mutants.py")
    other = subprocess.run([a if a != "2" or i != base.index("--seeds") + 1 else "3" for i, a in enumerate(base)]
                           + ["--resume", str(out)] + extra, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert other.returncode == 2 and other.stderr.count("\n") == 1 and "its seeds is 2" in other.stderr, other.stderr
    # A cut file of other code is not continued: its figures would mix two codes.
    doc["code"]["digest"], doc["complete"] = "0" * 64, False
    out.write_text(json.dumps(doc))
    older = subprocess.run(base + ["--resume", str(out)] + extra, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert older.returncode == 2 and older.stderr.count("\n") == 1 and "other code" in older.stderr, older.stderr
