"""A command about a contract that is not kvfence's own runs in a child process: the contract's code cannot end
the command, pass it, or hide its results.

A plug-in contract's methods are its author's code (docs/security.md). Its draws, oracle, sizings and keys run
in the process that fuzzes, replays or renders; one that calls ``os._exit(0)``, raises ``SystemExit(0)``, aborts
or hangs would end that process, and an exit status of 0 would read as a clean run. So ``run_in_child`` runs
the same command line in a child (``python -m kvfence ...``, every registration of this process passed on:
``registry.child_env``) that reports its exit status through a file when, and only when, the command returned
(``report_status``). The parent trusts only that file: a child that ended without it is one line naming the
contract, exit 2 (``EXIT_BAD_INPUT``: the contract is broken), never the child's own status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List, Optional

from kvfence.errors import EXIT_BAD_INPUT

#: Set in the child: the file it reports its exit status to (``report_status``).
STATUS_ENV = "KVFENCE_CHILD_STATUS"


_STATUS: List[str] = []


def take_status_path() -> bool:
    """In the child: take the status file's path out of the environment (the processes it starts, a ``--jobs``
    child or a checking worker, must not report in its place); whether this process is such a child."""
    path = os.environ.pop(STATUS_ENV, None)
    if path:
        _STATUS[:] = [path]
    return bool(_STATUS)


def report_status(code: int) -> None:
    """The child's exit status, written once the command has returned (atomically: all or nothing)."""
    if not _STATUS:
        return
    path = _STATUS[0]
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"exit": int(code)}, fh)
    os.replace(tmp, path)


def run_in_child(argv: List[str], contracts: List[str], warn) -> int:
    """``python -m kvfence ARGV`` in a child for ``contracts`` (plug-ins): its exit status as it reported it, or
    ``EXIT_BAD_INPUT`` with one line when it ended without reporting one. Ctrl-C reaches the child as it
    reaches this process (one process group); SIGTERM is passed on."""
    from kvfence.engine import registry
    from kvfence.engine.workers import signal_name

    with tempfile.TemporaryDirectory(prefix="kvfence-child-") as tmp:
        status = Path(tmp) / "status.json"
        env = dict(os.environ, **registry.child_env(), **{STATUS_ENV: str(status)})
        proc = subprocess.Popen([sys.executable, "-m", "kvfence", *argv], env=env)
        previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
        try:
            while True:
                try:
                    returncode = proc.wait()
                    break
                except KeyboardInterrupt:  # the child got the same Ctrl-C: wait for it to write what it has
                    continue
        finally:
            signal.signal(signal.SIGTERM, previous)
        answer = _read(status)
    if answer is not None:
        return answer
    names = ", ".join(contracts)
    how = f"died of {signal_name(returncode)}" if returncode < 0 else f"ended with exit status {returncode}"
    warn(f"kvfence: error: the command's process {how} before the command returned: the code of contract "
         f"{names} (a plug-in) ends its process; nothing it printed counts as a verdict")
    return EXIT_BAD_INPUT


def _read(path: Path) -> Optional[int]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    code = doc.get("exit") if isinstance(doc, dict) else None
    return code if type(code) is int else None
