"""Plug-ins are imported in a throwaway process first, so their import cannot end kvfence's own.

A ``--kernel`` or ``--sizing`` plug-in (``module:attr`` or ``file.py:attr``) runs its module's top level
when it is imported. If that calls ``os._exit(0)``, kvfence would exit 0 with no output (a silent pass);
``os.abort()`` or a fatal signal would kill it with no message; a ``KeyboardInterrupt`` raised at import
would look like Ctrl-C. ``check_plugins`` imports each plug-in in a child process
(``python -m kvfence.engine.probe``) that reports back through a file; anything other than a report
(the child exited, died of a signal, or never answered) is one line and exit 2, before kvfence imports
the plug-in itself. A plug-in whose import is refused in the child (``BadInput``) gets the same message
there as here.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional, Union

from kvfence.contract import Contract
from kvfence.errors import BadInput

#: Seconds a plug-in's import may take in the probe (a kernel file compiles nothing at import).
PROBE_TIMEOUT_S = 120.0


def _exit_text(code: int) -> str:
    from kvfence.engine.workers import signal_name as _signal_name

    return f"dies of {_signal_name(code)}" if code < 0 else f"ends the process ({_signal_name(code)})"


def check_plugins(contract: Union[str, Contract[Any]], specs: Dict[str, Optional[str]],
                  timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Import each plug-in of ``specs`` (``{"kernel": spec, "sizing": spec}``; specs naming no user code and
    ``None`` are skipped) in one child process, checked there as far as the import goes (a kernel of a contract
    checked by the engine against its ABI, a sizing through the contract's ``sizings``); ``BadInput`` if an import
    does anything but return or raise."""
    from kvfence.engine import registry
    from kvfence.engine.kernels import is_plugin, release_source, sizing_is_plugin
    from kvfence.engine.launch import sizing_policy

    record = registry.get(contract) if isinstance(contract, str) else contract
    sizing = specs.get("sizing")
    if sizing and not (release_source(sizing) or is_plugin(sizing)):
        sizing_policy(record, sizing)  # a name the contract does not know: one line now, before anything starts
    plugin = {"kernel": lambda s: is_plugin(s), "sizing": lambda s: sizing_is_plugin(record, s)}
    todo = {what: spec for what, spec in specs.items() if spec and plugin[what](spec)}
    if not todo:
        return
    with tempfile.TemporaryDirectory(prefix="kvfence-probe-") as tmp:
        report = Path(tmp) / "report.json"
        # The options go in a file: a command-line argument is limited (128 KiB on Linux), a spec is not.
        options = Path(tmp) / "options.json"
        options.write_text(json.dumps(dict(loading=registry.loading(record), todo=todo)))
        try:
            proc = subprocess.run([sys.executable, "-m", "kvfence.engine.probe", str(report), str(options)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise BadInput(f"importing {_names(todo)} did not finish within {timeout_s:g}s") from None
        try:
            answer = json.loads(report.read_text())
        except (OSError, ValueError):
            answer = None
    if not isinstance(answer, dict):  # the import ended the probe before it could answer
        raise BadInput(f"importing {_names(todo)} {_exit_text(proc.returncode)} before kvfence could check it "
                       "(a plug-in's import, or a thread or exit handler it leaves, must not exit or kill its "
                       "process)")
    if answer.get("bad_input"):
        raise BadInput(str(answer["bad_input"]))
    if answer.get("error"):
        raise BadInput(f"importing {_names(todo)} raised {answer['error']}")


def _names(todo: Dict[str, str]) -> str:
    return " and ".join(f"{what} {spec!r}" for what, spec in todo.items())


def _probe(report: Path, options: dict[str, Any]) -> None:
    """The child: import each plug-in as the contract's record would, and write what happened to ``report``."""
    from kvfence.contract import Contract
    from kvfence.engine import kernels
    from kvfence.engine.import_probe import settle, threads_now
    from kvfence.engine.launch import sizing_policy
    from kvfence.engine.registry import load_in_worker

    answer: dict[str, Any] = {"ok": True}
    try:
        record = load_in_worker(options["loading"])
        before = threads_now()
        for what, spec in options["todo"].items():
            if what == "sizing":
                sizing_policy(record, spec)
                continue
            kernel = kernels.load_attr(spec, "kernel")
            if type(record).checker is Contract.checker:  # checked by the engine: its ABI now
                kernels.check_abi(record, spec, kernel)
        problem = settle(before)  # threads and exit handlers the imports left, run out here
        if problem is not None:
            answer = {"bad_input": f"importing {_names(options['todo'])}: {problem}"}
    except BadInput as exc:
        answer = {"bad_input": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt, SystemExit, anything: reported
        answer = {"error": f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__}
    report.write_text(json.dumps(answer))
    os._exit(0)  # no interpreter shutdown: its exit handlers ran in ``settle`` (or the import failed)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the parent, which decides
    _probe(Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text()))
