"""A report shows only its own run: earlier case files are moved aside and named, the coverage plot's
panels count every point they draw, "max need/width" names the example it came from, and the mutants
table reports the reference as clean (expected)."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.engine import summary as summary_mod
from kvfence.engine.outdir import set_aside_earlier_cases
from kvfence.reports.render import panel_counts, panel_title
from kvfence.reports.text import max_need_text
from kvfence.selftest.mutants import Row, format_table

ROOT = Path(__file__).resolve().parents[1]


def fuzz_cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--device", "cpu", "--quiet", "--ctx", "8",
                           "--max-bs", "2", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.cpu_only
def test_a_clean_run_moves_an_earlier_runs_case_files_aside(tmp_path):
    out = tmp_path / "out"
    failing = fuzz_cli("--sizing", "prefix", "--topk", "2", "--max-examples", "30", "--seed", "1",
                       "--shrink-seconds", "5", "--out", str(out))
    assert failing.returncode == 1, failing.stderr
    (old_case,) = (out / "cases").glob("*.json")

    clean = fuzz_cli("--sizing", "safe", "--max-examples", "5", "--seed", "1", "--out", str(out))
    assert clean.returncode == 0, clean.stderr
    assert list((out / "cases").glob("*.json")) == []  # nothing beside the clean report contradicts it
    (moved,) = (out / "cases" / "earlier").glob("*/*.json")
    assert moved.name == old_case.name and json.loads(moved.read_text())["findings"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["findings"] == [] and summary["earlier_cases"] == {"folder": str(moved.parent), "count": 1}
    for text in ((out / "report.md").read_text(), clean.stdout):
        assert f"moved to {moved.parent}; they are not part of this report" in text


def test_set_aside_moves_only_top_level_case_files_and_never_overwrites(tmp_path):
    cases = tmp_path / "cases"
    assert set_aside_earlier_cases(tmp_path) is None  # no cases/ at all
    cases.mkdir()
    assert set_aside_earlier_cases(tmp_path) is None  # nothing to move: no empty earlier/ folder
    assert not (cases / "earlier").exists()
    (cases / "a.json").write_text("{}")
    first = set_aside_earlier_cases(tmp_path, now=0)
    (cases / "a.json").write_text('{"second": 1}')
    second = set_aside_earlier_cases(tmp_path, now=0)  # same second: a fresh folder
    assert first["folder"] != second["folder"] and first["count"] == second["count"] == 1
    assert json.loads((Path(second["folder"]) / "a.json").read_text()) == {"second": 1}
    assert set_aside_earlier_cases(tmp_path) is None  # earlier/ itself is never moved again


@pytest.fixture(scope="module")
def failing_doc(make_session, tmp_path_factory):
    """A real fuzz run of the pre-fix sizing with its shrunk case file."""
    from kvfence.contracts.draft.record import launch_of
    from kvfence.contracts.draft.strategies import cases, configs
    from kvfence.engine import casefile
    from kvfence.engine.loop import fuzz
    from kvfence.engine.plan import RunPlan

    result = fuzz(make_session(), cases(configs(max_ctx=8, max_max_bs=2, sizing="prefix")).map(launch_of),
                  RunPlan(max_examples=30, seed=4, shrink_seconds=20))
    assert result.findings
    path = str(casefile.write_case(result.case, result.findings, out_dir=tmp_path_factory.mktemp("fuzzed")))
    return summary_mod.build(result, run={"sizing": "prefix"}, case_path=path)


def test_every_panel_counts_every_point_it_draws(failing_doc):
    counts = panel_counts(failing_doc)
    rows = [dict(zip(summary_mod.coverage_fields(failing_doc), r)) for r in failing_doc["coverage"]["examples"]]
    (case,) = failing_doc["cases"].values()
    assert set(counts) == {r["topk"] for r in rows} | {case["config"]["topk"]}
    for topk, c in counts.items():
        mine = [r for r in rows if r["topk"] == topk]
        assert c["explored"] == len(mine) and c["failed"] == sum(r["failed"] for r in mine)
        assert c["case_files"] == (topk == case["config"]["topk"])
    assert sum(c["explored"] for c in counts.values()) == failing_doc["examples"]

    # The shrunk case in a panel where no explored example landed (shrinking changed topk):
    doc = copy.deepcopy(failing_doc)
    topk = case["config"]["topk"]
    doc["coverage"]["examples"] = [r for r in doc["coverage"]["examples"] if r[0] != topk]
    lone = panel_counts(doc)[topk]
    assert lone == {"explored": 0, "failed": 0, "case_files": 1}
    assert panel_title(topk, lone) == f"topk={topk}: 1 example (1 case file), 1 failed"


def test_max_need_over_width_names_its_example(failing_doc):
    ex = failing_doc["max_need_over_width_example"]
    assert ex["need"] / ex["width"] == pytest.approx(failing_doc["max_need_over_width"], abs=1e-4)
    stats = [dict(zip(summary_mod.coverage_fields(failing_doc), r)) for r in failing_doc["coverage"]["examples"]]
    assert ex in stats and max(s["need"] / s["width"] for s in stats) == ex["need"] / ex["width"]
    text = max_need_text(failing_doc)
    assert f"topk={ex['topk']}" in text and f"need {ex['need']}, width {ex['width']}" in text
    (case_path,) = failing_doc["cases"]
    # Under the pre-fix sizing the highest need/width is the failing example, shrunk into the case file.
    assert ex["failed"] and f"shrunk into {case_path}" in text
    summary_mod.validate(json.loads(json.dumps(failing_doc)), "summary")


def _row(name, to_detection, *, expected=True, ran_on="cpu", domain="cpu", reference=False):
    """A self-test row whose seed ``i`` found the target after ``to_detection[i]`` examples (None: clean)."""
    row = Row(name, "kernel", "safe", domain, ran_on, expected, detects=("STRAY_WRITE",), reference=reference)
    row.runs = [{"seed": i, "kinds": ["STRAY_WRITE"] if n else [], "declared": bool(n), "examples": 30,
                 "examples_to_failure": n, "search_s": 0.1 if n else None} for i, n in enumerate(to_detection)]
    return row


@pytest.mark.parametrize("reference_dirty", [False, True])
def test_mutants_table_reports_the_reference_as_expected(reference_dirty):
    rows_ = [_row("off_by_one_n", [3, 5, 4]), _row("paged_no_last", [None, 4, 2]),
             _row("copy_first_block_only", [None, None, None], domain="gpu", expected=False),
             _row("reference (draft)", [7, None, None] if reference_dirty else [None] * 3, expected=False,
                  reference=True),
             _row("reference (window-rail)", [None] * 3, expected=False, reference=True)]
    report = {"contract": "draft", "device": "cpu", "seeds": [0, 1, 2], "rows": [r.to_dict() for r in rows_],
              "passed": all(r.passed for r in rows_)}
    lines = format_table(report).splitlines()[2:]
    rows = {line.split()[0]: line for line in lines}
    # One reference row per contract, each named by it: the two rows can be told apart.
    rows["reference"] = next(line for line in lines if line.startswith("reference (draft) "))
    rail = next(line for line in lines if line.startswith("reference (window-rail) "))
    assert "clean (expected)" in rail
    assert "3/3 seeds" in rows["off_by_one_n"] and "4/5" in rows["off_by_one_n"]  # median / worst examples
    assert "2/3 seeds (below 95%)" in rows["paged_no_last"]
    assert "not reachable here (expected)" in rows["copy_first_block_only"]
    if reference_dirty:
        assert "FOUND: the reference is not clean" in rows["reference"]
        assert "references NOT clean" in rows["FAIL:"]
    else:
        assert "clean (expected)" in rows["reference"] and "not detected" not in rows["reference"]
        assert "references clean" in rows["FAIL:"]  # FAIL: paged_no_last missed a seed
    assert "1/2 mutants detected in >= 95% of 3 seed(s)" in rows["FAIL:"]
