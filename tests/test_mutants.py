"""The mutation self-test (kvfence.selftest.mutants, ``python -m kvfence mutants``): every shipped mutant of the
draft kernel and the window rail (their records' ``mutants``, from ``kernels/draft/mutants/``) is detected under
its fixed example budget, and the reference stays clean under the same configs."""

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


def _records():
    from kvfence.contracts.draft.record import DRAFT, WINDOW_RAIL

    return DRAFT, WINDOW_RAIL


def test_shipped_mutants_are_well_formed(device):
    from kvfence.contracts.draft.sizing import resolve_sizing
    from kvfence.contracts.draft.targets import resolve_kernel
    from kvfence.engine.record_check import static_problems

    draft, rail = _records()
    mutants = draft.mutants + rail.mutants
    assert len(mutants) >= 16 and REQUIRED | SCALE | FAMILY <= {m.name for m in mutants}
    assert {m.name for m in rail.mutants} == {
        "rail_prefix_from_start", "rail_chain_from_zero", "rail_indptr_without_chain", "sizing_window_no_topk"}
    assert {m.name for m in mutants if m.domain == "gpu"} == SCALE
    # Each file is one bug: a patch of the reference kernel, or the reference under a buggy sizing.
    assert all(bool(m.patch) != bool(m.sizing) and m.kernel is None for m in mutants)
    assert {bool(m.patch) for m in mutants} == {True, False}
    for record in (draft, rail):
        assert static_problems(record.name, f"kvfence.contracts.draft:{record.name}", record) == []
    for m in mutants:
        assert m.doc.startswith("Mutant (")
        assert m.detects and "LAUNCH_ERROR" not in m.detects  # a shipped bug is a wrong write, not a crash
        if m.patch:
            assert resolve_kernel(f"mutant:{m.name}", device).request_axis == 1  # a classic-ABI @triton.jit kernel
        else:
            assert resolve_sizing(m.sizing)(2, 2, 8, 2, window_size=3) >= 1


def test_every_mutant_is_detected_and_the_reference_is_clean(device):
    """``kvfence mutants`` as users run it (its seed, example budget and memory budget: the budget shapes
    the draws) catches every CPU mutant of the draft kernel and the rail; the reference stays clean. (The scale
    mutants need sizes the interpreter never draws: their rows would spend the whole budget each, a third of this
    test's time, to show a miss; the GPU self-test runs them.)"""
    from kvfence.cli import build_parser
    from kvfence.selftest.mutants import self_test

    args = build_parser().parse_args(["mutants"])
    assert (args.seed, args.seeds, args.max_examples, args.max_gpu_mem) == (0, 1, None, None)
    # The reference rows run the same budget as the mutants (its clean verdict over the full domain is
    # tests/test_properties.py's; here it is the pair of each row).
    reports = [self_test(record, device, seeds=[args.seed], max_examples=args.max_examples,
                         names=[m.name for m in record.mutants if m.name not in SCALE]) for record in _records()]
    rows = [r for report in reports for r in report["rows"]]
    mutants = [r for r in rows if not r["reference"]]
    missed = [r["name"] for r in mutants if r["expected"] and not r["detections"]]
    assert not missed, f"mutants not detected: {missed}"
    assert all(r["expected"] for r in mutants)
    # One reference row per contract the mutants break (docs/contract.md §6): draft and window-rail.
    assert [(r["name"], r["detections"]) for r in rows if r["reference"]] == [("reference (draft)", 0),
                                                                             ("reference (window-rail)", 0)]
    assert all(report["passed"] and report["complete"] for report in reports)
    by_name = {r["name"]: r for r in mutants}
    assert all(r["median_examples_to_detection"] >= 1 and r["runs"][0]["kinds"] for r in mutants)
    assert "SIZING_VIOLATION" in by_name["sizing_missing_topk"]["runs"][0]["kinds"]
    assert "MISSING_WRITE" in by_name["no_z0_rule"]["runs"][0]["kinds"]
    assert "OOB_READ" in by_name["row_from_request_index"]["runs"][0]["kinds"]


def _planted(monkeypatch, directory: Path):
    """The draft record with the mutant files of ``directory`` as its planted bugs, read as the shipped ones are
    read from ``kernels/draft/mutants/``. In this process only: its self-test checks in-process (``isolate``
    off), where ``mutant:NAME`` resolves against this record."""
    import kvfence.contracts.draft.mutants as draft_mutants
    import kvfence.contracts.draft.record as draft_record

    monkeypatch.setattr(draft_mutants, "MUTANTS_DIR", directory)
    monkeypatch.setattr(draft_record.DRAFT, "mutants", draft_mutants.mutants("draft"))
    return draft_record.DRAFT


@pytest.mark.long  # about 20-40 s of CPU; CI's 20 minutes (tox -e long runs it)
def test_a_mutant_that_is_not_a_bug_fails_the_self_test(device, tmp_path, monkeypatch):
    """The pair of the test above: a correct kernel posing as a mutant is not 'detected'."""
    from kvfence.selftest.mutants import self_test

    src = (ROOT / "kernels" / "draft" / "mutants" / "off_by_one_n.py").read_text()
    # The same patch site, "mutated" into the correct line: a kernel identical in behaviour.
    fixed = src.replace("\"    n = s  # BUG: the spec's n is s + 1\\n\"", "'    n = (s + 1)\\n'")
    assert fixed != src
    (tmp_path / "not_a_bug.py").write_text(fixed)
    shutil.copy(ROOT / "kernels" / "draft" / "mutants" / "no_z0_rule.py", tmp_path / "no_z0_rule.py")
    record = _planted(monkeypatch, tmp_path)
    assert [m.name for m in record.mutants] == ["no_z0_rule", "not_a_bug"]
    report = self_test(record, device, max_examples=10, seeds=[0, 1], isolate=False)
    by_name = {r["name"]: r for r in report["rows"]}
    assert by_name["no_z0_rule"]["rate"] == 1.0 and by_name["not_a_bug"]["detections"] == 0
    assert report["max_examples"] == 10 and [r["seed"] for r in by_name["not_a_bug"]["runs"]] == [0, 1]
    assert all(r["examples"] == 10 for r in by_name["not_a_bug"]["runs"])  # the whole budget, nothing found
    assert not by_name["not_a_bug"]["passed"] and by_name["reference (draft)"]["passed"]
    assert not report["passed"]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "kvfence", "mutants", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_cli_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "m.json"
    proc = run_cli("--device", "cpu", "--contract", "draft", "--json", str(out), "--only", "no_z0_rule",
                   "sizing_missing_topk", "--max-examples", "10", "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0].split()[:4] == ["target", "domain", "ran", "on"]
    assert ("PASS: contract draft: 2/2 mutants detected in >= 95% of 1 seed(s) on their domain, references clean"
            in proc.stdout)
    assert "clean (expected)" in proc.stdout
    data = json.loads(out.read_text())
    assert list(data["contracts"]) == ["draft"] and data["passed"] is True
    rows = data["contracts"]["draft"]["rows"]
    mutants = [r for r in rows if not r["reference"]]
    assert [m["name"] for m in mutants] == ["no_z0_rule", "sizing_missing_topk"]
    for m in mutants:
        assert {"name", "detections", "rate", "median_examples_to_detection", "runs", "seconds"} <= set(m)
        assert m["detections"] == 1 and m["passed"] and set(m["runs"][0]["kinds"]) & set(m["detects"])
    assert [(r["name"], r["detections"]) for r in rows if r["reference"]] == [("reference (draft)", 0)]


def test_cli_unknown_mutant_is_one_line_exit_2():
    proc = run_cli("--device", "cpu", "--contract", "draft", "--only", "no_such_mutant")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "unknown mutant" in proc.stderr
    # Mutant names are a contract's: --only without --contract is refused the same way.
    proc = run_cli("--device", "cpu", "--only", "no_z0_rule")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--contract" in proc.stderr


def test_a_mutant_is_detected_only_by_the_kinds_it_declares(device, tmp_path, monkeypatch):
    """A patch that does not compile fails every launch (LAUNCH_ERROR, which it does not declare): no
    seed detects it and the self-test fails; the same bug declared by its real kinds is detected. The
    reference control runs under every seed."""
    from kvfence.selftest.mutants import self_test

    src = (ROOT / "kernels" / "draft" / "mutants" / "off_by_one_n.py").read_text()
    broken = src.replace("\"    n = s  # BUG: the spec's n is s + 1\\n\"", "'    n = no_such_name\\n'")
    assert broken != src
    (tmp_path / "does_not_compile.py").write_text(broken)
    shutil.copy(ROOT / "kernels" / "draft" / "mutants" / "off_by_one_n.py", tmp_path / "off_by_one_n.py")
    record = _planted(monkeypatch, tmp_path)
    report = self_test(record, device, max_examples=5, seeds=[0, 1], isolate=False)
    by_name = {r["name"]: r for r in report["rows"]}
    assert by_name["does_not_compile"]["detections"] == 0
    assert [(r["kinds"], r["declared"]) for r in by_name["does_not_compile"]["runs"]] == [(["LAUNCH_ERROR"], False)] * 2
    assert by_name["off_by_one_n"]["rate"] == 1.0
    assert all(set(r["kinds"]) & {"MISSING_WRITE", "VALUE_MISMATCH"} for r in by_name["off_by_one_n"]["runs"])
    assert not report["passed"]
    assert [r["seed"] for r in by_name["reference (draft)"]["runs"]] == [0, 1]


@pytest.mark.parametrize("line, message", [("", "DETECTS must be a non-empty tuple"),
                                           ("DETECTS = ()", "DETECTS must be a non-empty tuple"),
                                           ("DETECTS = ('VALUE_MISMATCH', 'WRONG_KIND')",
                                            "detects WRONG_KIND, which no kind declares"),
                                           ("DETECTS = 'VALUE_MISMATCH'", "DETECTS must be a non-empty tuple")])
def test_a_mutant_file_without_valid_detects_is_bad_input(tmp_path, monkeypatch, line, message):
    """A mutant file's ``DETECTS`` is checked where the record reads it (one line, ``BadInput``) or by the check
    every record load runs (``kvfence.engine.record_check``): never a traceback, never a mutant no kind detects."""
    import kvfence.contracts.draft.mutants as draft_mutants
    import kvfence.contracts.draft.record as draft_record
    from kvfence.engine.record_check import static
    from kvfence.errors import BadInput

    src = (ROOT / "kernels" / "draft" / "mutants" / "sizing_missing_topk.py").read_text()
    lines = [text for text in src.splitlines() if not text.startswith("DETECTS")]
    (tmp_path / "m.py").write_text("\n".join(lines + [line]) + "\n")
    monkeypatch.setattr(draft_mutants, "MUTANTS_DIR", tmp_path)
    with pytest.raises(BadInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        record = draft_record.DraftContract("draft", draft_record.DRAFT.doc, "draft_kv_indices",
                                            "generate_draft_decode_kv_indices")
        static("draft", "kvfence.contracts.draft:DRAFT", record)


# -- benchmarks/plain_fuzz_mutants.py: the plain command per mutant and seed -----------------------------
def _plain_benchmark():
    import importlib.util

    sys.path.insert(0, str(ROOT / "benchmarks"))  # its sibling result_file.py
    spec = importlib.util.spec_from_file_location("kvfence_plain_fuzz_mutants",
                                                  ROOT / "benchmarks" / "plain_fuzz_mutants.py")
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
