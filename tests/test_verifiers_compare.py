"""The device verifier and the oracle path compared on dirty cases (``kvfence.contracts.draft.compare``,
``python -m kvfence mutants --verifiers both``).

Each planted bad write must be seen by both paths the same way (verdict, counter, findings), the clean
reference must be clean on both, and a verifier that is blind to one region must be reported as a
disagreement: the comparison can fail. On the CPU the device verifier runs eagerly under the Triton
interpreter; the ``gpu`` test runs the same comparison with compiled kernels inside CUDA graphs.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.contracts.draft import compare, compare_rows
from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.device_verify import COUNTERS, DeviceVerifier
from kvfence.contracts.draft.session import Session
from kvfence.engine.findings import Finding, Kind

ROOT = Path(__file__).resolve().parents[1]
PLANTED = compare.PLANTED_FILE

#: A graph-mode case whose bucket (2) is smaller than max_bs (4): every plant has a place to land,
#: rows past the bucket included.
CONFIG = Config(topk=2, num_steps=2, ctx=8, max_bs=4, sizing="safe")
BATCH = Batch((5, 3), (2, 0), 11)

#: One plant per region kind and per input tensor -> (the counter that must see it, the oracle's kind).
PLANTS = {
    "kvi_value": ("kv_indices", Kind.VALUE_MISMATCH),
    "kvi_missing": ("kv_indices", Kind.MISSING_WRITE),
    "kvi_slack": ("outside", Kind.STRAY_WRITE),
    "kvi_row_overflow": ("outside", Kind.GUARD_OVERWRITE),
    "kvi_tail": ("outside", Kind.GUARD_OVERWRITE),
    "indptr_column0_zero": ("outside", Kind.STRAY_WRITE),
    "indptr_bs": ("kv_indptr", Kind.VALUE_MISMATCH),
    "seq_lens_past": ("inputs", Kind.STRAY_WRITE),
    "req_pool_indices_live": ("inputs", Kind.STRAY_WRITE),
    "positions_bucket_end": ("inputs", Kind.STRAY_WRITE),
    "req_to_token_first": ("inputs", Kind.STRAY_WRITE),
    "req_to_token_front_guard": ("inputs", Kind.STRAY_WRITE),
    "req_to_token_tail": ("inputs", Kind.STRAY_WRITE),
}


def case_for(kernel: str, layout: str = "redzone") -> Case:
    return Case(Config(**{**CONFIG.to_dict(), "buckets": CONFIG.buckets, "layout": layout}), BATCH, kernel)


def test_the_reference_is_clean_on_both_paths(device):
    result = compare.Paths(device, "reference").check(case_for("reference"))
    assert result.agree, result.problems
    assert result.counters == [0, 0, 0, 0] and not result.oracle and not result.device


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_each_planted_write_is_seen_the_same_way_on_both_paths(device, plant):
    counter, kind = PLANTS[plant]
    result = compare.Paths(device, f"{PLANTED}:{plant}").check(case_for(f"{PLANTED}:{plant}"))
    assert result.agree, (result.problems, result.to_dict())
    assert result.counters[COUNTERS.index(counter)] > 0, result.counters
    assert kind in {f.kind for f in result.oracle}, [f.headline() for f in result.oracle]
    assert compare_rows.named(result.device) == compare_rows.named(result.oracle) != []


def blind_device_verifier(monkeypatch, counter: str) -> None:
    """A broken device verifier: its ``counter`` always reads zero (the buggy half of a detection pair)."""
    real = DeviceVerifier.total_counters

    def blind(self, cases):
        counts = real(self, cases)
        counts[COUNTERS.index(counter)] = 0
        return counts

    monkeypatch.setattr(DeviceVerifier, "total_counters", blind)


def test_a_verifier_blind_to_one_region_is_a_disagreement(device, monkeypatch):
    """The detection test: the device verifier with its ``outside`` counter forced to zero misses a slack
    write, and the comparison says so; the same blind verifier still agrees on a wrong value (another
    counter), so the report points at the blind region, not at everything."""
    blind_device_verifier(monkeypatch, "outside")
    slack = compare.Paths(device, f"{PLANTED}:kvi_slack").check(case_for(f"{PLANTED}:kvi_slack"))
    assert not slack.agree
    assert "device verdict clean, oracle verdict dirty" in slack.problems
    assert slack.device == [] and Kind.STRAY_WRITE in {f.kind for f in slack.oracle}
    value = compare.Paths(device, f"{PLANTED}:kvi_value").check(case_for(f"{PLANTED}:kvi_value"))
    assert value.agree, value.problems


def test_the_run_reports_a_blind_verifier_with_both_finding_lists(device, monkeypatch):
    blind_device_verifier(monkeypatch, "inputs")
    report = compare.run(device, max_examples=3, names=["req_to_token_last"])
    doc = report.to_dict()
    assert not report.passed and doc["disagree"] >= 1 and doc["cases"] == doc["agree"] + doc["disagree"]
    (row,) = doc["rows"]
    first = row["first_disagreement"]
    assert first["oracle_findings"] and first["device_findings"] == []
    assert first["counters"]["inputs"] == 0 and first["counters_implied_by_oracle"] == ["inputs"]


def test_the_run_agrees_on_the_reference_and_planted_writes_it_draws(device):
    report = compare.run(device, max_examples=2, names=["reference", "kvi_missing", "indptr_column0", "positions_live"])
    assert report.disagree == 0, compare.format_table(report)
    assert report.passed and all(r.cases > 2 for r in report.rows)  # runs of several cases per config
    rows = {r.target.name: r for r in report.rows}
    assert rows["reference"].dirty == 0 and all(rows[n].dirty == rows[n].cases
                                                for n in ("kvi_missing", "indptr_column0", "positions_live"))


def test_the_device_path_is_compared_through_check_many(device, monkeypatch):
    """A run of one config goes through Session.check_many on the device path. The pair: the batched
    path as it is agrees on a run whose last case alone is dirty; with its dirty-batch reset removed
    (a re-check then meets the dirty case's stray store) the comparison reports a disagreement on a
    clean case."""
    from kvfence.contracts.draft.device_verify import DeviceVerifier

    bad = f"{ROOT / 'tests' / 'targets' / 'bad_writes.py'}:tail_write_past_two"
    config = Config(topk=1, num_steps=2, ctx=4, max_bs=4, sizing="safe")
    run = [Case(config, Batch((1,), (0,), 1), bad), Case(config, Batch((2, 1), (1, 0), 2), bad),
           Case(config, Batch((1, 2, 3), (0, 1, 2), 3), bad)]
    calls = []
    real_many = Session.check_many
    monkeypatch.setattr(Session, "check_many", lambda self, cases: calls.append(len(cases)) or real_many(self, cases))
    results = compare.Paths(device, bad).check_run(run)
    assert calls == [3] and [r.dirty for r in results] == [False, False, True]
    assert all(r.agree for r in results), [r.problems for r in results]
    monkeypatch.setattr(DeviceVerifier, "_reset_buffers", lambda self: None)
    broken = compare.Paths(device, bad).check_run(run)
    assert not broken[0].agree and not broken[0].dirty and broken[0].device  # a clean case blamed


def test_every_mutant_must_leave_damage_or_the_run_fails():
    target = compare_rows.Target("off_by_one_n", "kernel mutant", "x", "safe", "cpu", "")
    report = compare_rows.Comparison("cpu", 1, 0, None, [compare_rows.Row(target, cases=1, agree=1)])
    assert not report.passed and report.to_dict()["not_exercised"] == ["off_by_one_n"]


def test_a_planted_write_that_never_lands_fails_the_run():
    target = compare_rows.Target("seq_lens_past", "planted", "x", "safe", "cpu", "")
    report = compare_rows.Comparison("cpu", 1, 0, None, [compare_rows.Row(target, cases=1, agree=1)])
    assert report.disagree == 0 and not report.passed and report.to_dict()["not_exercised"] == ["seq_lens_past"]
    clean_reference = compare_rows.Comparison("cpu", 1, 0, None, [compare_rows.Row(
        compare_rows.Target("reference", "reference", "reference", "safe", "cpu", ""), cases=1, agree=1)])
    assert clean_reference.passed


@pytest.mark.parametrize("plant, buffer", [("seq_lens_past", "seq_lens"), ("positions_past", "positions"),
                                           ("req_to_token_first", "req_to_token")])
def test_the_oracle_path_sees_a_repeated_input_write_every_time(device, plant, buffer):
    """What the comparison found: the graph runner kept what a kernel wrote past the bucket (and a damaged
    pool when the next case had the same token seed), so the same write in the next case changed nothing
    and went unseen on the oracle path. Every case now starts from the padding values and a fresh pool."""
    spec = f"{PLANTED}:{plant}"
    session = Session(device, spec, verifier="oracle")
    for _ in range(2):
        kinds = {(f.kind, f.buffer) for f in session.check(case_for(spec))}
        assert (Kind.STRAY_WRITE, buffer) in kinds, kinds
    assert Session(device, "reference", verifier="oracle").check(case_for("reference")) == []


@pytest.mark.cpu_only  # it runs the CLI with --device cpu (the interpreter)
@pytest.mark.long
def test_cli_both_verifiers_writes_the_agreement_table(tmp_path):
    out = tmp_path / "v.json"
    proc = subprocess.run([sys.executable, "-m", "kvfence", "mutants", "--device", "cpu", "--verifiers", "both",
                           "--only", "reference", "kvi_front_guard", "--max-examples", "2", "--json", str(out),
                           "--quiet"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["cases"] == doc["agree"] >= 4 and doc["disagree"] == 0
    assert [r["name"] for r in doc["rows"]] == ["reference", "kvi_front_guard"]
    assert f"PASS: {doc['cases']}/{doc['cases']} cases agree" in proc.stdout


@pytest.mark.cpu_only  # it runs the CLI with --device cpu (the interpreter)
def test_cli_both_verifiers_prints_each_target_as_it_ends():
    """Without ``--quiet`` a line per target as it ends: its verdict, cases and dirty cases."""
    proc = subprocess.run([sys.executable, "-m", "kvfence", "mutants", "--device", "cpu", "--verifiers", "both",
                           "--only", "reference", "req_to_token_tail", "--max-examples", "1"], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    progress = [line for line in proc.stderr.splitlines() if line.startswith("kvfence: ") and " domain): " in line]
    assert [line.split(" (")[0] for line in progress] == ["kvfence: reference", "kvfence: req_to_token_tail"], \
        proc.stderr
    assert "0 dirty" in progress[0] and " 0 dirty" not in progress[1], progress


def test_the_draft_comparison_provides_what_the_command_uses():
    from importlib import import_module
    from importlib.metadata import entry_points

    from kvfence.cli.mutants import COMPARISON_MEMBERS, COMPARISONS

    (draft,) = [ep for ep in entry_points(group=COMPARISONS) if ep.name == "draft"]
    module = import_module(draft.value)
    assert [m for m in COMPARISON_MEMBERS if not hasattr(module, m)] == []
    assert set(COMPARISON_MEMBERS) <= set(module.__all__)


def test_cli_both_verifiers_refuses_seeds():
    proc = subprocess.run([sys.executable, "-m", "kvfence", "mutants", "--device", "cpu", "--verifiers", "both",
                           "--seeds", "3"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--seeds" in proc.stderr, proc.stderr


@pytest.mark.gpu
def test_both_verifiers_agree_on_cuda(device):
    """The same comparison with compiled kernels in captured CUDA graphs (the device verifier as it runs
    in a GPU fuzz run): the reference, kernel mutants (two whose stores race), sizing mutants (whose
    production-layout overflows race with the next row's stores) and one plant per buffer."""
    report = compare.run(device, max_examples=3, names=["reference", "off_by_one_n", "bs_upper_small",
                                                         "indptr_stride_rows", "sizing_one_request",
                                                         "sizing_missing_topk", "kvi_slack", "indptr_column0_zero",
                                                         "seq_lens_past"])
    assert report.disagree == 0, compare.format_table(report)


def test_racy_cases_are_compared_by_what_holds_whatever_the_schedule():
    """A racy case agrees when the kinds over all launches of each path overlap, at any ranges; it does
    not when they do not, when the host-known findings differ, when a counter is non-zero that no
    launch's findings imply, or when one path is clean on every launch. A case that is not racy must
    match range for range."""
    from kvfence.contracts.draft.compare import Paths

    value = [Finding(Kind.VALUE_MISMATCH, "kv_indices", "row 0", 10, 20)]
    shifted = [Finding(Kind.VALUE_MISMATCH, "kv_indices", "row 0", 12, 20)]
    missing = [Finding(Kind.MISSING_WRITE, "kv_indices", "row 0", 10, 20)]
    slack = [Finding(Kind.STRAY_WRITE, "kv_indices", "slack of row 0", 30, 31)]
    sizing = [Finding(Kind.SIZING_VIOLATION, "kv_indices", "row 1", 28, 36)]
    other_sizing = [Finding(Kind.SIZING_VIOLATION, "kv_indices", "row 1", 28, 40)]
    kvi, outside = COUNTERS.index("kv_indices"), COUNTERS.index("outside")
    counters = [0] * len(COUNTERS)
    counters[kvi] = 3
    assert Paths.compare_racy(counters, [value, missing + value], [shifted]) == []
    assert Paths.compare_racy(None, [sizing + value, sizing + missing], [sizing + missing]) == []
    assert Paths.compare(None, [kvi], value, shifted) != []  # not racy: ranges must match
    assert Paths.compare_racy(None, [value, value + slack], [missing, missing]) != []  # no kind in common
    assert Paths.compare_racy(None, [sizing + value, sizing + missing], [other_sizing + value]) != []
    counters[outside] = 1
    assert Paths.compare_racy(counters, [value, missing], [value]) != []  # nothing implies "outside"
    assert Paths.compare_racy(counters, [value, slack], [value]) == []
    assert Paths.compare_racy(None, [value, missing], [[], []]) != []  # the device path never dirty


SPILLS = ROOT / "tests" / "targets" / "spills.py"


@pytest.mark.cpu_only
def test_a_kernel_whose_launches_alternate_findings_is_racy_and_agrees():
    """tests/targets/spills.py:parity stores its bad value in row 0 on even launches and in row 0's slack
    on odd ones. The two paths' first launches name different kinds (equal kinds per launch would call
    that a disagreement), the case is racy, and it agrees: each path saw both kinds over its launches,
    and the counters saw what some launch named."""
    from kvfence.engine.kernels import load_file

    load_file(SPILLS).LAUNCHES.clear()  # launch 0 is the counters' own, launch 2 the device path's full one
    spec = f"{SPILLS}:parity"
    result = compare.Paths("cpu", spec).check(case_for(spec))
    assert {f.kind for f in result.device} == {Kind.VALUE_MISMATCH}
    assert {f.kind for f in result.oracle} == {Kind.STRAY_WRITE}
    assert result.racy and result.agree, result.problems
    assert result.counters[COUNTERS.index("kv_indices")] > 0
    # The JSON keeps the racy case whole, each launch's verdict with it.
    row = compare_rows.Row(compare.targets("cpu", ["reference"])[0])
    row.add(result)
    kept = row.to_dict()["racy_cases"]
    assert len(kept) == 1 and kept[0]["launches"] == result.launches
    kinds = {(lch["path"], tuple(lch["kinds"])) for lch in kept[0]["launches"]}
    assert ("device", ("VALUE_MISMATCH",)) in kinds and ("oracle", ("STRAY_WRITE",)) in kinds, kinds


@pytest.mark.cpu_only
def test_a_race_that_follows_the_buffers_is_found_by_judging_one_launch_twice():
    """tests/targets/spills.py:by_allocation leaves a wrong value on the device path's buffers and a slack
    store on the oracle path's, on every launch: each path repeats itself. Judged by both verifiers on one
    launch's buffers, the findings are the same, so the verifiers agree and the case is racy (launch-
    dependent); judged by the plain oracle on that launch, a verifier that named other findings would be
    a disagreement."""
    from kvfence.engine.kernels import load_file

    load_file(SPILLS).ALLOCATIONS.clear()
    spec = f"{SPILLS}:by_allocation"
    paths = compare.Paths("cpu", spec)
    case = case_for(spec)
    result = paths.check(case)
    assert {f.kind for f in result.device} == {Kind.VALUE_MISMATCH}
    assert {f.kind for f in result.oracle} == {Kind.STRAY_WRITE}
    assert result.racy and result.agree, result.problems
    by_device, by_oracle = paths.cross_judge(case)
    assert compare_rows.named(by_device) == compare_rows.named(by_oracle) == compare_rows.named(result.device)


def test_a_verifier_that_drops_a_finding_is_still_a_disagreement():
    """The non-racy half: both paths repeat themselves, the device path without the slack write."""
    value = [Finding(Kind.VALUE_MISMATCH, "kv_indices", "row 0", 10, 20)]
    slack = [Finding(Kind.STRAY_WRITE, "kv_indices", "slack of row 0", 30, 31)]
    eager = Case(Config(**{**CONFIG.to_dict(), "buckets": CONFIG.buckets, "mode": "eager"}), BATCH, "reference")
    result = _paths(_Launches(value + slack), _Launches(value)).check(eager)
    assert not result.racy and not result.agree
    assert result.problems == ["the device path's findings differ from the oracle path's"]


@pytest.mark.cpu_only
def test_a_racy_case_of_a_planted_write_fails_the_run(monkeypatch):
    """A planted write is one store: were its case racy, kvfence's write set would be wrong, so the run
    fails even though the racy rule itself agrees; a racy kernel mutant's case only has to agree."""
    real = compare.Paths.check_run

    def all_racy(self, cases):
        return [dataclasses.replace(r, racy=True) for r in real(self, cases)]

    monkeypatch.setattr(compare.Paths, "check_run", all_racy)
    report = compare.run("cpu", max_examples=1, names=["kvi_value"])
    assert not report.passed and report.disagree == report.cases == report.to_dict()["racy"] > 0
    assert "a harness bug" in report.rows[0].first_disagreement["problems"][-1]
    assert compare_rows.must_be_deterministic(compare_rows.Target("sizing_one_request", "sizing mutant", "reference",
                                                                  "x", "cpu", ""))
    assert not compare_rows.must_be_deterministic(compare_rows.Target("bs_upper_small", "kernel mutant", "k", "safe",
                                                                      "cpu", ""))


class _Launches:
    """A stand-in session whose successive checks return the given finding lists (then the last)."""

    def __init__(self, *verdicts):
        self.verdicts = list(verdicts)
        self.calls = 0

    def check(self, case):
        self.calls += 1
        return self.verdicts[min(self.calls, len(self.verdicts)) - 1]

    def runner(self, config, canary_seed):
        return object()


def _paths(oracle, dev):
    paths = compare.Paths.__new__(compare.Paths)
    paths.oracle, paths.dev, paths._verifiers = oracle, dev, {}
    # One launch judged by both verifiers: each stand-in judges it as it judged its own last launch.
    paths.cross_judge = lambda case: (dev.verdicts[-1], oracle.verdicts[-1])
    return paths


def test_a_race_that_repeats_twice_on_the_oracle_path_is_still_found_racy():
    """H200 run 16: two oracle-path launches agreed, the device path's differed. The extra launches on a
    disagreement find the race (here on the device path's second launch); a deterministic disagreement
    stays one, after the extra launches on both paths."""
    from kvfence.engine.findings import Finding

    here = [Finding(Kind.VALUE_MISMATCH, "kv_indices", "row 0", 10, 20)]
    there = [Finding(Kind.VALUE_MISMATCH, "kv_indices", "row 0", 12, 20)]
    eager = Case(Config(**{**CONFIG.to_dict(), "buckets": CONFIG.buckets, "mode": "eager"}), BATCH, "reference")
    racy = _paths(_Launches(here, here), _Launches(there, here)).check(eager)
    assert racy.racy and racy.agree, racy.problems
    oracle, dev = _Launches(here), _Launches(there)
    steady = _paths(oracle, dev).check(eager)
    assert not steady.racy and not steady.agree
    assert oracle.calls == 2 + compare.RACE_RETRIES and dev.calls == 1 + compare.RACE_RETRIES
    same = _Launches(here)
    agreed = _paths(_Launches(here), same).check(eager)
    assert agreed.agree and same.calls == 1  # no extra launch when the paths agree


def test_a_guarded_buffer_keeps_nothing_but_its_storage_on_the_device():
    """A store past the end of the allocation lands in whatever the allocator put next to it (H200 run 16:
    a live mask there turned row elements into "guards" on the oracle path). The buffer's masks and
    canaries are computed when needed, so the only tensor it holds is its storage (and a view of it)."""
    import torch

    from kvfence.contract import Table
    from kvfence.engine.tables import POISON, allocate_laid_out, seeded_canaries

    buf = allocate_laid_out(Table("kv_indptr", 5, 3), "cpu", guard=2, front=4, tail=4, canary_seed=7,
                            column0_canary=True)
    held = {name for name, value in vars(buf).items() if isinstance(value, torch.Tensor)}
    assert held == {"flat", "view"}
    assert buf.view.data_ptr() == buf.flat[buf.front:].data_ptr()
    expected = seeded_canaries(7, torch.arange(len(buf.flat)))
    for r in range(3):
        for c in range(1, 5):
            expected[buf.position(r, c)] = POISON
    assert torch.equal(buf.flat, expected)  # reset: canaries in guards and column 0, poison in the rows
    assert [buf.locate(p)[0] for p in (3, 4, 8, 9, 11)] == ["front guard", "row", "row", "guard after row", "row"]


def test_a_lossy_batched_path_is_a_disagreement_not_a_race(device, monkeypatch):
    """A batched device path that reports nothing for any batch of more than one case, on a kernel mutant
    whose last case is dirty: the dirty case disagrees (its extra launches go through the same lossy batch,
    not one case at a time, where they would see the findings and the case would pass as racy); each launch
    is recorded with how it ran. The pair: the real batched path agrees on the same run."""
    bad = f"{ROOT / 'tests' / 'targets' / 'bad_writes.py'}:tail_write_past_two"
    config = Config(topk=1, num_steps=2, ctx=4, max_bs=4, sizing="safe")
    run = [Case(config, Batch((1,), (0,), 1), bad), Case(config, Batch((2, 1), (1, 0), 2), bad),
           Case(config, Batch((1, 2, 3), (0, 1, 2), 3), bad)]
    honest = compare.Paths(device, bad).check_run(run)
    assert honest[2].dirty and all(r.agree for r in honest), [r.problems for r in honest]
    real_many = Session.check_many
    monkeypatch.setattr(Session, "check_many",
                        lambda self, cases: [[] for _ in cases] if len(cases) > 1 else real_many(self, cases))
    lossy = compare.Paths(device, bad).check_run(run)
    assert lossy[2].dirty and not lossy[2].agree, lossy[2].problems
    via = [(lch["path"], lch["via"], bool(lch["kinds"])) for lch in lossy[2].launches]
    assert ("device", "batch", False) in via and ("device", "one", True) not in via
    assert sum(1 for p, _, dirty in via if p == "oracle" and dirty) >= 2
    assert lossy[2].to_dict()["launches"] == lossy[2].launches


#: The scale mutants' triggers (their docstrings), as predicates on a case.
SCALE_TRIGGERS = {
    "prefix_sum_16_lanes": lambda c: c.launch().num_seqs >= 18,
    "indptr_sum_64_branches": lambda c: len(c.batch.seq_lens) * c.config.topk > 64,
    "page_last_capped_64": lambda c: (c.config.page_size == 128 and c.config.topk >= 2
                                      and any(n % 128 >= 64 for n in c.batch.seq_lens)),
    "copy_first_block_only": lambda c: max(c.batch.seq_lens) > 512,
}


@pytest.mark.parametrize("name", sorted(SCALE_TRIGGERS))
def test_an_unexercised_scale_mutant_gets_extra_rounds_aimed_at_its_trigger(name):
    """On the H200, seed 7 with two configs per target never reached ``prefix_sum_16_lanes`` (18 requests in a
    launch), so the comparison failed on luck, not on a disagreement. The extra rounds for a target not yet
    dirty draw with its mutant's ``AIM`` (config pins): every scale mutant's trigger is reached in one round."""
    (target,) = compare.targets("cuda", [name])
    assert target.aim, target
    runs = compare.draw_runs(target, compare.EXTRA_CONFIGS, 7 + 1000, compare.CUDA_MAX_BYTES,
                             compare.SHORT_RUN["cuda"], pins=target.aim)
    assert len(runs) == compare.EXTRA_CONFIGS
    assert any(SCALE_TRIGGERS[name](case) for run in runs for case in run)


def test_on_the_cpu_a_scale_mutant_is_listed_unreachable_not_a_failure(monkeypatch):
    """``mutants --device cpu --verifiers both`` failed on every seed because the four scale mutants (bugs that
    need the GPU domain) were never dirty on the CPU's: they are now listed as not reachable there, as the
    self-test lists them, and not compared; a reachable mutant that stays clean still fails the run, and on
    CUDA every mutant is reachable."""
    cpu = {t.name: t for t in compare.targets("cpu", list(SCALE_TRIGGERS) + ["off_by_one_n"])}
    assert [n for n, t in cpu.items() if not t.reachable] == sorted(SCALE_TRIGGERS)
    assert all(t.reachable for t in compare.targets("cuda", list(SCALE_TRIGGERS)))
    monkeypatch.setattr(compare, "targets", lambda device, names: [cpu[n] for n in names])
    report = compare.run("cpu", names=list(SCALE_TRIGGERS))
    assert report.passed and report.cases == 0 and report.to_dict()["not_exercised"] == []
    assert {compare_rows.row_verdict(r) for r in report.rows} == {"not reachable here (expected)"}
    last = compare.format_table(report).splitlines()[-1]
    assert last.startswith("PASS") and "never dirty" not in last and "not reachable here (expected)" in last
    assert [r["reachable"] for r in report.to_dict()["rows"]] == [False] * 4
    stays_clean = compare_rows.Comparison("cpu", 1, 0, None, [compare_rows.Row(cpu["off_by_one_n"], cases=1, agree=1)])
    assert not stays_clean.passed
