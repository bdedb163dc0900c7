"""The one escaping rule of kvfence's HTML pages (report.html, sweep.html, the release matrix).

Every page is built from ``Markup`` fragments: ``html(template, *values)`` formats ``values`` into a
trusted template and escapes each of them, whatever its type (str, int, None, a list, an exception);
only a value that is already ``Markup`` (a fragment built the same way) goes in as it is. A summary,
case file or sweep.json is data a run wrote, so a value there can hold ``<script>``: it is always text.
"""

from __future__ import annotations

from typing import Iterable

from markupsafe import Markup, escape

__all__ = ["Markup", "escape", "html", "join", "table"]


def html(template: str, *values, **named) -> Markup:
    """``template`` (markup written here, never data) with every value escaped into it."""
    return Markup(template).format(*values, **named)


def join(parts: Iterable, sep: str = "") -> Markup:
    """Fragments (escaped unless already ``Markup``) joined by the markup ``sep``."""
    return Markup(sep).join(escape(p) for p in parts)


def table(rows, header, cell_style=None) -> Markup:
    """A ``<table>`` of ``header`` and ``rows``; every cell escaped. ``cell_style(value)`` may give a cell
    its inline CSS (a colour by status)."""
    head = join(html("<th>{}</th>", h) for h in header)
    body = join(html("<tr>{}</tr>", join(html("<td style='{}'>{}</td>", cell_style(x), x) if cell_style
                                        else html("<td>{}</td>", x) for x in r)) for r in rows)
    return html("<table><tr>{}</tr>{}</table>", head, body)
