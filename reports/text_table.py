"""Markdown tables that fit a terminal: the matrices print their report.md, so a table wider than
``WIDTH`` characters is split by columns into several tables, each repeating the leading (key) columns.
Cells are not padded (a markdown table reads the same), so a line is as long as its cells."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from kvfence.errors import printable

#: The widest line a printed report may have (a terminal or a CI log viewer without wrapping).
WIDTH = 120


def _line(cells: Sequence[str]) -> str:
    """One table line; a cell quoting a wheel's text keeps to its cell (a newline or a ``|`` in it escaped)."""
    return "| " + " | ".join(printable(c, None).replace("|", "\\|") for c in cells) + " |"


def markdown_tables(header: Sequence[str], rows: Sequence[Sequence[str]], *, keep: int = 1,
                    width: int = WIDTH) -> List[str]:
    """The lines of one or more markdown tables of ``rows`` under ``header``: the columns after the first
    ``keep`` are dealt, in order, into tables whose every line fits ``width`` (a column too wide on its own
    gets a table of its own); consecutive tables are separated by a blank line."""
    if keep < 1 or keep > len(header):
        raise ValueError(f"markdown_tables: keep={keep} with {len(header)} columns")
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"markdown_tables: a row of {len(row)} cells under {len(header)} columns")

    def fits(cols: List[int]) -> bool:
        return all(len(_line([r[i] for i in cols])) <= width for r in [header, *rows])

    groups: List[List[int]] = []
    current: List[int] = []
    for col in range(keep, len(header)):
        if current and not fits(list(range(keep)) + current + [col]):
            groups.append(current)
            current = []
        current.append(col)
    if current or not groups:
        groups.append(current)
    lines: List[str] = []
    for group in groups:
        cols = list(range(keep)) + group
        if lines:
            lines.append("")
        lines.append(_line([header[i] for i in cols]))
        lines.append("|" + "---|" * len(cols))
        lines.extend(_line([row[i] for i in cols]) for row in rows)
    return lines


def shown_path(path: str, folder: Optional[Path]) -> str:
    """``path`` as a report in ``folder`` shows it: ``./``-relative when inside (short, and a working link
    in the report's markdown), else as given."""
    if folder is None:
        return path
    try:
        return "./" + Path(path).resolve().relative_to(Path(folder).resolve()).as_posix()
    except ValueError:
        return path
