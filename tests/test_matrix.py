"""The detection matrix's bug classes (kernels/draft/bugclasses.py) and its rendering.

Each class's launcher must produce its class on the canary harness (redzone layout) and, in the layout
compute-sanitizer children run (production, no tail guard), land where that class lands in production;
the reference kernel on the same case must be clean. The matrix's numbers come only from a GPU run
(bash benchmarks/gpu.sh nightly)."""

import dataclasses

import pytest

from kvfence.contracts.draft.session import Session
from kvfence.engine.findings import Kind
from kvfence.reports.sweep import matrix_markdown, matrix_rows
from kvfence.sanitizer import matrix

pytestmark = pytest.mark.cpu_only

CLASSES = {b.name: b for b in matrix.bug_classes()}
#: What each class leaves in the redzone layout (guards after every row, absorbing tail)...
REDZONE = {
    "row-to-row overflow": (Kind.GUARD_OVERWRITE, "kv_indices", "guard after row 0"),
    "short tail overflow": (Kind.GUARD_OVERWRITE, "kv_indices", "guard after row 2"),
    # kv_indices' tail guard reaches past the far-tail store (kvfence.contracts.draft.runner_buffers.TAIL_REACH): it
    # lands in kvfence's own guard, whatever the allocator put next to the buffer.
    "far tail overflow": (Kind.GUARD_OVERWRITE, "kv_indices", "tail"),
    "stray write into an input": (Kind.STRAY_WRITE, "req_to_token", "row 0"),
}
#: ... and in the sanitizer children's layout: rows contiguous, nothing after the last row.
PRODUCTION = {
    "row-to-row overflow": (Kind.VALUE_MISMATCH, "kv_indices", "row 1"),
    "short tail overflow": (Kind.OOB_WRITE, None, None),  # leaves the allocation at its first element
    "far tail overflow": (None, None, None),
    "stray write into an input": (Kind.STRAY_WRITE, "req_to_token", "row 0"),
}


def test_every_class_of_the_issue_has_a_target():
    assert set(CLASSES) == {"row-to-row overflow", "short tail overflow", "far tail overflow",
                            "stray write into an input"}


def _has(findings, kind, buffer, region):
    return any((kind is None or f.kind == kind) and (buffer is None or f.buffer == buffer)
               and (region is None or f.region == region)
               for f in findings)


@pytest.mark.parametrize("mode", matrix.MODES)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_each_class_lands_where_its_name_says(device, name, mode):
    bug = CLASSES[name]
    case = matrix.class_case(bug, mode)
    redzone = Session(device, bug.kernel).check(case)
    assert _has(redzone, *REDZONE[name]), [f.headline() for f in redzone]
    production = dataclasses.replace(case, layout="production")
    found = Session(device, bug.kernel, absorb=False).check(production)
    assert _has(found, *PRODUCTION[name]), [f.headline() for f in found]
    # The same case with the correct kernel is clean in both layouts.
    reference = dataclasses.replace(case, kernel="reference")
    assert Session(device, "reference").check(reference) == []
    assert Session(device, "reference", absorb=False).check(dataclasses.replace(production, kernel="reference")) == []


def _cell(seen, errors=()):
    return {"seen": seen, "what": [], "tool_errors": list(errors), "seconds": 1.0, "log": "x.log"}


def test_matrix_rendering_shows_seen_missed_and_errored_cells():
    cells = {m: {d: _cell(False) for d in matrix.DETECTOR_NAMES} for m in matrix.MODES}
    cells["eager"]["canary"] = _cell(True)
    cells["graph"]["memcheck nocache"] = _cell(False, ["the child exited 3: RuntimeError"])
    doc = {"detectors": list(matrix.DETECTOR_NAMES), "modes": list(matrix.MODES), "tool_errors": 1,
           "classes": [{"class": "row-to-row overflow", "kernel": "k", "description": "d", "cells": cells}]}
    header, rows = matrix_rows(doc)
    row = dict(zip(header, rows[0]))
    assert row["eager canary"] == "seen" and row["graph memcheck nocache"] == "error"
    assert row["eager memcheck"] == "missed"
    summary = matrix.summary(doc)["row-to-row overflow"]
    assert summary == {k: v for k, v in row.items() if k != "bug class"}
    md = matrix_markdown(doc).splitlines()
    assert len(md) == 3 and md[0].startswith("| bug class | eager canary |")


@pytest.mark.long
def test_the_matrix_fills_every_cell_and_never_counts_a_failed_run_as_missed(tmp_path, monkeypatch):
    # End to end on the CPU: canary cells are real repro children under the interpreter; memcheck is the
    # fake tool, first clean (every memcheck cell "missed"), then dying (every memcheck cell "error").
    from kvfence.sanitizer import tool as sanitizer
    from tests.fake_sanitizer import install_fake_tool

    install_fake_tool(tmp_path, monkeypatch)
    exe = sanitizer.locate()
    work = tmp_path / "work"
    work.mkdir()
    doc = matrix.run_matrix(exe, tmp_path / "out", work, timeout=300, jobs=2, device="cpu")
    table = matrix.summary(doc)
    assert set(table) == set(CLASSES) and doc["tool_errors"] == 0
    for name, cells in table.items():
        assert all(cells[f"{m} canary"] == "seen" for m in matrix.MODES), (name, cells)
        assert all(v == "missed" for k, v in cells.items() if "memcheck" in k), (name, cells)
    monkeypatch.setenv("FAKE_SCENARIO", "dead_child")
    monkeypatch.setattr(matrix, "canary_cell", lambda *a, **k: _cell(True))  # only memcheck runs again
    dead = matrix.summary(matrix.run_matrix(exe, tmp_path / "out", work, timeout=300, jobs=2, device="cpu"))
    assert all(v == "error" for cells in dead.values() for k, v in cells.items() if "memcheck" in k)
