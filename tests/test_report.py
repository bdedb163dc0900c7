"""The fuzz job's outputs: summary.json, report.md, self-contained report.html with its plot, progress."""

import base64
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.contracts.draft.record import launch_of
from kvfence.contracts.draft.strategies import cases, configs
from kvfence.engine import summary as summary_mod
from kvfence.engine.loop import fuzz
from kvfence.engine.plan import RunPlan
from kvfence.engine.progress import Progress
from kvfence.reports.render import coverage_png, write_reports
from kvfence.reports.text import text_table

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def doc(make_session, tmp_path_factory):
    """A real, small fuzz run of the pre-fix sizing (finds its missing topk factor) turned into a summary."""
    from kvfence.engine import casefile

    strategy = cases(configs(max_ctx=8, max_max_bs=2, sizing="prefix")).map(launch_of)
    result = fuzz(make_session(), strategy, RunPlan(max_examples=30, seed=4, shrink_seconds=20))
    assert result.findings and result.stats and result.failure_stat is not None
    assert result.hypothesis["blob"].startswith("@reproduce_failure(")
    out = tmp_path_factory.mktemp("fuzzed")
    path = str(casefile.write_case(result.case, result.findings, out_dir=out))
    run = {"device": "cpu", "kernel": "reference", "sizing": "prefix", "mode": "graph", "layout": "redzone", "seed": 4,
           "contract": "draft"}
    return summary_mod.build(result, run=run, case_path=path, versions=casefile.versions())


def test_summary_lists_findings_with_their_case_file_and_the_coverage(doc):
    summary_mod.validate(json.loads(json.dumps(doc)), "summary")
    assert doc["findings"] and {f["case"] for f in doc["findings"]} == set(doc["cases"])
    rows = doc["coverage"]["examples"]
    # The draft's coverage columns: its panel field (topk), then the generic ones.
    fields = summary_mod.coverage_fields(doc)
    assert fields == ("topk", "num_seqs", "need", "width", "failed") and doc["coverage"]["fields"] == list(fields)
    assert len(rows) == doc["examples"] and all(len(row) == len(fields) for row in rows)
    assert any(row[-1] for row in rows)  # the failing example is marked
    table = text_table(doc)
    assert "SIZING_VIOLATION" in table and "kvfence repro" in table


def test_html_is_self_contained_with_the_plot_and_markdown_links_it(doc, tmp_path):
    written = write_reports(doc, tmp_path)
    assert written["plot_skipped"] == ""
    html = written["html"].read_text()
    match = re.search(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert match and base64.b64decode(match.group(1)).startswith(PNG_MAGIC)
    assert not re.search(r"src=['\"](?!data:)", html)  # nothing external to load
    # The only links are the case files (relative to the report's folder when they lie below it).
    names = {Path(p).name for p in doc["cases"]}
    hrefs = re.findall(r"href=['\"]([^'\"]+)", html)
    assert hrefs and all(Path(h).name in names for h in hrefs), hrefs
    assert "SIZING_VIOLATION" in html and "kvfence repro" in html
    md = written["md"].read_text()
    assert "![coverage](coverage.png)" in md and (tmp_path / "coverage.png").read_bytes().startswith(PNG_MAGIC)


def test_without_matplotlib_the_reports_say_the_plot_was_skipped(doc, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    png, why = coverage_png(doc)
    assert png is None and "matplotlib is not available" in why
    written = write_reports(doc, tmp_path)
    assert "Plot skipped: matplotlib is not available" in written["html"].read_text()
    assert "Plot skipped: matplotlib is not available" in written["md"].read_text()
    assert not (tmp_path / "coverage.png").exists()


def test_report_command_rerenders_from_summary_json(doc, tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(doc))
    res = subprocess.run([sys.executable, "-m", "kvfence", "report", str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1, res.stderr  # a run with findings: exit 1, as for report --merge
    assert "base64," in (tmp_path / "report.html").read_text()
    assert "SIZING_VIOLATION" in (tmp_path / "report.md").read_text()
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "summary.json").write_text(json.dumps(dict(doc, findings=[], cases={})))
    res = subprocess.run([sys.executable, "-m", "kvfence", "report", str(clean)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "clean" in (clean / "report.md").read_text()


def test_progress_is_one_updating_line_on_a_tty_and_plain_lines_otherwise(doc):
    from kvfence.engine.result import FuzzResult

    r = FuzzResult(examples=50, verified_cases=100, cached_cases=3, elapsed_s=2.0, max_utilisation=0.5)
    tty, plain = io.StringIO(), io.StringIO()
    bar, log = Progress(200, tty, tty=True), Progress(200, plain, tty=False)
    for p in (bar, log):
        p.update(r)
        r.examples = 100
        p.update(r)
        p.close()
        r.examples = 50
    assert tty.getvalue().count("\r\x1b[2K") == 2 and tty.getvalue().count("\n") == 1
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in plain.getvalue()
    assert "100/200 examples" in lines[1] and "100 verified, 3 cached" in lines[1]
    assert "50.0 verified cases/s" in lines[1] and "0 findings" in lines[1]
    r.shrinking, r.shrink_cases = True, 7
    assert "shrinking (7 shrink cases)" in log.line(r)
    assert bar.every_s < log.every_s


@pytest.mark.cpu_only  # the CLI runs --device cpu (the interpreter)
def test_fuzz_cli_writes_all_outputs_and_progress(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--device", "cpu", "--sizing", "safe",
                          "--max-examples", "12", "--seed", "5", "--ctx", "6", "--max-bs", "2", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert re.search(r"kvfence \[[#.]+\] \d+/12 examples \| \d+ verified, \d+ cached \| [\d.]+ verified cases/s \| "
                     r"0 findings", res.stderr)
    assert "no findings" in res.stdout and "verified cases/s" in res.stdout
    for name in ("summary.json", "report.md", "report.html", "coverage.png"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["examples"] == 12 and summary["findings"] == []
    assert not list((out / "journal").iterdir())  # a clean end leaves no in-flight slot


def test_a_case_link_is_a_relative_file_path_never_a_scheme(tmp_path):
    """A summary may name any path: ``DIR/javascript:alert(1)`` must not become ``href='javascript:...'``, and
    a file outside the report's folder tree is named, not linked by an absolute path."""
    from kvfence.reports.markup import file_href, file_link

    assert file_href(tmp_path / "javascript:alert(1)", tmp_path) == "./javascript%3Aalert%281%29"
    assert file_href(tmp_path / "cases" / "a b.json", tmp_path) == "./cases/a%20b.json"
    assert file_href(tmp_path / "x.json", tmp_path / "sub") == "../x.json"
    page = str(file_link(str(tmp_path / "javascript:alert(1)"), tmp_path))
    assert "href='./javascript%3Aalert%281%29'" in page and "href='javascript" not in page
    assert str(file_link("<b>x</b>", None)) == "&lt;b&gt;x&lt;/b&gt;"


def test_a_widened_row_guard_says_why_it_is_wider_than_the_others():
    """kvfence widens every row's guard by the case's overflow: the map labels 64 + the overflow, not a bare
    count beside the 64 of other buffers; a plain guard keeps its count."""
    from kvfence.contracts.draft.buffer_map import BufferMap, MapRow, row_svg

    wide = MapRow("row 0", 0, 72, [(0, 4, "row"), (4, 72, "guard")], [], width=4)
    plain = MapRow("row 0", 0, 68, [(0, 4, "row"), (4, 68, "guard")], [], width=4)
    svg = str(row_svg(BufferMap("kv_indices", [wide]), wide))
    assert "64 elements plus 4, this case&#39;s overflow past a row" in svg or \
        "64 elements plus 4, this case's overflow past a row" in svg, svg
    assert "overflow" not in str(row_svg(BufferMap("kv_indptr", [plain]), plain))


def test_the_end_of_run_table_shows_an_earlier_summarys_escape_codes_escaped():
    """``fuzz --resume`` prints a summary another run wrote: its strings (kernel, sizing, case paths, repro
    lines) reach the terminal with control characters escaped, never as escape sequences."""
    from kvfence.engine.result import FuzzResult
    from kvfence.engine.summary import build

    evil = "\x1b]0;pwn\x07\x1b[2J"
    doc = build(FuzzResult(), run={"kernel": evil, "sizing": evil, "device": evil, "contract": "draft"},
                case_path=None)
    path = f"DIR/cases/{evil}.json"
    doc["findings"] = [{"kind": "GUARD_OVERWRITE", "region": evil, "case": path, "buffer": evil, "start": 0,
                        "stop": 1, "detail": evil}]
    doc["cases"] = {path: {"path": path, "repro": f"python -m kvfence repro {path}", "kinds": ["GUARD_OVERWRITE"]}}
    text = text_table(doc)
    assert "\x1b" not in text and "\x07" not in text and "\\x1b]0;pwn" in text
