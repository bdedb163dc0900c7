"""A benchmark's result dictionary, rewritten to its ``--json`` file after every stage."""

from __future__ import annotations

import json
from pathlib import Path

from kvfence.provenance import stamped
from typing import Callable, Optional


def saver(path: Optional[str], result: dict) -> Callable[[], None]:
    """``save()`` writes ``result`` to ``path`` (nothing when ``path`` is None), so a time limit or a failure
    keeps what was measured so far."""

    def save() -> None:
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(stamped(result), indent=1) + "\n")

    return save


def fuzz_command_parser(doc: str, argv):
    """``(parser, own argv, fuzz flags)`` of a benchmark that runs ``kvfence fuzz``: flags after ``--`` go to
    every fuzz command; the parser (described by ``doc``'s first line) has ``--device`` and ``--json``."""
    import argparse

    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--json", default=None)
    return parser, argv[:cut], argv[cut + 1:]
