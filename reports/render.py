"""Render a fuzz summary (``harness/engine/summary.py``) as ``report.md`` and a self-contained ``report.html``.

The coverage plot needs matplotlib, which is optional: it is imported here, lazily, and when it is
missing (or fails) both reports say the plot was skipped and why. Nothing else in kvfence imports it.
"""

from __future__ import annotations

import base64
import io
import random
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from kvfence.engine.findings import program_text
from kvfence.engine.summary import coverage_fields
from kvfence.reports.markup import Markup, file_link, html, join, table
from kvfence.reports.text import earlier_text, finding_rows, run_rows

PLOT_NAME = "coverage.png"


def panel_field(doc: dict) -> str:
    """The coverage field whose values the plot's panels split on: the contract's first (draft: topk)."""
    return coverage_fields(doc)[0]


def _rows_by_panel(doc: dict) -> Dict[int, List[dict]]:
    fields, panel = coverage_fields(doc), panel_field(doc)
    out: Dict[int, List[dict]] = {}
    for row in doc.get("coverage", {}).get("examples", []):
        r = dict(zip(fields, row))
        out.setdefault(r[panel], []).append(r)
    return out


def case_panel(doc: dict, c: dict):
    """The panel a case file's case sits in: its own coverage row (a summary before those: its config's)."""
    fields, panel = coverage_fields(doc), panel_field(doc)
    if isinstance(c.get("coverage"), list) and len(c["coverage"]) == len(fields):
        return dict(zip(fields, c["coverage"]))[panel]
    return (c.get("config") or {}).get(panel, 0)


def panel_counts(doc: dict) -> Dict[int, dict]:
    """Per panel value, what its panel holds: explored examples, of them failed, and case files (always
    failing). The case files' cases are shrunk failures, not explored examples, but they are drawn in the
    panel and counted in its title, so a panel never shows a point its title says is not there.
    """
    out: Dict[int, dict] = {}
    for value, rows in _rows_by_panel(doc).items():
        out[value] = {"explored": len(rows), "failed": sum(1 for r in rows if r["failed"]), "case_files": 0}
    for c in doc.get("cases", {}).values():
        counts = out.setdefault(case_panel(doc, c), {"explored": 0, "failed": 0, "case_files": 0})
        counts["case_files"] += 1
    return dict(sorted(out.items()))


def panel_title(value: int, counts: dict, field: str = "topk") -> str:
    """``topk=2: 3 examples (1 case file), 2 failed``: every point of the panel is counted."""
    total = counts["explored"] + counts["case_files"]
    failed = counts["failed"] + counts["case_files"]
    files = counts["case_files"]
    of_which = f" ({files} case file{'s' if files != 1 else ''})" if files else ""
    return f"{field}={value}: {total} example{'s' if total != 1 else ''}{of_which}, {failed} failed"


def case_text(c: dict) -> str:
    """One line describing a case file's case: its contract's words (a summary before those: the draft
    kernel's config and lengths)."""
    if isinstance(c.get("describe"), str):
        return c["describe"]
    cfg, b = c["config"], c.get("batch") or {}
    return (f"topk={cfg['topk']} num_steps={cfg['num_steps']} page_size={cfg['page_size']} ctx={cfg['ctx']} "
            f"max_bs={cfg['max_bs']} sizing={cfg['sizing']} mode={cfg['mode']} layout={cfg['layout']}; "
            f"seq_lens={b.get('seq_lens')}")


def case_map(c: dict, findings: list) -> Markup:
    """A case file's buffer map: its contract's own drawing (``Contract.report``) or the engine's table map; a
    contract this process does not know, or whose drawing fails, gets a line saying so (the report is written
    whatever a contract's code does)."""
    from kvfence.engine import registry
    from kvfence.engine.casefile import legacy_contract
    from kvfence.errors import BadInput
    from kvfence.reports.table_map import case_map_html

    try:
        record = registry.get(c.get("contract") or legacy_contract(c))
        drawn = record.report(c, findings)
    except (BadInput, KeyError, TypeError, ValueError) as exc:
        return html("<p class='note'>No buffer map: {}</p>", str(exc))
    except Exception as exc:  # noqa: BLE001 - a contract's own drawing that raises: named, the report goes on
        return html("<p class='note'>No buffer map: the contract's drawing raised {}: {}</p>",
                    type(exc).__name__, str(exc))
    return Markup(drawn) if drawn else case_map_html(c, findings)


def _ratio(row: dict) -> float:
    """need / width of a coverage point; a zero-width row that needs something plots at 2 (past the wall)."""
    return row["need"] / row["width"] if row["width"] else (2.0 if row["need"] else 0.0)


def coverage_png(doc: dict) -> Tuple[Optional[bytes], str]:
    """The coverage plot as PNG bytes, or ``(None, why it was skipped)``.

    One panel per topk: launched requests (x, jittered) against buffer utilisation need/width (y) of
    every explored example; the line at 1 is where the buffer overflows. Failing examples are red
    crosses, the case files' cases red stars.
    """
    by_topk = _rows_by_panel(doc)
    field = panel_field(doc)
    cases = list(doc.get("cases", {}).values())
    if not by_topk and not cases:
        return None, "no examples were recorded"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # ImportError, or a broken install
        return None, f"matplotlib is not available ({type(exc).__name__}: {exc}); pip install matplotlib"
    counts = panel_counts(doc)
    topks = list(counts)
    cols = min(4, len(topks))
    nrows = (len(topks) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(3.4 * cols, 2.9 * nrows), squeeze=False, sharey=True)
    jitter = random.Random(0)
    xmax = max([r["num_seqs"] for rows in by_topk.values() for r in rows] + [c["num_seqs"] for c in cases])
    xticks = list(range(1, xmax + 1, max(1, xmax // 8)))
    for ax in axes.flat[len(topks):]:
        ax.set_visible(False)
    for ax, topk in zip(axes.flat, topks):
        rows = by_topk.get(topk, [])
        ok = [r for r in rows if not r["failed"]]
        bad = [r for r in rows if r["failed"]]
        for group, style in ((ok, dict(s=9, c="#3a6ea5", alpha=0.35, marker="o", label="explored")),
                             (bad, dict(s=40, c="#d62728", marker="x", label="failed"))):
            if group:
                ax.scatter([r["num_seqs"] + jitter.uniform(-0.18, 0.18) for r in group],
                           [_ratio(r) for r in group], linewidths=1, **style)
        mine = [c for c in cases if case_panel(doc, c) == topk]
        if mine:
            ax.scatter([c["num_seqs"] for c in mine], [_ratio(c) for c in mine], s=150, c="#d62728",
                       marker="*", edgecolors="black", linewidths=0.6, zorder=5, label="case file")
        ax.axhline(1.0, color="#d62728", linestyle="--", linewidth=0.9)
        ax.set_xlim(0.5, xmax + 0.5)
        ax.set_xticks(xticks)
        ax.set_title(panel_title(topk, counts[topk], field), fontsize=9)
        ax.set_xlabel("launched requests (num_seqs)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25)
    for ax in axes[:, 0]:
        ax.set_ylabel("need / width", fontsize=8)
    handles: Dict[str, Any] = {}  # legend label -> its artist
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    if handles:
        # Below the panels: a one- or two-panel figure is too narrow for title and legend on one line.
        fig.legend(list(handles.values()), list(handles), loc="lower center", fontsize=8, ncol=len(handles))
    files = f" + {len(cases)} case file{'s' if len(cases) != 1 else ''}" if cases else ""
    fig.suptitle(f"kvfence coverage: {doc['examples']} explored examples{files}, sizing {doc.get('sizing', '?')} "
                 "(dashed: need = width)", fontsize=10, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.08 if handles else 0, 1, 0.93))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue(), ""


MERGED_HEADER = ["run folder", "host", "shard", "device", "seed", "examples", "elapsed s", "findings", "cases"]


def merged_rows(doc: dict) -> List[List[str]]:
    """One row per run of a merged report (``reports/merge.py``); empty for a single run."""
    return [[str(r.get(k)) for k in ("dir", "host", "shard", "device", "seed", "examples", "elapsed_s", "findings",
                                     "cases")] for r in (doc.get("merged") or {}).get("runs", [])]


#: The columns of a campaign's shards (``kvfence campaign``: ``kvfence.campaign.outcome``), one row per shard.
SHARD_HEADER = ["shard", "target", "host", "GPU", "seed block", "status", "attempts", "examples", "findings", "wall s",
                "note"]


def shard_rows(doc: dict) -> List[List[str]]:
    """One row per shard of a campaign, those that wrote no summary included (lost, timed out); empty otherwise."""
    keys = ("shard", "label", "host", "gpu", "seed_block", "status", "attempts", "examples", "findings", "wall_s",
            "note")
    return [["-" if r.get(k) in (None, "") else str(r.get(k)) for k in keys] for r in doc.get("shards") or []]


def _sampled_note(doc: dict) -> str:
    cov = doc.get("coverage", {})
    notes = []
    if cov.get("sampled"):
        notes.append(f"(plot shows a uniform sample of {len(cov.get('examples', []))} of "
                     f"{doc.get('generated_cases', doc['examples'])} generated cases)")
    if cov.get("left_out_runs"):
        notes.append(f"(the rows of {cov['left_out_runs']} merged run(s) of a contract with other coverage "
                     "fields are not plotted)")
    return " ".join(notes)


def markdown(doc: dict, plot_note: str) -> str:
    def md_table(rows, header):
        esc = lambda x: str(x).replace("|", "\\|")  # noqa: E731
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(esc(x) for x in r) + " |" for r in rows])

    status = "FINDINGS" if doc["findings"] else "clean"
    out = [f"# kvfence fuzz report: {status}", ""]
    if earlier_text(doc):
        out += [earlier_text(doc), ""]
    if doc["findings"]:
        out += ["## Findings", "", md_table(finding_table(doc, lambda path: path), finding_header(doc)), ""]
        out += ["## Case files", ""]
        for c in doc.get("cases", {}).values():
            out += [f"- `{c['path']}` ({', '.join(c['kinds'])}; from {c['source']}): {case_text(c)}; "
                    f"need {c['need']} vs width {c['width']}", f"  - repro: `{c['repro']}`"]
        out.append("")
    if doc.get("shrink_cut"):
        out += ["Shrinking hit its time budget: the case may not be minimal.", ""]
    out += ["## Run", "", md_table(run_rows(doc), ["run", "value"]), ""]
    if merged_rows(doc):
        out += [f"## Merged runs ({doc['merged'].get('duplicate_cases', 0)} duplicate case(s) kept once)", "",
                md_table(merged_rows(doc), MERGED_HEADER), ""]
    if shard_rows(doc):
        out += ["## Shards", "", md_table(shard_rows(doc), SHARD_HEADER), ""]
    out += ["## Coverage", ""]
    out += [f"![coverage]({PLOT_NAME})" if not plot_note else f"Plot skipped: {plot_note}.", ""]
    if _sampled_note(doc):
        out += [_sampled_note(doc), ""]
    out += [f"Each point is one explored example: launched requests against need/width of its buffer, "
            f"one panel per {panel_field(doc)}. Above the dashed line the buffer is too small.", ""]
    return "\n".join(out)


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.6em 0 1.2em}td,th{border:1px solid #ccc;padding:3px 9px;text-align:left;
font-size:14px;vertical-align:top}th{background:#f3f3f3}code{background:#f5f5f5;padding:1px 4px}.bad{color:#b00020}
.ok{color:#1b7f3b}img{max-width:100%;border:1px solid #ddd}.note{color:#666;font-size:13px}
.buffer-map{overflow-x:auto;border:1px solid #ddd;padding:6px;margin:0.5em 0 1.5em}.row-map{display:block}
.row-map text{font-family:ui-monospace,monospace}.marks{font-size:13px;font-family:ui-monospace,monospace}
.legend span{display:inline-block;margin-right:1em;font-size:13px}.legend i{display:inline-block;width:12px;
height:12px;border:1px solid #555;margin-right:4px;vertical-align:-1px}"""


def _samples_text(f: dict) -> str:
    """``@off expected E, found F`` for the first few samples of a finding (region-relative offsets)."""
    return "; ".join(f"@{off}: expected {exp}, found {got}" for off, exp, got in f.get("samples", [])[:3]) or "-"


def _programs_text(f: dict, key: str = "programs") -> str:
    progs = [program_text(p, f.get("owner_names", ())) for p in f.get(key, [])]
    return ", ".join(progs[:6]) + (f" +{len(progs) - 6}" if len(progs) > 6 else "") or "-"


#: The findings table's columns (a program is its grid coordinates, as its contract's ``owner`` gives them).
FINDING_HEADER = ["kind", "where", "elements", "expected / found", "expected owners (programs)",
                  "written by (programs)", "case file"]


def finding_header(doc: dict) -> List[str]:
    """The findings table's columns."""
    return list(FINDING_HEADER)


def finding_table(doc: dict, case_cell) -> list:
    """The findings table of both reports: the terminal's columns (``finding_rows``) with the samples and
    programs added; ``case_cell(path)`` renders the case file (a link in HTML)."""
    return [row[:3] + [_samples_text(f), _programs_text(f), _programs_text(f, "writers"), case_cell(f["case"])]
            for row, f in zip(finding_rows(doc), doc["findings"])]


def _case_link(path: str, out_dir: Optional[Path]) -> Markup:
    """A link to a case file, relative to the report's folder (``kvfence.reports.markup.file_link``)."""
    return file_link(path, out_dir)


def html_report(doc: dict, png: Optional[bytes], plot_note: str, out_dir: Optional[Path] = None) -> str:
    """report.html: the verdict, the findings with samples and programs, each case file's buffer map and
    repro line, then the run's statistics and the coverage plot. Every value goes through
    ``kvfence.reports.markup`` (escaped whatever its type)."""
    status = (html('<span class="bad">{} finding{}</span>', len(doc["findings"]),
                   "" if len(doc["findings"]) == 1 else "s") if doc["findings"]
              else Markup('<span class="ok">clean</span>'))
    parts = [html("<!DOCTYPE html><html><head><meta charset='utf-8'><title>kvfence fuzz report</title>"
                  "<style>{}</style></head><body>", Markup(_CSS)), html("<h1>kvfence fuzz report: {}</h1>", status)]
    if earlier_text(doc):
        parts.append(html("<p class='note'>{}</p>", earlier_text(doc)))
    if doc["findings"]:
        rows = finding_table(doc, lambda path: _case_link(path, out_dir))
        parts += [Markup("<h2>Findings</h2>"), table(rows, finding_header(doc))]
        if doc.get("shrink_cut"):
            parts.append(Markup("<p class='note'>Shrinking hit its time budget: the case may not be minimal.</p>"))
        parts += [Markup("<h2>Case files</h2>")]
        for c in doc.get("cases", {}).values():
            parts.append(html("<h3>{}</h3><p>{} (from {}): {}; need {} vs width {}<br>repro: <code>{}</code></p>",
                              _case_link(c["path"], out_dir), ", ".join(c["kinds"]), c["source"], case_text(c),
                              c["need"], c["width"], c["repro"]))
            parts.append(case_map(c, doc["findings"]))
    parts += [Markup("<h2>Run</h2>"), table(run_rows(doc), ["run", "value"])]
    if merged_rows(doc):
        parts += [html("<h2>Merged runs ({} duplicate case(s) kept once)</h2>",
                       doc["merged"].get("duplicate_cases", 0)),
                  table(merged_rows(doc), MERGED_HEADER)]
    if shard_rows(doc):
        parts += [Markup("<h2>Shards</h2>"), table(shard_rows(doc), SHARD_HEADER)]
    parts.append(Markup("<h2>Coverage</h2>"))
    if png is not None:
        parts.append(html("<img alt='coverage plot' src='data:image/png;base64,{}'>", base64.b64encode(png).decode()))
    else:
        parts.append(html("<p class='bad'>Plot skipped: {}.</p>", plot_note))
    parts.append(html("<p class='note'>Each point is one explored example: launched requests against need/width of "
                      "its buffer, one panel per {}. Above the dashed line the buffer is too small. {}</p>",
                      panel_field(doc), _sampled_note(doc)))
    versions = doc.get("versions") or {}
    if versions:
        parts.append(html("<p class='note'>{}</p>", ", ".join(f"{k} {v}" for k, v in versions.items())))
    parts.append(Markup("</body></html>"))
    return str(join(parts, "\n"))


def shown_as_text(value):
    """``value`` (a summary) with every string, keys included, made safe to show: control characters
    (terminal escapes, NULs, newlines) as ``\\x1b``-style text (``kvfence.errors.printable``). A summary
    is data a file holds (``report DIR`` reads any folder's), so the reports show what it says, never
    what a terminal or a markdown viewer would do with it."""
    from kvfence.errors import printable

    if isinstance(value, str):
        return value if value.isprintable() else printable(value, None)
    if isinstance(value, dict):
        return {shown_as_text(k): shown_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shown_as_text(v) for v in value]
    if isinstance(value, tuple):
        return tuple(shown_as_text(v) for v in value)
    return value


def write_reports(doc: dict, out_dir) -> dict:
    """Write ``report.md``, ``report.html`` (and ``coverage.png`` for the markdown) into ``out_dir``.

    Returns ``{"md": path, "html": path, "png": path or None, "plot_skipped": reason or ""}``.
    """
    from kvfence.engine.casefile import atomic_write_text

    out = Path(out_dir)
    doc = shown_as_text(doc)
    png, why = coverage_png(doc)
    png_path = None
    if png is None and (out / PLOT_NAME).exists():
        (out / PLOT_NAME).unlink()  # an earlier run's plot must not pass for this run's
    if png is not None:
        png_path = out / PLOT_NAME
        tmp = out / f".{PLOT_NAME}.tmp"
        tmp.write_bytes(png)
        tmp.replace(png_path)
    md_path, html_path = out / "report.md", out / "report.html"
    atomic_write_text(md_path, markdown(doc, why))
    atomic_write_text(html_path, html_report(doc, png, why, out))
    return {"md": md_path, "html": html_path, "png": png_path, "plot_skipped": why}
