"""The buffer map of one case file: where the oracle expects each program to write, and where it did not.

For each step row of kv_indices and kv_indptr the map draws, on one axis of row elements:

* the zones of the guarded buffer (front guard, the row, its slack after ``U(s)``, the guard after it,
  the tail; kv_indptr's column 0, which no program writes), from ``runner_buffers.buffer_geometry``;
* the segment of every program ``(s, b, k)`` where the oracle expects it (``Case.expected``), past the
  row's end when the sizing is too small;
* what the kernel did, from the case's findings: wrong values, missing writes, writes outside the write
  set and guard overwrites each in their colour, labelled with their element ranges and programs.
  Elsewhere inside the write set it wrote what the oracle expects (the verdict saw no difference).

Everything comes from the case (the oracle, plain Python) and the findings in the summary: no device.
Long stretches are drawn to scale and short interesting ones (a finding, a segment) widened, so a
one-element bug in a 10,000-element row still shows; the tick labels give the element numbers.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from kvfence.contracts.draft.runner_buffers import MIN_GUARD
from kvfence.reports.markup import Markup, html, join

#: Fill colour of each finding kind on the map (the legend repeats them).
KIND_COLOURS = {"VALUE_MISMATCH": "#f28e2b", "MISSING_WRITE": "#9e9e9e",
                "STRAY_WRITE": "#d62728", "GUARD_OVERWRITE": "#7b1fa2", "SIZING_VIOLATION": "#f2c40f",
                "OOB_WRITE": "#d62728"}
OTHER_COLOUR = "#e377c2"
#: Kinds whose fill is dark enough for a white label.
DARK_KINDS = ("GUARD_OVERWRITE", "STRAY_WRITE", "OOB_WRITE")
ZONE_COLOURS = {"front guard": "#d9d9d9", "guard": "#d9d9d9", "tail": "#d9d9d9", "row": "#ffffff",
                "slack": "#f1f1f1", "column 0": "#d9d9d9", "next row": "#fde0c5"}
SEGMENT_COLOURS = ("#c6dbef", "#9ecae1")
WROTE_OK = "#c7e9c0"
#: Drawing width of a row in pixels, and the least width of an interval holding a finding or a program.
WIDTH_PX, MARK_PX, SEGMENT_PX, LABEL_PX, GUARD_PX = 860, 26, 52, 30, 70
#: Zones no program may write: idle ones are drawn short (their length is in their label).
GUARD_ZONES = ("front guard", "guard", "tail")
#: A case whose rows hold more programs than this draws them without per-program labels.
MAX_LABELLED_SEGMENTS = 40
#: Spans drawn per row at most (programs grouped by request beyond it), and the written elements of a case
#: up to which the map asks the full oracle (beyond it the §2 segment offsets alone).
MAX_DRAWN_SEGMENTS, MAX_ORACLE_ELEMENTS = 256, 200_000


@dataclass
class Span:
    """Elements ``[lo, hi)`` of one row (row-relative: negative in the front guard, ``>= width`` in
    the guard after the row)."""

    lo: int
    hi: int
    label: str
    title: str = ""


@dataclass
class Mark(Span):
    kind: str = ""
    number: int = 0
    programs: List[Tuple[int, int, int]] = field(default_factory=list)
    writers: List[Tuple[int, int, int]] = field(default_factory=list)


@dataclass
class MapRow:
    name: str
    lo: int
    hi: int
    zones: List[Tuple[int, int, str]]
    segments: List[Span]
    marks: List[Mark] = field(default_factory=list)
    caption: str = ""
    #: Where the row's elements end (beyond: its guard, the next row or the tail).
    width: int = 0


@dataclass
class BufferMap:
    buffer: str
    rows: List[MapRow]


_REGION = re.compile(r"^(?:(front guard|tail)|(?:slack of )?row (\d+)|guard after row (\d+))$")


def _flat_start(region: str, start: int, geo, stride: int) -> Optional[int]:
    """Flat position of element ``start`` of a finding's first region (``kvfence.engine.tables.Guarded.locate``)."""
    m = _REGION.match(region.split(" .. ")[0].strip())
    if not m:
        return None
    if m.group(1) == "front guard":
        return start
    if m.group(1) == "tail":
        return geo.front + geo.rows * stride + start
    if m.group(2) is not None:
        return geo.front + int(m.group(2)) * stride + start
    return geo.front + int(m.group(3)) * stride + geo.width + start


def _rows(geo, used: List[int], column0: bool) -> List[MapRow]:
    stride = geo.width + geo.row_guard
    rows = []
    for s in range(geo.rows):
        lo = -geo.front if s == 0 else 0
        hi = stride + (geo.tail if s == geo.rows - 1 else 0)
        zones = [(-geo.front, 0, "front guard")] if s == 0 and geo.front else []
        live = min(used[s], geo.width)
        if column0:
            zones.append((0, 1, "column 0"))
        zones.append((1 if column0 else 0, live, "row"))
        if live < geo.width:
            zones.append((live, geo.width, "slack"))
        if geo.row_guard:
            zones.append((geo.width, stride, "guard"))
        if s == geo.rows - 1 and geo.tail:
            zones.append((stride, hi, "tail"))
        caption = (f"{geo.width} columns, programs write 1..{used[s] - 1} (column 0 never)" if column0
                   else f"width {geo.width}, U({s}) = {used[s]}"
                   + (" > width: too small" if used[s] > geo.width else ""))
        rows.append(MapRow(f"row {s}", lo, hi, [z for z in zones if z[1] > z[0]], [], caption=caption,
                           width=geo.width))
    return rows


def _place_marks(bmap: BufferMap, geo, findings: List[dict], first_number: int) -> int:
    """Add each finding on this buffer to the rows its elements fall in; returns the next free number."""
    stride = geo.width + geo.row_guard
    number = first_number
    for f in findings:
        count = int(f.get("stop", 0)) - int(f.get("start", 0))
        flat = _flat_start(f.get("region", ""), int(f.get("start", 0)), geo, stride)
        if count <= 0 or flat is None:
            continue
        number += 1
        programs = [tuple(p) for p in f.get("programs", [])]
        writers = [tuple(p) for p in f.get("writers", [])]
        for s, row in enumerate(bmap.rows):
            base = geo.front + s * stride
            lo, hi = max(flat, base + row.lo), min(flat + count, base + row.hi)
            if lo >= hi:
                continue
            row.marks.append(Mark(lo - base, hi - base, f"[{number}]", _finding_text(f), kind=f["kind"],
                                  number=number, programs=programs, writers=writers))
    return number


def _finding_text(f: dict) -> str:
    """The words of one finding as the terminal gives them (``Finding.headline``)."""
    from kvfence.engine.findings import Finding

    try:
        return Finding.from_dict(f).headline()
    except (KeyError, ValueError, TypeError):
        return f"{f.get('kind')} {f.get('buffer', '')} {f.get('region', '')}"


def case_maps(record: dict, findings: List[dict]) -> List[BufferMap]:
    """The kv_indices and kv_indptr maps of one case record (``reports/summary.case_record``) and the
    findings that name its case file. ``BadInput`` when the record does not describe a valid case."""
    from kvfence.contracts.draft.case import Case, batch_from_dict, config_from_dict
    from kvfence.contracts.draft.oracle import ProgramSegment, segment_offset
    from kvfence.contracts.draft.runner_buffers import buffer_geometry
    from kvfence.errors import require

    config = config_from_dict(record["config"])
    case = Case(config, batch_from_dict(record["batch"]), record.get("kernel") or "reference")
    launch = case.launch()
    used = case.used()
    kvi, kvp = buffer_geometry(config, config.sizing_n(launch.num_seqs))
    prefix = "window_" if config.is_rail else ""
    bs = launch.num_seqs * config.topk
    if sum(used) <= MAX_ORACLE_ELEMENTS:
        expected = case.expected()
        segments, columns = expected.segments, sorted(expected.kv_indptr)
    else:
        # A production-scale case: the oracle's element values are not needed for the map, only where each
        # program writes, which §2 gives directly (a §6 config's segments need the full oracle).
        require(not config.is_family, f"the case writes {sum(used)} elements; a §6 case that large is not drawn")
        segments = [ProgramSegment(s, b, k, o, o + launch.seq_lens[b] + s + 1)
                    for s in range(config.num_steps) for b in range(launch.num_seqs) for k in range(config.topk)
                    for o in [segment_offset(launch.seq_lens, config.topk, s, b, k)]]
        columns = [(s, z) for s in range(config.num_steps) for z in range(1, bs + 1)]

    indices = BufferMap(prefix + "kv_indices", _rows(kvi, used, column0=False))
    for seg in segments:
        indices.rows[seg.s].segments.append(Span(seg.start, seg.stop, f"({seg.s},{seg.b},{seg.k})",
                                                 f"program ({seg.s},{seg.b},{seg.k}) writes [{seg.start}, {seg.stop})"))
    indptr = BufferMap(prefix + "kv_indptr", _rows(kvp, [bs + 1] * kvp.rows, column0=True))
    for (s, z) in columns:
        b, k = (0, 0) if z == bs else divmod(z, config.topk)
        indptr.rows[s].segments.append(Span(z, z + 1, f"({s},{b},{k})", f"program ({s},{b},{k}) writes column {z}"))
    for bmap in (indices, indptr):
        for row in bmap.rows:
            row.segments = _drawable(row.segments)
            reach = max([sp.hi for sp in row.segments], default=row.hi)
            if reach > row.hi:
                # Segments past the row's guard (the production layout has none): they land in the next
                # row, which the axis shows rather than clipping them.
                row.zones.append((row.hi, reach, "next row"))
                row.hi = reach
    mine = [f for f in findings if f.get("case") == record.get("path")]
    number = 0
    for bmap, geo in ((indices, kvi), (indptr, kvp)):
        number = _place_marks(bmap, geo, [f for f in mine if f.get("buffer") == bmap.buffer], number)
    return [indices, indptr]


def _drawable(segments: List[Span]) -> List[Span]:
    """At most ``MAX_DRAWN_SEGMENTS`` spans per row: beyond that the programs of one request are one span
    ``(s,b,*)``, and beyond that again runs of requests are one span, so a 256-request row stays readable."""
    if len(segments) <= MAX_DRAWN_SEGMENTS:
        return sorted(segments, key=lambda sp: sp.lo)
    by_request: dict = {}
    for sp in segments:
        s, b, _ = sp.label.strip("()").split(",")
        by_request.setdefault((int(s), int(b)), []).append(sp)
    spans = [Span(min(x.lo for x in group), max(x.hi for x in group), f"({s},{b},*)",
                  f"programs ({s},{b},0..{len(group) - 1}) write "
                  f"[{min(x.lo for x in group)}, {max(x.hi for x in group)})")
             for (s, b), group in sorted(by_request.items())]
    if len(spans) <= MAX_DRAWN_SEGMENTS:
        return spans
    per = -(-len(spans) // MAX_DRAWN_SEGMENTS)
    out = []
    for i in range(0, len(spans), per):
        group = spans[i:i + per]
        first, last = group[0].label.strip("()").split(","), group[-1].label.strip("()").split(",")
        out.append(Span(group[0].lo, group[-1].hi, f"({first[0]},{first[1]}..{last[1]},*)",
                        f"programs of requests {first[1]}..{last[1]} write [{group[0].lo}, {group[-1].hi})"))
    return out


# -- drawing ---------------------------------------------------------------------------------------------
def _zone_at(row: MapRow, a: int, b: int) -> str:
    return next((z for lo, hi, z in row.zones if lo <= a and hi >= b), "row")


def _idle(row: MapRow, a: int, b: int) -> bool:
    """A stretch of guard that nothing was expected or found in: drawn at a fixed short width."""
    return (_zone_at(row, a, b) in GUARD_ZONES
            and not any(sp.lo < b and sp.hi > a for sp in row.segments + row.marks))


def _axis(row: MapRow) -> Tuple[List[int], List[float]]:
    """Breakpoints of the row and their x positions. Idle guards get a fixed short width; the rest is
    to scale, with intervals under a finding or a program widened to a readable least width (taken
    from the long intervals)."""
    breaks = {row.lo, row.hi}
    for lo, hi, _ in row.zones:
        breaks |= {lo, hi}
    for sp in row.segments + row.marks:
        breaks |= {max(row.lo, min(row.hi, sp.lo)), max(row.lo, min(row.hi, sp.hi))}
    points = sorted(breaks)
    intervals = list(zip(points, points[1:]))
    los = [sp.lo for sp in row.segments]
    idle = [_idle(row, a, b) for a, b in intervals]
    labelled = len(row.segments) <= MAX_LABELLED_SEGMENTS
    busy = sum(b - a for (a, b), i in zip(intervals, idle) if not i) or 1
    scale = max(1.0, WIDTH_PX - GUARD_PX * sum(idle)) / busy
    widths, least = [], []
    for (a, b), is_idle in zip(intervals, idle):
        seg = _covering(row.segments, los, a, b) if labelled else None
        need: float
        if is_idle:
            need = GUARD_PX
        elif any(m.lo < b and m.hi > a for m in row.marks):
            need = MARK_PX
        elif seg is not None:
            need = SEGMENT_PX if (a, b) == (seg.lo, seg.hi) else 8
        else:
            need = LABEL_PX if labelled and b - a > 1 else 2.0
        least.append(need)
        widths.append(need if is_idle else max(need, scale * (b - a)))
    excess = sum(widths) - WIDTH_PX
    flexible = sum(w - n for w, n in zip(widths, least))
    if excess > 0 and flexible > 0:
        cut = min(1.0, excess / flexible)
        widths = [w - (w - n) * cut for w, n in zip(widths, least)]
    xs = [0.0]
    for w in widths:
        xs.append(xs[-1] + w)
    return points, xs


def _covering(segments: List[Span], los: List[int], a: int, b: int) -> Optional[Span]:
    """The segment (sorted by ``lo``, not overlapping) that covers ``[a, b)``, if any."""
    i = bisect.bisect_right(los, a) - 1
    return segments[i] if i >= 0 and segments[i].lo <= a and segments[i].hi >= b else None


def _x(points: List[int], xs: List[float], value: int) -> float:
    value = max(points[0], min(points[-1], value))
    i = min(max(bisect.bisect_right(points, value) - 1, 0), len(points) - 2)
    span = points[i + 1] - points[i]
    return xs[i] + (xs[i + 1] - xs[i]) * ((value - points[i]) / span if span else 0)


def _lanes(marks: List[Mark]) -> List[int]:
    """A lane per mark so overlapping marks (a sizing violation and the guard overwrite it causes) stack."""
    ends: List[int] = []
    out = []
    for m in marks:
        lane = next((i for i, end in enumerate(ends) if end <= m.lo), len(ends))
        if lane == len(ends):
            ends.append(m.hi)
        else:
            ends[lane] = m.hi
        out.append(lane)
    return out


_NO_DATA = Markup("")


def _rect(x0, x1, y, h, fill, title, cls="", data=_NO_DATA, stroke="#555", dash: bool = False):
    """A rectangle with its tooltip; an outline (``fill`` none, ``dash``) is drawn thicker."""
    width, pattern = ("0.6", "") if fill != "none" else ("2", " stroke-dasharray='4 2'" if dash else "")
    return html("<g class='{}' {}><rect x='{:.1f}' y='{}' width='{:.1f}' height='{}' fill='{}' stroke='{}' "
                "stroke-width='{}'{}><title>{}</title></rect></g>", cls, data, x0, y, max(1.0, x1 - x0), h, fill,
                stroke, width, Markup(pattern), title)


def _text(x, y, text, size=10, anchor="middle", weight="normal", cls="label", fill="#222"):
    return html("<text class='{}' x='{:.1f}' y='{}' font-size='{}' text-anchor='{}' font-weight='{}' "
                "style='fill:{}'>{}</text>", cls, x, y, size, anchor, weight, fill, text)


def row_svg(bmap: BufferMap, row: MapRow) -> Markup:
    """One step row: zones, the oracle's program segments, and the kernel's band with the findings."""
    points, xs = _axis(row)
    left = 22  # room for the first tick's label (a negative element number in the front guard)
    X = lambda v: left + _x(points, xs, v)  # noqa: E731
    parts = []
    y_zone, y_seg, y_kernel = 16, 34, 62
    parts.append(_text(left, 11, f"{bmap.buffer} {row.name}: {row.caption}", 12, "start", "bold"))
    for lo, hi, zone in row.zones:
        title = f"{zone}: elements [{lo}, {hi})"
        words = f"{zone.split()[0]} ({hi - lo})" if zone in GUARD_ZONES else zone
        if zone == "guard" and hi - lo > MIN_GUARD:  # kvfence widens every row's guard by the case's overflow
            words = f"guard ({MIN_GUARD} + {hi - lo - MIN_GUARD} overflow)"
            title += f": {MIN_GUARD} elements plus {hi - lo - MIN_GUARD}, this case's overflow past a row"
        parts.append(_rect(X(lo), X(hi), y_zone, 14, ZONE_COLOURS[zone], title, "zone",
                           html("data-zone='{}' data-start='{}' data-stop='{}'", zone, lo, hi)))
        if X(hi) - X(lo) > 6 * len(words) and zone != "row":
            parts.append(_text((X(lo) + X(hi)) / 2, y_zone + 11, words, 9))
    labelled = len(row.segments) <= MAX_LABELLED_SEGMENTS
    for i, sp in enumerate(row.segments):
        x0, x1 = X(sp.lo), X(sp.hi)
        parts.append(_rect(x0, x1, y_seg, 22, SEGMENT_COLOURS[i % 2], sp.title, "segment",
                           html("data-program='{}' data-start='{}' data-stop='{}'", sp.label.strip("()"), sp.lo,
                                sp.hi)))
        if labelled and x1 - x0 >= 7 * len(sp.label):
            parts.append(_text((x0 + x1) / 2, y_seg + 15, sp.label, 10))
    # Who wrote the bad elements, and whose expected elements they hit: a writer's segment is outlined in
    # red, a victim's (an expected owner of a bad element that wrote none of them) dashed.
    writers = {w for m in row.marks for w in m.writers}
    owners = {p for m in row.marks for p in m.programs}
    for sp in row.segments:
        program = _program_of(sp.label)
        role = "writer" if program in writers else "victim" if program in owners else None
        if role is not None:
            parts.append(_rect(X(sp.lo), X(sp.hi), y_seg, 22, "none",
                               f"{sp.label} " + ("wrote bad elements" if role == "writer" else
                                                 "expected owner of bad elements it did not write"), role,
                               html("data-role='{}' data-program='{}'", role, sp.label.strip("()")),
                               stroke=ROLE_STROKES[role], dash=role == "victim"))
    # The kernel's band: inside the row it wrote what the oracle expects, except where a finding says; past
    # the row's end nothing is verified as written (that is the overflow), only the findings are drawn.
    for sp in row.segments:
        if sp.lo < row.width:
            parts.append(_rect(X(sp.lo), X(min(sp.hi, row.width)), y_kernel, 16, WROTE_OK,
                               f"written as expected: {sp.title}", "wrote", stroke="#7fbf7b"))
    lanes = _lanes(row.marks)
    for m, lane in zip(row.marks, lanes):
        x0, x1, y = X(m.lo), X(m.hi), y_kernel + lane * 20
        colour = KIND_COLOURS.get(m.kind, OTHER_COLOUR)
        parts.append(_rect(x0, x1, y, 16, colour, m.title, "mark",
                           html("data-kind='{}' data-number='{}' data-start='{}' data-stop='{}'", m.kind, m.number,
                                m.lo, m.hi), stroke="#000"))
        parts.append(_text((x0 + x1) / 2, y + 12, m.label, 10, weight="bold",
                           fill="#fff" if m.kind in DARK_KINDS else "#000"))
    # Element numbers under every breakpoint with room for them.
    y_ticks = y_kernel + max(1, len(set(lanes)) if lanes else 1) * 20 + 10
    last = -1e9
    for p in points:
        x = X(p)
        if x - last >= 26:
            parts.append(html("<line x1='{:.1f}' x2='{:.1f}' y1='{}' y2='{}' stroke='#888' stroke-width='0.5'/>",
                              x, x, y_zone, y_ticks - 9))
            parts.append(_text(x, y_ticks, p, 9, cls="tick"))
            last = x
    right = left + xs[-1] + 8
    parts.append(_text(right, y_seg + 15, "oracle: programs (s,b,k)", 10, "start", cls="band"))
    parts.append(_text(right, y_kernel + 12, "kernel: what it wrote", 10, "start", cls="band"))
    height = y_ticks + 6
    width = right + 170
    return html("<svg xmlns='http://www.w3.org/2000/svg' class='row-map' width='{:.0f}' height='{}' "
                "data-buffer='{}' data-row='{}' role='img'><title>{} {}</title>{}</svg>", width, height,
                bmap.buffer, row.name, bmap.buffer, row.name, join(parts))


#: Outlines of a program's segment: it wrote bad elements (writer), or owns bad elements it did not write.
ROLE_STROKES = {"writer": "#d7191c", "victim": "#555"}


def _program_of(label: str) -> Optional[Tuple[int, ...]]:
    """``(s, b, k)`` of a segment label ``(s,b,k)``; None for a grouped one (``(s,b,0..3)``)."""
    try:
        return tuple(int(x) for x in label.strip("()").split(","))
    except ValueError:
        return None


def legend() -> Markup:
    """What the colours mean (the same for every case)."""
    items = [("program segment the oracle expects (s, b, k)", SEGMENT_COLOURS[0]),
             ("kernel wrote the expected values", WROTE_OK)]
    items += [(f"outline: {text}", colour) for text, colour in
              (("a program that wrote bad elements", ROLE_STROKES["writer"]),
               ("dashed: an expected owner of bad elements it did not write", ROLE_STROKES["victim"]))]
    items += [(kind.replace("_", " ").lower(), colour) for kind, colour in KIND_COLOURS.items() if kind != "OOB_WRITE"]
    items += [("guard / never written", ZONE_COLOURS["guard"]), ("slack after U(s)", ZONE_COLOURS["slack"]),
              ("the next row (production layout: no guard between rows)", ZONE_COLOURS["next row"])]
    return html("<p class='legend'>{}</p>", join(
        html("<span><i style='background:{}'></i>{}</span>", colour, text) for text, colour in items))


def case_map_with_legend(record: dict, findings: List[dict]) -> Markup:
    """The draft kernel's ``case_map`` (``kvfence.contracts.draft.record``): what the colours mean, then the map."""
    return join([legend(), case_map_html(record, findings)])


def case_map_html(record: dict, findings: List[dict]) -> Markup:
    """The map of one case file as HTML (one SVG per step row), with each finding listed by its number."""
    from kvfence.errors import BadInput

    try:
        maps = case_maps(record, findings)
    except (BadInput, KeyError, TypeError, ValueError) as exc:
        return html("<p class='bad'>No buffer map: the case record is not a valid case ({}).</p>", exc)
    parts: List[str] = []
    listed: Dict[Any, Any] = {}
    for bmap in maps:
        for row in bmap.rows:
            parts.append(row_svg(bmap, row))
            for m in row.marks:
                listed.setdefault(m.number, m)
    notes = [html("<li><b style='color:{}'>[{}]</b> {}</li>", KIND_COLOURS.get(m.kind, OTHER_COLOUR), n, m.title)
             for n, m in sorted(listed.items())]
    off_map = [f for f in findings if f.get("case") == record.get("path")
               and not any(m.title == _finding_text(f) for m in listed.values())]
    notes += [html("<li>not on the map (no element range in these buffers): {}</li>", _finding_text(f))
              for f in off_map]
    return html("<div class='buffer-map' data-case='{}'>{}<ol class='marks'>{}</ol></div>", record.get("path"),
                join(parts), join(notes))

