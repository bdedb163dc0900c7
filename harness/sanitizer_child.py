"""The process compute-sanitizer runs: ``python -m kvfence.sanitizer_child STATUS ARGS...``.

It runs ``python -m kvfence ARGS...`` (a ``repro`` of one case) in this process and writes the command's
own exit code to the file ``STATUS`` as JSON: ``{"exit": N}``, plus ``"error"`` when the command raised.
compute-sanitizer replaces the child's exit code by ``--error-exitcode`` when it reports errors, so without
this file the sweep could not tell "the case reproduced" (1) from "bad input" (2) or "the child raised"
(3) under a tool that also found something. A missing file means the child died before it could write it
(a signal, an abort in the CUDA driver, or it never started): ``kvfence.sanitizer.tool`` reports that.
"""

from __future__ import annotations

import json
import os
import sys

#: The child raised (e.g. a CUDA error after memcheck killed the context): not a verdict.
EXIT_RAISED = 3


def _write_status(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)  # a reader never sees half a file


def main(argv) -> int:
    if len(argv) < 2:
        print("usage: python -m kvfence.sanitizer_child STATUS COMMAND [ARGS...]", file=sys.stderr)
        return 2
    status, args = argv[0], argv[1:]
    from kvfence.cli import main as cli_main

    try:
        code = cli_main(args)
    except BaseException as exc:  # noqa: BLE001 - every way out is recorded, then reported by the parent
        message = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        _write_status(status, {"exit": EXIT_RAISED, "error": message})
        print(f"kvfence: child raised: {message}", file=sys.stderr, flush=True)
        return EXIT_RAISED
    _write_status(status, {"exit": int(code)})
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
