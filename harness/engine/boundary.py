"""One boundary for a plug-in contract's code: every method of a contract that is not kvfence's own runs in a
supervised child process, each call under a time limit, and what it does to that process is one line naming the
contract and the method (docs/security.md, "A plug-in contract's code").

A plug-in contract (registered under the entry point ``kvfence.contracts`` by a package other than kvfence:
``registry.builtin``) is its author's code. Every entry point that runs it (the commands ``fuzz``, ``repro``,
``mutants``, ``report``, ``check-contract``, ``upstream``; ``kvfence.check_kernel``; the recovery of a journal slot
another run left) does so in a child (``supervise``), started in a process group of its own:

* the child reports how the command ended through a file, written only once the command returned; a child that
  ended without it (``os._exit``, ``SystemExit`` past every handler, a signal, an abort) is ``ContractFault``:
  one line naming the contract and the method it was in, exit 2, never the child's own status (0 would pass);
* inside the child every method of the record, every sizing and option callable, and every draw from its
  ``cases()`` strategy runs under ``calling``, which leaves a breadcrumb (contract, method, start time) in a
  file the parent reads: a call that outlives ``call_limit`` seconds has the child's group killed and is one line
  naming it; a ``SystemExit`` or a ``KeyboardInterrupt`` no signal sent is ``ContractFault`` naming the method;
  any other exception that escapes the command names the method that raised it, or the last one that returned
  (a wrong type);
* the user's SIGINT or SIGTERM is the parent's: it is passed to the child's group, the child ends as interrupted
  (its outputs written) within ``GRACE_S`` or is killed, and the command's status is ``128 + signal``;
* when the child ends, its whole process group is killed: a process the contract forked does not outlive it.

In the caller's own process (a pytest run that draws a plug-in's cases itself) ``guard`` still converts an exit or
an interrupt from the contract's code into ``ContractFault``; only a child can survive ``os._exit``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

from kvfence.contract import MEMBERS, Contract
from kvfence.errors import EXIT_BAD_INPUT, BadInput, printable

#: Set in the child: the file it reports how the command ended to (``report``).
STATUS_ENV = "KVFENCE_CHILD_STATUS"
#: Set in the child: the file its breadcrumb goes to (the call into the contract in progress).
WHERE_ENV = "KVFENCE_CHILD_WHERE"
#: Seconds one call into a contract's code may take (overridden by ``KVFENCE_CALL_LIMIT_S``).
DEFAULT_CALL_LIMIT_S = 60.0
CALL_LIMIT_ENV = "KVFENCE_CALL_LIMIT_S"
#: The call limit of a run with ``--max-seconds T`` is ``max(T, MIN_CALL_LIMIT_S)`` when that is shorter: such a
#: run ends within ``T`` + one example + ``max(T, MIN_CALL_LIMIT_S)`` even if a contract method never returns.
MIN_CALL_LIMIT_S = 10.0
#: Seconds a child gets after a forwarded signal to write its outputs before its group is killed.
GRACE_S = 20.0
POLL_S = 0.1
#: Bytes of a breadcrumb (written in place, padded, so the parent never reads half of two).
_WHERE_BYTES = 1024


class ContractFault(BadInput):
    """A plug-in contract's code ended its process, raised an exit or an interrupt, or overran its call limit;
    ``problem`` is the line without the contract's name (for a caller that names it already)."""

    def __init__(self, message: str, problem: Optional[str] = None):
        super().__init__(message)
        self.problem = problem or message


def foreign(names: Iterable[str]) -> List[str]:
    """Those of ``names`` that are registered contracts not of kvfence's own (``registry.builtin``)."""
    from kvfence.engine import registry

    known = registry.names()
    return [n for n in dict.fromkeys(names) if isinstance(n, str) and n in known and not registry.builtin(n)]


def call_limit(max_seconds: Optional[float] = None) -> float:
    """Seconds one call into a plug-in contract's code may take (module constants)."""
    try:
        limit = float(os.environ.get(CALL_LIMIT_ENV) or DEFAULT_CALL_LIMIT_S)
    except ValueError:
        limit = DEFAULT_CALL_LIMIT_S
    if not limit > 0:
        limit = DEFAULT_CALL_LIMIT_S
    if isinstance(max_seconds, (int, float)) and max_seconds > 0:
        limit = min(limit, max(float(max_seconds), MIN_CALL_LIMIT_S))
    return limit


# -- inside a process that runs the contract's code -------------------------------------------------------------
_STACK: List[tuple[Any, ...]] = []  # (contract, method) of the calls in progress, outermost first
_LAST: List[tuple[Any, ...]] = []  # the last call that returned
_WHERE: List[int] = []  # the breadcrumb file's descriptor, in a child
_CONVERT = [True]  # whether an exit or interrupt from the contract's code is a ContractFault here


def convert_exits(on: bool) -> None:
    """Whether ``calling`` turns a contract's ``SystemExit`` / ``KeyboardInterrupt`` into ``ContractFault`` in this
    process (off in a checking worker: its supervisor reports a launch's exit as the kernel's finding)."""
    _CONVERT[0] = on


def _mark() -> None:
    if not _WHERE:
        return
    doc = {"contract": _STACK[-1][0], "method": _STACK[-1][1], "context": [m for _, m in _STACK[:-1]],
           "since": time.time()} if _STACK else {}
    data = json.dumps(doc).encode()[:_WHERE_BYTES - 1]
    try:
        os.pwrite(_WHERE[0], data.ljust(_WHERE_BYTES), 0)
    except OSError:
        pass


def _fault(contract: str, method: str, what: str) -> ContractFault:
    problem = f"its {method} {what}; the run is not a verdict"
    return ContractFault(f"contract {contract!r}: {problem}", problem)


@contextlib.contextmanager
def calling(contract: str, method: str) -> Iterator[None]:
    """Run the block as a call into ``contract``'s ``method`` (see the module docstring). In a checking worker
    (``convert_exits(False)``: its supervisor tells a kernel's exit from a contract's) it only notes where an
    exception rose."""
    from kvfence.engine.interrupt import Interrupted, pending

    convert = _CONVERT[0]
    _STACK.append((contract, method))
    _mark()
    try:
        yield
    except ContractFault:
        raise
    except SystemExit as exc:
        if not convert:
            raise
        raise _fault(contract, method, f"raised SystemExit({exc.code!r})") from None
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted) or pending() is not None or not convert:
            raise  # the user's signal, or the worker's to judge
        raise _fault(contract, method, "raised KeyboardInterrupt while no signal came") from None
    except BaseException as exc:
        if getattr(exc, "kvfence_raised_in", None) is None:
            try:
                setattr(exc, "kvfence_raised_in", (contract, method))  # noqa: B010 (an attribute no exception type declares)
            except AttributeError:
                pass
        raise
    finally:
        _LAST[:] = [_STACK.pop()]
        _mark()


def _guarded_callable(fn: Callable[..., Any], contract: str, method: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        with calling(contract, method):
            return fn(*args, **kwargs)

    return call


def _guarded_strategy(strategy: Any, contract: str) -> Any:
    """``strategy`` drawn under ``calling`` (a composite strategy around it), or itself when it is none."""
    from hypothesis import strategies as st
    from hypothesis.strategies import SearchStrategy

    if not isinstance(strategy, SearchStrategy):
        return strategy

    @st.composite
    def drawn(draw: st.DrawFn) -> Any:
        with calling(contract, "cases() strategy (drawing a case)"):
            return draw(strategy)

    return drawn()


def guard(record: Any, contract: str) -> Any:
    """``record`` (a plug-in's) with every member it defines run under ``calling``: its class is swapped for a
    subclass that wraps them (same name, no new slots); members it inherits from ``Contract`` are kvfence's code
    and stay as they are, so ``type(record).<method> is Contract.<method>`` still tells what it defines."""
    cls = type(record)
    if not isinstance(record, Contract) or getattr(cls, "_kvfence_guarded", False):
        return record
    namespace = {"_kvfence_guarded": True, "__slots__": (), "__module__": cls.__module__,
                 "__qualname__": cls.__qualname__}
    for member in MEMBERS:
        raw = inspect.getattr_static(cls, member, None)
        if raw is None or raw is inspect.getattr_static(Contract, member, None):
            continue
        if inspect.isfunction(raw):
            namespace[member] = _method(member, contract)
        elif isinstance(raw, property) or member in ("sizings", "options"):
            namespace[member] = _member(member, contract)
    guarded = type(cls.__name__, (cls,), namespace)
    try:
        record.__class__ = guarded
    except TypeError:
        return record
    return record


def _parent_attr(self: Any, member: str) -> Any:
    return getattr(super(_guarded_class(self), self), member)


def _guarded_class(self: Any) -> type:
    return next(k for k in type(self).__mro__ if k.__dict__.get("_kvfence_guarded"))


def _method(member: str, contract: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        with calling(contract, f"{member}()"):
            out = _parent_attr(self, member)(*args, **kwargs)
        return _guarded_strategy(out, contract) if member == "cases" else out

    method.__name__ = member
    return method


def _member(member: str, contract: str) -> property:
    def read(self: Any) -> Any:
        with calling(contract, f"{member} (reading it)"):
            value = vars(self)[member] if member in getattr(self, "__dict__", {}) else _parent_attr(self, member)
        if member in ("sizings", "options") and isinstance(value, Mapping):
            what = "sizing" if member == "sizings" else "option"
            return {k: _guarded_callable(v, contract, f"{what} {k!r}") if callable(v) else v
                    for k, v in value.items()}
        return value

    return property(read)


def unexpected(exc: BaseException, named: bool = True) -> str:
    """The one line of an exception that escaped a command in a child: the contract's method that raised it, or
    the last one that returned (kvfence could not use its answer); without the contract's name unless ``named``."""
    cause = f"{type(exc).__name__}: {printable(' '.join(str(exc).split()), 300)}"
    raised_in = getattr(exc, "kvfence_raised_in", None) or (_LAST[0] if _LAST else None)
    if raised_in is None:
        return f"the command failed: {cause}"
    if getattr(exc, "kvfence_raised_in", None):
        fault = _fault(raised_in[0], raised_in[1], f"raised {cause}")
    else:
        fault = _fault(raised_in[0], raised_in[1], f"answered something kvfence cannot use ({cause}; "
                                                   "docs/contract-api.md says what each method returns)")
    return str(fault) if named else fault.problem


def refusal(exc: BadInput) -> str:
    """A ``BadInput`` that ends a command, naming the contract and the method that raised it when one did (a
    ``from_json`` refusing a case its own ``cases()`` drew, say): the line says whose refusal it is."""
    raised_in = getattr(exc, "kvfence_raised_in", None)
    text = str(exc)
    if isinstance(exc, ContractFault) or not raised_in or text.startswith(f"contract {raised_in[0]!r}"):
        return text
    return f"contract {raised_in[0]!r}: its {raised_in[1]} refused: {text}"


def contract_failure(exc: BaseException) -> Optional[str]:
    """``unexpected(exc)`` when a guarded (plug-in) contract's code ran in this process, else None (kvfence's own
    failure, which keeps its traceback)."""
    return unexpected(exc) if (getattr(exc, "kvfence_raised_in", None) or _LAST) else None


def enter_child() -> bool:
    """In a child: take the status and breadcrumb files out of the environment (processes it starts, a checking
    worker or a ``--jobs`` child, must not report in its place); whether this process is such a child."""
    status, where = os.environ.pop(STATUS_ENV, None), os.environ.pop(WHERE_ENV, None)
    if where:
        try:
            _WHERE[:] = [os.open(where, os.O_WRONLY)]
        except OSError:
            pass
    if status:
        _STATUS[:] = [status]
    return bool(status)


_STATUS: List[str] = []


def in_child() -> bool:
    """Whether this process is a boundary child (``enter_child`` found its status file)."""
    return bool(_STATUS)


def report(answer: dict[str, Any]) -> None:
    """The child's answer (``{"exit": code, ...}``), written once the command returned (all or nothing)."""
    if not _STATUS:
        return
    tmp = f"{_STATUS[0]}.tmp"
    with open(tmp, "w") as fh:
        json.dump(answer, fh)
    os.replace(tmp, _STATUS[0])


# -- the parent's side ------------------------------------------------------------------------------------------
class _Watch:
    """A child's process group, watched: the user's signals passed on, the call in progress timed."""

    def __init__(self, proc: subprocess.Popen[Any], where: Path, limit: float):
        self.proc, self.where, self.limit = proc, where, limit
        self.signals: List[int] = []
        self.overrun: Optional[dict[str, Any]] = None

    def _forward(self, signum: int, frame: object) -> None:
        self.signals.append(signum)
        _killpg(self.proc.pid, signum)

    def wait(self) -> int:
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            handlers = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        deadline = None
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


def _where_text(crumb: dict[str, Any], contracts: List[str]) -> tuple[Any, ...]:
    contract = crumb.get("contract") if isinstance(crumb.get("contract"), str) else ", ".join(contracts)
    method = crumb.get("method") or "code"
    context = [c for c in crumb.get("context") or [] if isinstance(c, str)]
    return contract, printable(method + (f" (in {' in '.join(reversed(context))})" if context else ""), 200)


def supervise(cmd: List[str], contracts: List[str], *, limit: float, env: Optional[dict[str, Any]] = None,
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
        output: Dict[str, Any] = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL} if quiet else {}
        proc = subprocess.Popen(cmd, env=child_env, process_group=0, stdin=subprocess.DEVNULL if quiet else None,
                                **output)
        watch = _Watch(proc, where, limit)
        code = watch.wait()
        crumb = read_where(where)
        answer = _read(status)
    if watch.signals:
        name = signal.Signals(watch.signals[0]).name
        return {"exit": 128 + watch.signals[0], "signal": name, **({"answer": answer} if answer else {})}
    if watch.overrun is not None:
        contract, method = _where_text(watch.overrun, contracts)
        raise _fault(contract, method, f"did not return within {limit:g}s (kvfence's limit on one call into a "
                                       f"plug-in contract's code, {CALL_LIMIT_ENV}); its processes were killed")
    if answer is None:
        contract, method = _where_text(crumb, contracts)
        how = f"died of {signal_name(code)}" if code < 0 else f"ended its process with exit status {code}"
        raise _fault(contract, method, f"{how} before the command returned (a contract's methods must return or "
                                       "raise, never exit or kill their process); nothing it printed counts")
    if answer.get("exit") in (130, 143):
        contract, method = _where_text(crumb, contracts)
        raise _fault(contract, method, "raised an interrupt while no signal came")
    return answer


def _read(path: Path) -> Optional[dict[str, Any]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and type(doc.get("exit")) is int else None


def run_command(argv: List[str], contracts: List[str], warn: Callable[[str], None],
                max_seconds: Optional[float] = None) -> int:
    """``python -m kvfence ARGV`` behind the boundary: its exit status, 128 + signal when the user interrupted
    it, or 2 with one line (``warn``) when the contract's code ended, interrupted or overran it."""
    try:
        answer = supervise([sys.executable, "-m", "kvfence", *argv], contracts, limit=call_limit(max_seconds))
    except ContractFault as exc:
        warn(f"kvfence: error: {exc}")
        return EXIT_BAD_INPUT
    if answer.get("signal"):
        warn("kvfence: interrupted")
    return int(answer["exit"])


def call(target: str, payload: dict[str, Any], contracts: List[str], max_seconds: Optional[float] = None) -> Any:

    """``target`` (``kvfence.module:function``, called with ``payload`` as keywords) in a child behind the
    boundary: its JSON result; its ``BadInput`` or ``AssertionError`` raised again here; the user's signal as
    ``Interrupted``; the contract's fault as ``ContractFault``."""
    from kvfence.engine.interrupt import Interrupted

    with tempfile.TemporaryDirectory(prefix="kvfence-boundary-call-") as tmp:
        request = Path(tmp) / "request.json"
        request.write_text(json.dumps({"target": target, "payload": payload}))
        answer = supervise([sys.executable, "-m", "kvfence.engine.boundary", str(request)], contracts,
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
        raise SystemExit("kvfence.engine.boundary serves kvfence's own functions only")
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
    # The module as the rest of kvfence imports it (``-m`` runs a second copy as ``__main__``: its state,
    # ``in_child`` among it, would not be the one the target sees).
    from kvfence.engine import boundary as _boundary

    _boundary.serve(Path(sys.argv[1]))
