"""The table map of a case file in ``report.html``: the engine's drawing of any contract's tables (a contract whose
``report`` hook draws its own, the draft kernel's buffer map, gets that instead).

Computed from the summary's record of the case file and its findings alone, with the contract's oracle: for every output
row a finding touches, one bar of the row's columns and the guard after it, in runs of one status:

* green: written as the oracle expects; light grey: the row's slack (columns the launch must not write);
* hatched yellow: columns the row's length needs past the row's width (``TABLE_TRUNCATED``: the consumer reads
  them from whatever follows the row);
* a finding's colour over the elements it names (orange wrong value, grey missing, red stray write, purple
  guard overwrite), numbered, with the list under the map giving its samples (a guard poison or canary found
  there decoded in its detail), its expected owners and the programs that store what was found there
  (``writers``: ``Contract.owner`` of the elements the oracle gives those values).

Each run's width is proportional to its length, at least a few pixels for a finding's run, so a one-element
overflow past a 262144-page row stays visible. Every value is escaped (``kvfence.reports.markup``).
"""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

from kvfence.engine.findings import programs_text
from kvfence.reports.markup import Markup, html, join

COLOURS = {"ok": "#3c9d4e", "slack": "#d9d9d9", "needed past the row": "#f2d22e", "VALUE_MISMATCH": "#f08a24",
           "MISSING_WRITE": "#8c8c8c", "STRAY_WRITE": "#d62728", "GUARD_OVERWRITE": "#7b3fb5", "guard": "#f4f4f4"}
_REGION = re.compile(r"^(row|guard after row) (\d+)$")


def _runs(length: int, marks: List[Tuple[int, int, str]], default, edges=()) -> List[Tuple[int, int, str]]:
    """Split ``[0, length)`` into runs: ``marks`` (start, stop, status) over ``default(i)``'s statuses, which
    change only at ``edges``."""
    status = [default(i) for i in range(length)] if length <= 4096 else None
    if status is None:  # long rows: only the boundaries of marks and of the default matter
        cuts = sorted({0, length} | set(edges) | {m[0] for m in marks} | {m[1] for m in marks})
        out = []
        for a, b in zip(cuts, cuts[1:]):
            if a >= length:
                break
            hit = [m[2] for m in marks if m[0] <= a < m[1]]
            out.append((a, min(b, length), hit[-1] if hit else default(a)))
        return out
    for start, stop, s in marks:
        for i in range(max(0, start), min(length, stop)):
            status[i] = s
    out, begin = [], 0
    for i in range(1, length + 1):
        if i == length or status[i] != status[begin]:
            out.append((begin, i, status[begin]))
            begin = i
    return out


def _bar(runs: List[Tuple[int, int, str]], numbers: Dict[Tuple[int, int, str], int]) -> Markup:
    cells = []
    for a, b, s in runs:
        n = numbers.get((a, b, s))
        label = f"[{n}]" if n else ""
        minimum = "6px" if s not in ("ok", "slack", "guard") else "1px"
        cells.append(html("<div title='{}' style='flex:{} 1 0;min-width:{};background:{};font-size:10px;"
                          "color:#fff;overflow:hidden'>{}</div>", f"{s} [{a}, {b})", b - a, minimum,
                          COLOURS.get(s, "#000"), label))
    return html("<div style='display:flex;height:18px;border:1px solid #999'>{}</div>", join(cells))


def table_map_html(record, launch, findings: List[dict]) -> Markup:
    """The map of every output row a finding touches (row 0 when none names a row)."""
    expected = record.expected(launch)
    width = launch.width
    touched = sorted({int(m.group(2)) for f in findings for m in [_REGION.match(str(f.get("region", "")))] if m}) or [0]
    numbered = {}
    listing = []
    for i, f in enumerate(findings, 1):
        numbered[i] = f
        listing.append(html("<li>[{}] {} {} {} [{}:{}] {}; samples {}; expected owners {}; written by {}</li>", i,
                            f.get("kind"), f.get("buffer"), f.get("region"), f.get("start"), f.get("stop"),
                            f.get("detail", ""), f.get("samples", [])[:3],
                            programs_text(f.get("programs", [])[:4], f.get("owner_names", ())) or "-",
                            programs_text(f.get("writers", [])[:4], f.get("owner_names", ())) or "-"))
    parts = []
    for table_name, cells in expected.items():
        for row in touched:
            need = 1 + max([c for (r, c) in cells if r == row], default=-1)
            row_marks: List[Tuple[int, int, str]] = []
            guard_marks: List[Tuple[int, int, str]] = []
            numbers: Dict[Tuple[int, int, str], int] = {}
            for _i, f in numbered.items():
                if f.get("buffer") != table_name:
                    continue
                m = _REGION.match(str(f.get("region", "")))
                if not m or int(m.group(2)) != row:
                    continue
                mark = (int(f["start"]), int(f["stop"]), str(f["kind"]))
                if f["kind"] == "TABLE_TRUNCATED":
                    continue
                (row_marks if m.group(1) == "row" else guard_marks).append(mark)
            row_runs = _runs(width, row_marks, lambda j, need=need: "ok" if j < need else "slack", (need,))
            past = max(need - width, 0)
            guard_len = max([past] + [g[1] for g in guard_marks] + [8])
            guard_runs = _runs(guard_len, guard_marks,
                               lambda j, past=past: "needed past the row" if j < past else "guard", (past,))
            for runs in (row_runs, guard_runs):
                for a, b, s in runs:
                    for i, f in numbered.items():
                        if str(f["kind"]) == s and int(f["start"]) <= a < int(f["stop"]):
                            numbers[(a, b, s)] = i
            parts.append(html("<h3>{} row {}: width {}, the length needs {}{}</h3>"
                              "<div style='display:flex;gap:4px'><div style='flex:3'>{}<small>row: 0 .. {}</small>"
                              "</div><div style='flex:1'>{}<small>guard after the row</small></div></div>",
                              table_name, row, width, need, " (too small)" if need > width else "",
                              _bar(row_runs, numbers), width, _bar(guard_runs, numbers)))
    legend = join(html("<span style='background:{};padding:0 6px;margin-right:6px'>{}</span>", c, s)
                  for s, c in COLOURS.items())
    return html("<div>{}</div>{}<ol>{}</ol>", legend, join(parts), join(listing))


def case_map_html(summary_record: dict, findings: List[dict]) -> Markup:
    """The map of one case file (its summary record holds the launch as data: ``case``), with its findings; a case
    whose tables are larger than one case may take is named, not drawn (nothing is built for it)."""
    from kvfence.engine import registry
    from kvfence.engine.checking import require_fits
    from kvfence.engine.launch import from_record
    from kvfence.errors import BadInput

    try:
        record = registry.get(summary_record["contract"])
        launch = from_record(record, summary_record["case"])
        require_fits(record, launch, None)
    except (BadInput, KeyError, TypeError) as exc:
        return html("<p class='bad'>No buffer map: the case record is not a valid case ({}).</p>", str(exc))
    mine = [f for f in findings if f.get("case") == summary_record.get("path")]
    return html("<div class='buffer-map' data-case='{}'>{}</div>", summary_record.get("path"),
                table_map_html(record, launch, mine))
