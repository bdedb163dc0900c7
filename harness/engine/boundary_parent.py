"""The parent's side of the boundary for a plug-in contract's code (``kvfence.engine.boundary`` says what the
boundary is): a kvfence command or function run in a supervised child for the plug-in contracts it names.

``supervise`` starts the child in a process group of its own, passes the user's SIGINT or SIGTERM on to it, kills
its group when a call into the contract outlives its limit (the breadcrumb ``kvfence.engine.boundary.calling``
leaves) and reads how the command ended from the status file the child wrote (``kvfence.engine.boundary.report``);
``run_command`` runs ``python -m kvfence ARGV`` so, ``call`` one of kvfence's functions (``serve`` is its child's
side). ``foreign`` tells which contracts need it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from kvfence.engine.boundary import (
    CALL_LIMIT_ENV,
    PROG_ENV,
    STATUS_ENV,
    WHERE_ENV,
    ContractFault,
    call_limit,
    enter_child,
    fault,
    report,
    unexpected,
)
from kvfence.errors import EXIT_BAD_INPUT, BadInput, printable

#: Seconds a child gets after a forwarded signal to write its outputs before its group is killed.
GRACE_S = 20.0
POLL_S = 0.1


def foreign(names: Iterable[object]) -> List[str]:
    """Those of ``names`` that are registered contracts not of kvfence's own (``registry.builtin``)."""
    from kvfence.engine import registry

    known = registry.names()
    return [n for n in dict.fromkeys(names) if isinstance(n, str) and n in known and not registry.builtin(n)]


class _Watch:
    """A child's process group, watched: the user's signals passed on, the call in progress timed."""

    def __init__(self, proc: subprocess.Popen[bytes], where: Path, limit: float) -> None:
        self.proc, self.where, self.limit = proc, where, limit
        self.signals: List[int] = []
        self.overrun: Optional[dict[str, Any]] = None

    def _forward(self, signum: int, frame: Optional[FrameType]) -> None:
        self.signals.append(signum)
        _killpg(self.proc.pid, signum)

    def wait(self) -> int:
        handlers: Dict[signal.Signals, Any] = {}  # signal.signal's earlier handlers, put back after
        if threading.current_thread() is threading.main_thread():
            handlers = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        deadline: Optional[float] = None
        try:
            while True:
                try:
                    return self.proc.wait(timeout=POLL_S)
                except subprocess.TimeoutExpired:
                    pass
                if self.signals and deadline is None:
                    deadline = time.monotonic() + GRACE_S
                crumb = read_where(self.where)
                if deadline is not None and time.monotonic() > deadline:
                    _killpg(self.proc.pid, signal.SIGKILL)
                elif not self.signals and crumb and time.time() - crumb.get("since", time.time()) > self.limit:
                    self.overrun = crumb
                    _killpg(self.proc.pid, signal.SIGKILL)
        finally:
            for sig, old in handlers.items():
                signal.signal(sig, old)
            _killpg(self.proc.pid, signal.SIGKILL)  # nothing the child started outlives it


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def read_where(path: Path) -> dict[str, Any]:
    """The breadcrumb a child left (``{}`` when it was in no call, or the file cannot be read)."""
    try:
        doc = json.loads(path.read_bytes().decode(errors="replace").strip() or "{}")
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) and isinstance(doc.get("method"), str) else {}


def _where_text(crumb: dict[str, Any], contracts: List[str]) -> Tuple[str, str, Optional[str]]:
    """``(contract, method, who)`` of a breadcrumb, for ``fault``."""
    named = crumb.get("contract")
    contract = named if isinstance(named, str) else ", ".join(contracts)
    method = crumb.get("method") or "code"
    context = [c for c in crumb.get("context") or [] if isinstance(c, str)]
    who = crumb.get("who") if isinstance(crumb.get("who"), str) else None
    return contract, printable(method + (f" (in {' in '.join(reversed(context))})" if context else ""), 200), who


def supervise(cmd: List[str], contracts: List[str], *, limit: float, env: Optional[dict[str, str]] = None,
              quiet: bool = False) -> dict[str, Any]:
    """Run ``cmd`` (a kvfence child) for plug-in ``contracts``: the answer it reported (``{"exit": code, ...}``),
    ``{"exit": 128 + signal, "signal": name}`` when the user's signal interrupted it, or ``ContractFault``."""
    from kvfence.engine import registry
    from kvfence.engine.workers import signal_name

    with tempfile.TemporaryDirectory(prefix="kvfence-boundary-") as tmp:
        status, where = Path(tmp) / "status.json", Path(tmp) / "where"
        where.write_bytes(b"")
        child_env = dict(os.environ, **registry.child_env(), **(env or {}),
                         **{STATUS_ENV: str(status), WHERE_ENV: str(where), CALL_LIMIT_ENV: f"{limit:g}"})
        silenced = subprocess.DEVNULL if quiet else None  # None: the child shares ours
        proc = subprocess.Popen(cmd, env=child_env, process_group=0, stdin=silenced, stdout=silenced, stderr=silenced)
        watch = _Watch(proc, where, limit)
        code = watch.wait()
        crumb = read_where(where)
        answer = _read(status)
    if watch.signals:
        name = signal.Signals(watch.signals[0]).name
        return {"exit": 128 + watch.signals[0], "signal": name, **({"answer": answer} if answer else {})}
    if watch.overrun is not None:
        contract, method, who = _where_text(watch.overrun, contracts)
        raise fault(contract, method, f"did not return within {limit:g}s (kvfence's limit on one call into a "
                                       f"plug-in's code, {CALL_LIMIT_ENV}); its processes were killed", who)
    if answer is None:
        contract, method, who = _where_text(crumb, contracts)
        how = f"died of {signal_name(code)}" if code < 0 else f"ended its process with exit status {code}"
        raise fault(contract, method, f"{how} before the command returned (a plug-in's code must return or "
                                       "raise, never exit or kill its process); nothing it printed counts", who)
    if answer.get("exit") in (130, 143):
        contract, method, who = _where_text(crumb, contracts)
        raise fault(contract, method, "raised an interrupt while no signal came", who)
    return answer


def _read(path: Path) -> Optional[dict[str, Any]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and type(doc.get("exit")) is int else None


def run_command(argv: List[str], contracts: List[str], warn: Callable[[str], None],
                max_seconds: Optional[float] = None, prog: str = "python -m kvfence") -> int:
    """``python -m kvfence ARGV`` behind the boundary: its exit status, 128 + signal when the user interrupted
    it, or 2 with one line (``warn``) when the contract's code ended, interrupted or overran it. ``prog``: the
    name the user ran kvfence by, which the child's lines spell (``PROG_ENV``)."""
    try:
        answer = supervise([sys.executable, "-m", "kvfence", *argv], contracts, limit=call_limit(max_seconds),
                           env={PROG_ENV: prog})
    except ContractFault as exc:
        warn(f"kvfence: error: {exc}")
        return EXIT_BAD_INPUT
    if answer.get("signal"):
        warn("kvfence: interrupted")
    return int(answer["exit"])  # an int: _read's check, or supervise's 128 + signal


def call(target: str, payload: dict[str, Any], contracts: List[str], max_seconds: Optional[float] = None) -> Any:
    """``target`` (``kvfence.module:function``, called with ``payload`` as keywords) in a child behind the
    boundary: its JSON result; its ``BadInput`` or ``AssertionError`` raised again here; the user's signal as
    ``Interrupted``; the contract's fault as ``ContractFault``."""
    from kvfence.engine.interrupt import Interrupted

    with tempfile.TemporaryDirectory(prefix="kvfence-boundary-call-") as tmp:
        request = Path(tmp) / "request.json"
        request.write_text(json.dumps({"target": target, "payload": payload}))
        answer = supervise([sys.executable, "-m", "kvfence.engine.boundary_parent", str(request)], contracts,
                           limit=call_limit(max_seconds))
    if answer.get("signal"):
        raise Interrupted(signal.Signals[answer["signal"]].value)
    if "assertion" in answer:
        raise AssertionError(answer["assertion"])
    if "bad_input" in answer:
        raise (ContractFault if answer.get("fault") else BadInput)(answer["bad_input"])
    return answer.get("result")


def serve(request: Path) -> None:
    """The child of ``call``: run the target, report its outcome."""
    import importlib

    from kvfence.engine.interrupt import Interrupted, signals_interrupt

    enter_child()
    doc = json.loads(request.read_text())
    module, _, attr = doc["target"].partition(":")
    if module.split(".")[0] != "kvfence":
        raise SystemExit("kvfence.engine.boundary_parent serves kvfence's own functions only")
    try:
        with signals_interrupt():
            answer = {"exit": 0, "result": getattr(importlib.import_module(module), attr)(**doc["payload"])}
    except Interrupted as exc:
        answer = {"exit": exc.exit_code}
    except ContractFault as exc:
        answer = {"exit": EXIT_BAD_INPUT, "bad_input": str(exc), "fault": True}
    except BadInput as exc:
        answer = {"exit": EXIT_BAD_INPUT, "bad_input": str(exc)}
    except AssertionError as exc:
        answer = {"exit": 1, "assertion": str(exc)}
    except KeyboardInterrupt:  # no signal came (``Interrupted`` is the user's): the contract's code raised it
        answer = {"exit": EXIT_BAD_INPUT, "bad_input": unexpected(KeyboardInterrupt("no signal came")),
                  "fault": True}
    except Exception as exc:  # noqa: BLE001 - the contract's failure or what it returned: one line
        answer = {"exit": EXIT_BAD_INPUT, "bad_input": unexpected(exc), "fault": True}
    report(answer)


if __name__ == "__main__":
    # The child's state (``in_child`` among it) is ``kvfence.engine.boundary``'s, imported as the target imports it:
    # this ``__main__`` copy holds none.
    serve(Path(sys.argv[1]))
