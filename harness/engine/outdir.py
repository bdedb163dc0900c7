"""The ``--out`` folder of a fuzz run shows only that run.

Case files from an earlier run in the same folder would sit beside a ``report.md`` that does not list
them (and may contradict them: a clean report beside a failing case). Before a run writes anything, its
``cases/*.json`` are moved to ``cases/earlier/<time>/``, where the report names them as earlier. Moving,
not deleting: a case file is the only copy of a shrunk failure. ``sweep --cases DIR`` and the other
readers of case files look at ``DIR/*.json`` only, so the moved files stay out of their way.

``upstream matrix`` does the same for its whole report (``set_aside_earlier_report``): a second run into one
folder must not mix its cells with the first run's per-release folders.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Union

from kvfence.engine.casefile import CASES_DIR
from kvfence.engine.journal import JOURNAL_DIR
from kvfence.errors import BadInput, require

EARLIER_DIR = "earlier"
#: What ``upstream matrix`` writes into its ``--out``: the reports, and one folder per release
#: (``0.5.23/...``). Only these move: an ``--out`` may be a folder that holds other things too.
MATRIX_FILES = ("report.md", "report.html", "matrix.json", "shipped.json")
RELEASE_DIR = re.compile(r"^\d+\.\d+[A-Za-z0-9.+\-]*$")


def _stamped(parent: Path, now: Optional[float]) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    dest, n = parent / stamp, 1
    while dest.exists():  # two runs within one second
        dest, n = parent / f"{stamp}-{n}", n + 1
    return dest


def set_aside_earlier_cases(out_dir: Union[str, Path], now: Optional[float] = None) -> Optional[dict[str, Any]]:
    """Move ``out_dir/cases/*.json`` to ``out_dir/cases/earlier/<YYYYmmdd-HHMMSS>/``.

    Returns ``{"folder": path, "count": n}`` for the summary, or ``None`` when there was nothing to move.
    """
    cases = Path(out_dir) / CASES_DIR
    # Checked before anything moves: the folders this run writes into must be folders.
    for folder in (cases, cases / EARLIER_DIR, Path(out_dir) / JOURNAL_DIR):
        require(not folder.exists() or folder.is_dir(),
                f"--out {out_dir}: {folder} exists and is not a directory: the run writes there; move it away")
    files = sorted(cases.glob("*.json")) if cases.is_dir() else []
    if not files:
        return None
    dest = _stamped(cases / EARLIER_DIR, now)
    dest.mkdir(parents=True)
    for f in files:
        f.replace(dest / f.name)  # same filesystem: a rename, never a half-copied file
    return {"folder": str(dest), "count": len(files)}


def moved_case(path: Union[str, Path]) -> Optional[Path]:
    """Where a later run into the same folder moved the case file ``path`` (``cases/earlier/<time>/<name>``, the
    first move: a case file's name is its content's hash), or None when ``path`` exists or was not moved."""
    path = Path(path)
    try:
        if path.exists() or not (path.parent / EARLIER_DIR).is_dir():
            return None
        found = sorted(p for p in (path.parent / EARLIER_DIR).glob(f"*/{path.name}") if p.is_file())
    except OSError:
        return None
    return found[0] if found else None


def set_aside_earlier_report(out_dir: Union[str, Path], now: Optional[float] = None) -> Optional[dict[str, Any]]:
    """Move an earlier ``upstream matrix`` run's reports and release folders (``MATRIX_FILES``,
    ``RELEASE_DIR``) from ``out_dir`` to ``out_dir/earlier/<YYYYmmdd-HHMMSS>/``; anything else stays.

    Returns ``{"folder": path, "count": n}`` (entries moved), or ``None`` when there was nothing to move.
    """
    out = Path(out_dir)
    if not out.is_dir():
        return None
    earlier = out / EARLIER_DIR
    require(not earlier.exists() or earlier.is_dir(),
            f"--out {out_dir}: {earlier} exists and is not a directory: earlier reports move there; move it away")
    entries = sorted(e for e in out.iterdir()
                     if (e.name in MATRIX_FILES and e.is_file()) or (e.is_dir() and RELEASE_DIR.match(e.name)))
    if not entries:
        return None
    dest = _stamped(earlier, now)
    dest.mkdir(parents=True)
    for e in entries:
        e.replace(dest / e.name)  # same filesystem: a rename
    return {"folder": str(dest), "count": len(entries)}


def probe_folder(folder: Path, what: str, path: Union[str, Path]) -> None:
    """Create and remove a temp file in ``folder`` (or its nearest existing parent, where the folder
    would be created): the only check that holds for root, read-only mounts and /proc alike."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=".kvfence-probe-", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise BadInput(f"{what} {path}: cannot write in {probe}: {exc.strerror or exc}") from None
