"""The ``--out`` folder of a fuzz run shows only that run.

Case files from an earlier run in the same folder would sit beside a ``report.md`` that does not list
them (and may contradict them: a clean report beside a failing case). Before a run writes anything, its
``cases/*.json`` are moved to ``cases/earlier/<time>/``, where the report names them as earlier. Moving,
not deleting: a case file is the only copy of a shrunk failure. ``sweep --cases DIR`` and the other
readers of case files look at ``DIR/*.json`` only, so the moved files stay out of their way.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from kvfence.cases.casefile import CASES_DIR
from kvfence.errors import require
from kvfence.running.journal import JOURNAL_DIR

EARLIER_DIR = "earlier"


def set_aside_earlier_cases(out_dir, now: Optional[float] = None) -> Optional[dict]:
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
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    dest, n = cases / EARLIER_DIR / stamp, 1
    while dest.exists():  # two runs within one second
        dest, n = cases / EARLIER_DIR / f"{stamp}-{n}", n + 1
    dest.mkdir(parents=True)
    for f in files:
        f.replace(dest / f.name)  # same filesystem: a rename, never a half-copied file
    return {"folder": str(dest), "count": len(files)}
