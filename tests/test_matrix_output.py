"""What the matrices print: tables split to fit 120 columns, a progress bar instead of a line per item,
and an earlier run's report moved aside (the CLI runs are in test_shipped.py and test_release_matrix.py)."""

from __future__ import annotations

import io

import pytest

from kvfence.engine.outdir import EARLIER_DIR, set_aside_earlier_report
from kvfence.engine.progress import CountBar
from kvfence.reports.text_table import WIDTH, markdown_tables


def _tables(lines):
    """The tables of ``markdown_tables``' lines, each as its header's cells and its rows' cells."""
    out, current = [], None
    for line in lines + [""]:
        if not line:
            if current:
                out.append(current)
            current = None
        elif current is None:
            current = {"header": line.strip("| ").split(" | "), "rows": []}
        elif not line.startswith("|---"):
            current["rows"].append(line.strip("| ").split(" | "))
    return out


def test_a_wide_table_is_split_by_columns_each_part_keeping_the_key_column():
    header = ["releases"] + [f"backend-{i:02d} graph" for i in range(16)]
    rows = [[f"0.5.{r} .. 0.5.{r}.post4 (5)"] + [f"OVERFLOW at ctx limit {r}{i}" for i in range(16)] for r in range(8)]
    lines = markdown_tables(header, rows)
    assert max(len(line) for line in lines) <= WIDTH
    tables = _tables(lines)
    assert len(tables) > 1
    # Every column appears once, in order, each part led by the key column, and no cell is lost or moved.
    assert [h for t in tables for h in t["header"][1:]] == header[1:]
    for t in tables:
        assert t["header"][0] == "releases"
        cols = [header.index(h) for h in t["header"]]
        assert t["rows"] == [[row[c] for c in cols] for row in rows]


def test_a_narrow_table_stays_one_table_and_a_too_wide_column_stands_alone():
    assert markdown_tables(["a", "b"], [["1", "2"]]) == ["| a | b |", "|---|---|", "| 1 | 2 |"]
    wide = "x" * (WIDTH + 10)
    tables = _tables(markdown_tables(["k", "c1", "c2", "c3"], [["r", wide, "y", "z"]]))
    assert [t["header"] for t in tables] == [["k", "c1"], ["k", "c2", "c3"]]
    with pytest.raises(ValueError, match="a row of 1 cells under 2 columns"):
        markdown_tables(["a", "b"], [["1"]])


def test_the_bar_in_a_log_prints_at_most_one_line_per_interval_and_always_the_last():
    stream = io.StringIO()
    bar = CountBar(740, "cells", stream, tty=False, every_s=3600)
    for i in range(740):
        bar.advance(f"cell {i}")
    bar.note("kvfence: a failure worth a line")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and "740/740 cells" in lines[0] and "cell 739" in lines[0]
    assert lines[1] == "kvfence: a failure worth a line"


def test_the_bar_on_a_terminal_redraws_one_line_and_a_note_keeps_its_own():
    stream = io.StringIO()
    bar = CountBar(3, "releases", stream, tty=True)
    bar.advance("sglang==0.5.1")
    bar.note("a note")
    bar.advance("sglang==0.5.2")
    bar.advance("sglang==0.5.3")
    bar.close()
    text = stream.getvalue()
    assert text.count("\n") == 2 and text.endswith("\n")  # the note's line and the bar's last
    assert "a note\n" in text and "3/3 releases" in text.rsplit("\r", 1)[1]
    assert "[########################]" in text.rsplit("\r", 1)[1]


def test_an_earlier_matrix_report_moves_aside_and_nothing_else_does(tmp_path):
    out = tmp_path / "m"
    assert set_aside_earlier_report(out) is None  # no folder yet
    (out / "0.5.23" / "flashmla-page-table").mkdir(parents=True)
    for name in ("report.md", "report.html", "matrix.json", "shipped.json", "notes.txt"):
        (out / name).write_text(name)
    (out / "mine").mkdir()
    moved = set_aside_earlier_report(out, now=0)
    assert moved["count"] == 5
    dest = out / EARLIER_DIR / sorted(p.name for p in (out / EARLIER_DIR).iterdir())[0]
    assert str(dest) == moved["folder"]
    assert sorted(p.name for p in dest.iterdir()) == ["0.5.23", "matrix.json", "report.html", "report.md",
                                                     "shipped.json"]
    assert sorted(p.name for p in out.iterdir()) == [EARLIER_DIR, "mine", "notes.txt"]
    assert set_aside_earlier_report(out) is None  # nothing of a matrix left to move
    (out / "report.md").write_text("second")
    second = set_aside_earlier_report(out, now=0)  # the same second: a folder of its own
    assert second["folder"] != moved["folder"] and (out / "report.md").exists() is False
