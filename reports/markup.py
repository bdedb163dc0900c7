"""The one escaping rule of kvfence's HTML pages (report.html, sweep.html, the release matrix).

Every page is built from ``Markup`` fragments: ``html(template, *values)`` formats ``values`` into a
trusted template and escapes each of them, whatever its type (str, int, None, a list, an exception);
only a value that is already ``Markup`` (a fragment built the same way) goes in as it is. A summary,
case file or sweep.json is data a run wrote, so a value there can hold ``<script>``: it is always text.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional
from urllib.parse import quote

from markupsafe import Markup, escape

__all__ = ["Markup", "escape", "html", "join", "table", "file_href", "file_link"]


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


def file_href(path, base) -> Optional[str]:
    """A link target for the file ``path`` from a page in the folder ``base``: a relative path, each segment
    percent-encoded (so no segment reads as a scheme such as ``javascript:``), starting ``./`` or ``../``;
    ``None`` when the file is not below ``base``'s root drive (no absolute or other-scheme link is made)."""
    try:
        rel = os.path.relpath(Path(path).resolve(), Path(base).resolve())
    except (ValueError, OSError, TypeError):
        return None
    parts = Path(rel).as_posix().split("/")
    if any(p in ("", ".") for p in parts) or os.path.isabs(rel):
        return None
    href = "/".join(quote(p, safe="") for p in parts)
    return href if href.startswith("..") else "./" + href


def file_link(path, base, text=None) -> Markup:
    """``<a href>`` to ``path`` (``file_href``), or the escaped text alone when no relative link exists."""
    href = None if base is None else file_href(path, base)
    label = path if text is None else text
    return html("<a href='{}'>{}</a>", href, label) if href else html("{}", label)
