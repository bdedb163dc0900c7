"""report.html as a page to debug from: every value escaped (report DIR, report --merge, sweep.html, the release
matrix), and each case file's buffer map placing the oracle's program segments and the kernel's bad writes
where the case and its findings say, checked in the HTML and in a real browser (headless Chromium)."""

import json
import re
import shutil
import subprocess
import sys
from html import escape as html_escape
from pathlib import Path

import pytest

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.record import launch_of
from kvfence.engine import casefile
from kvfence.engine import summary as summary_mod
from kvfence.reports.render import write_reports

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = "<script>alert(5)</script>"
ATTR = re.compile(r"<g class='(segment|mark)' ([^>]*)>")


def _case(sizing: str, kernel: str = "reference", layout: str = "redzone") -> Case:
    """Two requests (3 and 1 tokens), topk 2, 2 steps: 8 programs, two rows, segments of different lengths."""
    config = Config(topk=2, num_steps=2, page_size=1, ctx=4, max_bs=2, sizing=sizing, mode="eager", layout=layout)
    return Case(config, Batch(seq_lens=(3, 1), req_pool_indices=(0, 1), token_seed=7), kernel)


def _doc(session, case: Case, out: Path) -> dict:
    """A summary of one checked case, as ``fuzz`` writes it (findings with their case file and record)."""
    launch = launch_of(case)
    findings = session.check(launch)
    doc = {"kvfence_summary": 1, "examples": 1, "launches": 1, "elapsed_s": 0.1, "cases_per_s": 10.0,
           "findings": [], "cases": {}, "sizing": launch.sizing, "kernel": launch.kernel, "contract": launch.contract}
    if findings:
        path = str(casefile.write_case(launch, findings, out_dir=out))
        doc["findings"] = [dict(f.to_dict(), case=path) for f in findings]
        doc["cases"][path] = summary_mod.case_record(path, launch, findings, source="fuzz")
    return doc


def _marks_and_segments(page: str):
    """``(segments, marks)`` of a report page: ``{(buffer, row, program, start, stop)}`` and
    ``[(buffer, row, kind, start, stop)]``, read from the SVG's data attributes."""
    segments, marks = set(), []
    for svg in re.finditer(r"<svg [^>]*data-buffer='([^']+)' data-row='row (\d+)'.*?</svg>", page, re.S):
        buffer, row = svg.group(1), int(svg.group(2))
        for cls, attrs in ATTR.findall(svg.group(0)):
            a = dict(re.findall(r"data-(\w+)='([^']*)'", attrs))
            if cls == "segment":
                segments.add((buffer, row, a["program"], int(a["start"]), int(a["stop"])))
            else:
                marks.append((buffer, row, a["kind"], int(a["start"]), int(a["stop"])))
    return segments, marks


def _expected_segments(case: Case):
    """The oracle's segments and kv_indptr columns, named as the map names them."""
    ws, bs = case.expected(), case.launch().num_seqs * case.config.topk
    out = {("kv_indices", g.s, f"{g.s},{g.b},{g.k}", g.start, g.stop) for g in ws.segments}
    for s, z in ws.kv_indptr:
        b, k = (0, 0) if z == bs else divmod(z, case.config.topk)
        out.add(("kv_indptr", s, f"{s},{b},{k}", z, z + 1))
    return out


@pytest.fixture(scope="module")
def reports(make_session, tmp_path_factory):
    """report.html of a planted value bug (off_by_one_n), of the pre-fix sizing, and of the correct pair."""

    spec = "mutant:off_by_one_n"
    out = {}
    cases = {"value": _case("safe", spec), "sizing": _case("prefix"), "clean": _case("safe"),
             "production": _case("prefix", layout="production")}
    for name, case in cases.items():
        folder = tmp_path_factory.mktemp(name)
        doc = _doc(make_session(case.kernel), case, folder)
        (folder / "summary.json").write_text(json.dumps(doc))
        written = write_reports(doc, folder)
        out[name] = (case, doc, written["html"].read_text(), folder)
    return out


def test_the_map_puts_every_program_where_the_oracle_expects_it(reports):
    for name, (case, doc, page, _) in reports.items():
        segments, _ = _marks_and_segments(page)
        if doc["findings"]:
            assert segments == _expected_segments(case), name
        else:
            assert segments == set() and "<svg" not in page  # a clean run has no case file to draw


def test_a_value_bug_is_marked_where_the_kernel_wrote_wrong(reports):
    case, doc, page, _ = reports["value"]
    _, marks = _marks_and_segments(page)
    kinds = {f["kind"] for f in doc["findings"]}
    assert kinds & {"MISSING_WRITE", "VALUE_MISMATCH"}
    assert {m[2] for m in marks} == kinds - {"SIZING_VIOLATION"}
    for f in doc["findings"]:
        m = re.match(r"row (\d+)$", f["region"])
        if m and f["stop"]:
            assert (f["buffer"], int(m.group(1)), f["kind"], f["start"], f["stop"]) in marks
    # Findings come first, with their samples and programs; statistics after; case files are links.
    assert page.index("<h2>Findings</h2>") < page.index("<h2>Run</h2>")
    first = doc["findings"][0]
    s, b, k = first["programs"][0]
    assert f"({s},{b},{k})" in page.split("<h2>Case files</h2>")[0]
    assert f"expected {first['samples'][0][1]}, found {first['samples'][0][2]}" in page
    assert "<a href='./cases/" in page
    # The case file's repro line, as its record gives it.
    assert html_escape(next(iter(doc["cases"].values()))["repro"]) in page


def test_a_sizing_bug_shows_the_segments_past_the_row_and_the_guard_writes(reports):
    case, doc, page, _ = reports["sizing"]
    _, marks = _marks_and_segments(page)
    width = case.sizing_summary()["width"]
    assert "SIZING_VIOLATION" in {f["kind"] for f in doc["findings"]}
    past = [g for g in case.expected().segments if g.stop > width]
    assert past, "the pre-fix sizing must put a segment past the row"
    overwrites = [m for m in marks if m[2] in ("GUARD_OVERWRITE", "STRAY_WRITE")]
    assert overwrites and all(m[3] >= width for m in overwrites if m[0] == "kv_indices" and m[2] == "GUARD_OVERWRITE")
    assert any(m[2] == "SIZING_VIOLATION" and m[3] == width for m in marks)


def test_the_map_draws_who_wrote_each_bad_element_apart_from_its_expected_owners(reports):
    """A spill past row S was written by row S's programs (their values, found in the guard): the findings
    name them as writers, and the map outlines exactly the writers' segments (red) and the expected
    owners that wrote none of it (dashed). A missing write has no writer."""
    case, doc, page, _ = reports["sizing"]
    guards = [f for f in doc["findings"] if f["region"].startswith("guard after row")]
    assert guards
    for f in guards:
        row = int(f["region"].rsplit(" ", 1)[1])
        assert f["writers"] and all(w[0] == row for w in f["writers"]), f
    roles = dict((r, set()) for r in ("writer", "victim"))
    for role, program in re.findall(r"<g class='(writer|victim)' data-role='\1' data-program='([^']+)'", page):
        roles[role].add(tuple(int(x) for x in program.split(",")))
    drawn = {tuple(w) for f in doc["findings"] if f["buffer"] == "kv_indices" for w in f["writers"]}
    assert roles["writer"] == drawn & {(g.s, g.b, g.k) for g in case.expected().segments}
    owners = {tuple(p) for f in doc["findings"] if f["buffer"] == "kv_indices" and f["kind"] != "SIZING_VIOLATION"
              for p in f["programs"]}
    assert roles["victim"] == owners - roles["writer"]
    # The findings table names both columns (the interface no longer has a contract name its program axes:
    # the header says "programs"); the draft's own map names the coordinates (s, b, k) in its legend.
    assert "written by (programs)" in page and "expected owners (programs)" in page
    assert "program segment the oracle expects (s, b, k)" in page
    _, value_doc, _, _ = reports["value"]
    assert all(f["writers"] == [] for f in value_doc["findings"] if f["kind"] == "MISSING_WRITE")
    assert any(f["writers"] for f in value_doc["findings"] if f["kind"] == "VALUE_MISMATCH")


def test_the_correct_kernel_and_sizing_have_no_marks(reports):
    _, doc, page, _ = reports["clean"]
    assert doc["findings"] == [] and _marks_and_segments(page) == (set(), [])


def _hostile(doc: dict) -> dict:
    """``doc`` with markup in every string value a run writes: names, details, regions, a sample, versions.
    (A typed field such as a config's ``ctx`` holding markup is refused on read: tests/test_hostile.py.)"""
    doc = json.loads(json.dumps(doc))
    doc.update(kernel=HOSTILE, domain_text=HOSTILE, versions={"torch": HOSTILE}, sizing=HOSTILE,
               earlier_cases={"folder": HOSTILE, "count": 1})
    for f in doc["findings"]:
        f.update(detail=HOSTILE, region=f"row 0 {HOSTILE}", samples=[[0, HOSTILE, 1]])
    for c in doc["cases"].values():
        c["source"] = HOSTILE
    return doc


def _kvfence(*args):
    return subprocess.run([sys.executable, "-m", "kvfence", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_no_markup_of_a_hostile_summary_survives_report_dir_or_merge(reports, tmp_path):
    _, doc, _, folder = reports["sizing"]
    run = tmp_path / "run"
    shutil.copytree(folder, run)
    hostile = _hostile(doc)
    hostile["findings"] = [dict(f, case=str(run / "cases" / Path(f["case"]).name)) for f in hostile["findings"]]
    hostile["cases"] = {str(run / "cases" / Path(k).name): dict(v, path=str(run / "cases" / Path(k).name))
                        for k, v in hostile["cases"].items()}
    (run / "summary.json").write_text(json.dumps(hostile))
    res = _kvfence("report", run)
    assert res.returncode == 1, res.stderr
    merged = tmp_path / "merged"
    res = _kvfence("report", "--merge", run, "--out", merged)
    assert res.returncode == 1, res.stderr
    for page in ((run / "report.html").read_text(), (merged / "report.html").read_text()):
        assert "<script" not in page.lower()
        assert "&lt;script&gt;alert(5)&lt;/script&gt;" in page
        assert "No buffer map" in page or "<svg" in page


def test_no_markup_survives_the_sweep_and_release_matrix_pages(tmp_path):
    from kvfence.release.matrix_report import html_report as matrix_html
    from kvfence.reports.sweep import sweep_html

    verdict = {"findings": [{"extra": {"message": HOSTILE}, "count": 1, "region": HOSTILE}],
               "tool_errors": [{"extra": {"problem": HOSTILE}, "detail": HOSTILE}], "exit_code": HOSTILE,
               "source": HOSTILE, "slowdown": HOSTILE, "child_exit": HOSTILE}
    sweep = {"tools": [HOSTILE], "kernel": HOSTILE, "explored": 1, "failing": 1, "canary_seconds": 1,
             "canary_cases_with_findings": 1, "per_tool": {HOSTILE: {"cases_with_findings": HOSTILE,
                                                                        "median_slowdown": 1}},
             "cases": [{"case": HOSTILE, "mode": HOSTILE, "need": 1, "width": HOSTILE,
                        "canary": {"regions": [HOSTILE]}, "baseline_s": 1, "baseline_exit": HOSTILE,
                        "baseline_errors": [{"extra": {"problem": HOSTILE}}], "tools": {HOSTILE: verdict}}],
             "detection_matrix": {"modes": [HOSTILE], "detectors": [HOSTILE], "tool_errors": HOSTILE,
                                  "classes": [{"class": HOSTILE, "description": HOSTILE, "kernel": HOSTILE,
                                               "cells": {}}]}}
    cell = {"version": HOSTILE, "sizing": "safe", "contract": "draft", "status": HOSTILE, "kinds": [HOSTILE],
            "case_files": [HOSTILE], "message": HOSTILE}
    matrix = {"sizings": ["safe"], "contracts": ["draft"], "cells": [cell], "safe_sizings": [HOSTILE],
              "releases": [{"version": HOSTILE, "abis": {HOSTILE: HOSTILE}, "source_path": HOSTILE}],
              "statuses": {HOSTILE: HOSTILE}, "device": HOSTILE, "max_examples": HOSTILE, "seed": HOSTILE,
              "versions": [HOSTILE], "tool_versions": {HOSTILE: HOSTILE}}
    for page in (sweep_html(sweep), matrix_html(matrix, tmp_path)):
        assert "<script" not in page.lower() and "&lt;script&gt;" in page


def _chromium():
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


def test_the_map_renders_in_a_real_browser_with_the_case_labels(reports, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on this machine (.ci/run installs Debian's chromium)")
    case, doc, _, folder = reports["value"]
    res = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path}",
                          "--dump-dom", (folder / "report.html").as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    segments, marks = _marks_and_segments(dom.replace('"', "'"))
    assert segments == _expected_segments(case)
    assert {m[2] for m in marks} == {f["kind"] for f in doc["findings"]}
    # The labels a reader sees: every program of the case, each finding's number.
    for g in case.expected().segments:
        assert f">({g.s},{g.b},{g.k})</text>" in dom
    assert ">[1]</text>" in dom


def test_segments_past_the_row_are_drawn_in_either_layout(reports):
    """Without guards between rows (production) an overflow lands in the next row: the axis runs on into it
    so that no program's segment is clipped to nothing."""
    for name in ("sizing", "production"):
        case, _, page, _ = reports[name]
        widths = {m.group(1): float(m.group(2)) for m in re.finditer(
            r"<g class='segment' data-program='([^']+)'[^>]*><rect x='[\d.]+' y='\d+' width='([\d.]+)'", page)}
        width = case.sizing_summary()["width"]
        past = [f"{g.s},{g.b},{g.k}" for g in case.expected().segments if g.start >= width]
        assert past and all(widths[p] > 5 for p in past), (name, widths)
    assert "data-zone='next row'" in reports["production"][2] and "data-zone='next row'" not in reports["sizing"][2]
