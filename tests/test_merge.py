"""``python -m kvfence report --merge``: runs from several hosts as one report, identical cases once."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ["fuzz", "--sizing", "prefix", "--device", "cpu", "--max-examples", "20", "--quiet", "--shrink-seconds", "20",
        "--database", "none"]


def kvfence(*args, timeout=240):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "kvfence", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three real runs: hosts a and b find the same case (same seed), host c another one (another shard)."""
    base = tmp_path_factory.mktemp("runs")
    for name, extra in (("a", ["--seed", "1"]), ("b", ["--seed", "1"]), ("c", ["--seed", "3", "--shard", "3/3"])):
        proc = kvfence(*FUZZ, *extra, "--out", str(base / name))
        assert proc.returncode == 1, proc.stdout + proc.stderr
    return base


def _doc(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def _case_names(folder: Path) -> set:
    return {p.name for p in (folder / "cases").glob("*.json")}


@pytest.mark.cpu_only
def test_identical_cases_from_two_hosts_are_kept_once(runs, tmp_path):
    a, b, c = runs / "a", runs / "b", runs / "c"
    assert _case_names(a) == _case_names(b) and _case_names(a) != _case_names(c)
    out = tmp_path / "merged"
    proc = kvfence("report", "--merge", str(a), str(b), str(c), "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the campaign has findings
    doc = _doc(out)
    assert _case_names(out) == _case_names(a) | _case_names(c)
    assert set(doc["cases"]) == {str(out / "cases" / n) for n in _case_names(out)}
    assert doc["merged"]["duplicate_cases"] == 1
    # a's and b's findings are the same findings of the same case: kept once; c's are added.
    assert len(doc["findings"]) == len(_doc(a)["findings"]) + len(_doc(c)["findings"])
    assert all(f["case"] in doc["cases"] for f in doc["findings"])
    assert doc["examples"] == sum(_doc(r)["examples"] for r in (a, b, c))
    shared = next(v for v in doc["cases"].values() if Path(v["path"]).name in _case_names(a))
    assert shared["found_in"] == [str(a), str(b)]
    assert [r["shard"] for r in doc["merged"]["runs"]] == [None, None, "3/3"]
    assert "Merged runs" in (out / "report.md").read_text()
    # The merged folder is an ordinary run folder: it re-renders, and its case files replay.
    assert kvfence("report", str(out)).returncode == 1  # findings: the same exit code as report --merge
    case = next(iter(doc["cases"]))
    assert kvfence("repro", case, "--device", "cpu").returncode == 1


@pytest.mark.cpu_only
def test_distinct_runs_keep_all_their_cases(runs, tmp_path):
    out = tmp_path / "merged"
    assert kvfence("report", "--merge", str(runs / "a"), str(runs / "c"), "--out", str(out)).returncode == 1
    doc = _doc(out)
    assert doc["merged"]["duplicate_cases"] == 0 and len(doc["cases"]) == 2


@pytest.mark.cpu_only
def test_a_missing_case_file_is_bad_input_before_writing(runs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(runs / "c", broken)
    for p in (broken / "cases").glob("*.json"):
        p.unlink()
    out = tmp_path / "merged"
    proc = kvfence("report", "--merge", str(runs / "a"), str(broken), "--out", str(out))
    assert proc.returncode == 2 and "is missing" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["report"], "name one run folder"),
    (["report", "x", "--merge", "y"], "name one run folder"),
    (["report", "--merge", "no/such/run"], "no such directory"),
])
def test_merge_usage_errors_are_one_line(args, message):
    proc = kvfence(*args)
    assert proc.returncode == 2 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.cpu_only
def test_merging_into_an_input_folder_is_refused(runs):
    proc = kvfence("report", "--merge", str(runs / "a"), str(runs / "c"), "--out", str(runs / "a"))
    assert proc.returncode == 2 and "is one of the merged folders" in proc.stderr


def test_runs_of_two_contracts_merge_with_their_case_files_and_one_plot(tmp_path):
    """A draft kernel's run and a table contract's (written as the engine writes them, no kernel run) merge:
    both case files are kept and re-read by their own records, the plot draws the first run's contract and says
    how many runs' rows it left out, and the merged folder renders again."""
    import json

    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.record import launch_of
    from kvfence.contracts.page_table.record import PageTableCase
    from kvfence.engine import launch as launches
    from kvfence.engine import registry
    from kvfence.engine import summary as summary_mod
    from kvfence.engine.casefile import write_case
    from kvfence.engine.findings import Finding, Kind
    from kvfence.engine.result import FuzzResult
    from kvfence.reports.merge import merge
    from kvfence.reports.render import write_reports

    # one request of 3 tokens and a draft token at a context of 4, page size 1, under the context sizing
    wall = PageTableCase(page_size=1, ctx=4, draft_tokens=1, seq_lens=(4,), req_pool_indices=(0,), pool_rows=1)
    runs = {"table": launches.bind(registry.get("flashmla-page-table"), wall, "context"),
            "draft": launch_of(Case(Config(topk=2, num_steps=1, ctx=2, max_bs=1, sizing="prefix"), Batch((1,), (0,))))}
    folders = []
    for name, case in runs.items():
        folder = tmp_path / name
        record = registry.get(case.contract)
        finding = Finding(Kind.SIZING_VIOLATION, "launch", "row width", 1, 2)
        path = str(write_case(case, [finding], out_dir=folder))
        result = FuzzResult(examples=1, generated_cases=1, verified_cases=1, case=case, findings=[finding],
                            stats=[launches.coverage_row(record, case, True)],
                            coverage_fields=launches.coverage_fields(record, case))
        doc = summary_mod.build(result, run={"contract": case.contract}, case_path=path)
        (folder / "summary.json").write_text(json.dumps(doc))
        folders.append(folder)
    out = tmp_path / "merged"
    doc = merge(folders, out)
    assert {c["contract"] for c in doc["cases"].values()} == {"flashmla-page-table", "draft"}
    assert doc["coverage"]["fields"][0] == "page_size" and doc["coverage"]["left_out_runs"] == 1
    assert len(doc["coverage"]["examples"]) == 1
    summary_mod.validate(json.loads((out / "summary.json").read_text()), "merged")
    page = write_reports(doc, out)["html"].read_text()
    assert page.count("buffer-map") >= 2 and "not plotted" in page
