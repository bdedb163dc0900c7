"""What a plug-in's import leaves behind, run out in the throwaway process that imports it first.

kvfence imports a plug-in (a kernel, a sizing, a contract) in a throwaway process before it imports it in
its own (``kvfence.engine.probe``, ``kvfence.contract``): an import that exits, aborts or raises
``KeyboardInterrupt`` ends only that process. But an import can also leave something to run later, in
whichever process imported it: a thread that calls ``os._exit(0)`` a second later, or an exit handler
(``atexit``) that does. In the user's pytest session either would end the session with exit 0 and no
output. ``settle`` runs those out in the probe: each thread the import started gets ``THREAD_SETTLE_S`` to
finish, then the exit handlers run. One that ends the process ends the probe, before it reports, which the
parent names in one line; a thread still running after that is refused (kvfence cannot tell what it will do
in the process that imports the plug-in next).

``python -m kvfence.engine.import_probe MODULE REPORT [PATH ...]`` imports ``MODULE`` (``PATH``s first on the
import path), settles, and writes ``ok`` or ``error TYPE: MESSAGE`` to ``REPORT`` (a contract's probe).
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Any, List, Optional

#: Seconds the threads an import started get to finish in the probe.
THREAD_SETTLE_S = 3.0


def threads_now() -> set[Any]:
    return set(threading.enumerate())


def settle(before: set[Any]) -> Optional[str]:
    """Run out what an import left to run later (the module docstring); a problem (one line) or None."""
    started = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    deadline = time.monotonic() + THREAD_SETTLE_S
    for thread in started:
        thread.join(max(0.0, deadline - time.monotonic()))
    running = [t.name for t in started if t.is_alive()]
    if running:
        return (f"its import left thread(s) running after {THREAD_SETTLE_S:g}s ({', '.join(running)[:200]}); "
                "a plug-in's import must not leave threads behind (they would run in kvfence's process)")
    atexit._run_exitfuncs()  # noqa: SLF001 - its exit handlers, here, where ending the process is harmless
    return None


def _main(argv: List[str]) -> None:
    import importlib
    import os
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the parent, which decides
    module_name, report = argv[0], argv[1]
    sys.path[:0] = [p for p in argv[2:] if p not in sys.path]
    before = threads_now()
    try:
        importlib.import_module(module_name)
        problem = settle(before)
        answer = "ok" if problem is None else f"error {problem}"
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt, SystemExit, anything: reported
        answer = f"error {type(exc).__name__}: {exc}" if str(exc) else f"error {type(exc).__name__}"
    with open(report, "w") as fh:
        fh.write(answer)
    os._exit(0)  # no interpreter shutdown: the handlers ran above, or the import failed


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])
