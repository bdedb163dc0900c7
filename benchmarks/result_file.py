"""A benchmark's result dictionary, rewritten to its ``--json`` file after every stage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional


def saver(path: Optional[str], result: dict) -> Callable[[], None]:
    """``save()`` writes ``result`` to ``path`` (nothing when ``path`` is None), so a time limit or a failure
    keeps what was measured so far."""

    def save() -> None:
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(result, indent=1) + "\n")

    return save
