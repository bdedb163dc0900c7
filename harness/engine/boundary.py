"""One boundary for a plug-in contract's code: every method of a contract that is not kvfence's own runs in a
supervised child process, each call under a time limit, and what it does to that process is one line naming the
contract and the method (docs/security.md, "A plug-in contract's code").

A plug-in contract (registered under the entry point ``kvfence.contracts`` by a package other than kvfence:
``registry.builtin``) is its author's code. Every entry point that runs it (the commands ``fuzz``, ``repro``,
``mutants``, ``report``, ``check-contract``, ``upstream``; ``kvfence.check_kernel``; the recovery of a journal slot
another run left) does so in a child (``kvfence.engine.boundary_parent.supervise``), started in a process group of
its own:

* the child reports how the command ended through a file, written only once the command returned; a child that
  ended without it (``os._exit``, ``SystemExit`` past every handler, a signal, an abort) is ``ContractFault``:
  one line naming the contract and the method it was in, exit 2, never the child's own status (0 would pass);
* inside the child every method of the record, every sizing and option callable, every draw from its
  ``cases()`` strategy, and every call of a sizing plug-in (``--sizing file.py:attr``, whatever the contract: a
  command that names one runs in a child too) runs under ``calling``, which leaves a breadcrumb (contract,
  method, start time) in a file the parent reads: a call that outlives ``call_limit`` seconds has the child's
  group killed and is one line naming it; a ``SystemExit`` or a ``KeyboardInterrupt`` no signal sent is
  ``ContractFault`` naming the method;
  any other exception that escapes the command names the method that raised it, or the last one that returned
  (a wrong type);
* the user's SIGINT or SIGTERM is the parent's: it is passed to the child's group, the child ends as interrupted
  (its outputs written) within ``boundary_parent.GRACE_S`` or is killed, and the command's status is ``128 + signal``;
* when the child ends, its whole process group is killed: a process the contract forked does not outlive it.

In the caller's own process (a pytest run that draws a plug-in's cases itself) ``guard`` still converts an exit or
an interrupt from the contract's code into ``ContractFault``; only a child can survive ``os._exit``.

This module is the side that runs the contract's code: ``guard`` (the registry wraps every plug-in record in it),
``calling``, the breadcrumb and the child's status file. The parent's side, which starts and watches the child, is
``kvfence.engine.boundary_parent``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Callable, Iterator, List, Optional

from kvfence.contract import MEMBERS, Contract, Option
from kvfence.errors import BadInput, printable

#: Set in the child: the file it reports how the command ended to (``report``).
STATUS_ENV = "KVFENCE_CHILD_STATUS"
#: Set in the child: the file its breadcrumb goes to (the call into the contract in progress).
WHERE_ENV = "KVFENCE_CHILD_WHERE"
#: Set in the child of a command: the name the user ran kvfence by (``kvfence`` or ``python -m kvfence``), so the
#: lines the child prints (usage, ``fuzz``'s repro lines) spell the command the user typed, not the child's own.
PROG_ENV = "KVFENCE_PROG"
#: Seconds one call into a contract's code may take (overridden by ``KVFENCE_CALL_LIMIT_S``).
DEFAULT_CALL_LIMIT_S = 60.0
CALL_LIMIT_ENV = "KVFENCE_CALL_LIMIT_S"
#: The call limit of a run with ``--max-seconds T`` is ``max(T, MIN_CALL_LIMIT_S)`` when that is shorter: such a
#: run ends within ``T`` + one example + ``max(T, MIN_CALL_LIMIT_S)`` even if a contract method never returns.
MIN_CALL_LIMIT_S = 10.0
#: Bytes of a breadcrumb (written in place, padded, so the parent never reads half of two).
_WHERE_BYTES = 1024


class ContractFault(BadInput):
    """A plug-in contract's code ended its process, raised an exit or an interrupt, or overran its call limit;
    ``problem`` is the line without the contract's name (for a caller that names it already)."""

    def __init__(self, message: str, problem: Optional[str] = None):
        super().__init__(message)
        self.problem = problem or message


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
_STACK: List[tuple[Any, ...]] = []  # (contract, method, who) of the calls in progress, outermost first
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
    doc = {"contract": _STACK[-1][0], "method": _STACK[-1][1], "who": _STACK[-1][2],
           "context": [entry[1] for entry in _STACK[:-1]], "since": time.time()} if _STACK else {}
    data = json.dumps(doc).encode()[:_WHERE_BYTES - 1]
    try:
        os.pwrite(_WHERE[0], data.ljust(_WHERE_BYTES), 0)
    except OSError:
        pass


def fault(contract: str, method: str, what: str, who: Optional[str] = None) -> ContractFault:
    """The ``ContractFault`` of ``contract``'s ``method`` that did ``what`` (one line, the run no verdict); ``who``
    names the code when it is no contract's own (``sizing 'file.py:attr'``)."""
    problem = f"its {method} {what}; the run is not a verdict"
    return ContractFault(f"{who or f'contract {contract!r}'}: {problem}", problem)


@contextlib.contextmanager
def calling(contract: str, method: str, who: Optional[str] = None) -> Iterator[None]:
    """Run the block as a call into ``contract``'s ``method`` (see the module docstring); ``who``: the plug-in's
    name in its lines when it is no contract's code (a sizing plug-in), whose caller checks what it returns (it
    is not blamed for a later failure, as ``unexpected`` blames a contract's last method). In a checking worker
    (``convert_exits(False)``: its supervisor tells a kernel's exit from a contract's) it only notes where an
    exception rose."""
    from kvfence.engine.interrupt import Interrupted, pending

    convert = _CONVERT[0]
    _STACK.append((contract, method, who))
    _mark()
    try:
        yield
    except ContractFault:
        raise
    except SystemExit as exc:
        if not convert:
            raise
        raise fault(contract, method, f"raised SystemExit({exc.code!r})", who) from None
    except KeyboardInterrupt as exc:
        if isinstance(exc, Interrupted) or pending() is not None or not convert:
            raise  # the user's signal, or the worker's to judge
        raise fault(contract, method, "raised KeyboardInterrupt while no signal came", who) from None
    except BaseException as exc:
        if getattr(exc, "kvfence_raised_in", None) is None:
            try:
                setattr(exc, "kvfence_raised_in", (contract, method, who))  # noqa: B010 (an attribute no exception type declares)
            except AttributeError:
                pass
        raise
    finally:
        done = _STACK.pop()
        if who is None:
            _LAST[:] = [done]
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
        if member == "sizings" and isinstance(value, Mapping):
            return {k: _guarded_callable(v, contract, f"sizing {k!r}") if callable(v) else v
                    for k, v in value.items()}
        if member == "options" and isinstance(value, tuple):
            return tuple(replace(o, shard=_guarded_callable(o.shard, contract, f"option {o.name!r}'s shard"))
                         if isinstance(o, Option) and o.shard is not None else o for o in value)
        return value

    return property(read)


def unexpected(exc: BaseException, named: bool = True) -> str:
    """The one line of an exception that escaped a command in a child: the contract's method that raised it, or
    the last one that returned (kvfence could not use its answer); without the contract's name unless ``named``."""
    cause = f"{type(exc).__name__}: {printable(' '.join(str(exc).split()), 300)}"
    raised_in = getattr(exc, "kvfence_raised_in", None) or (_LAST[0] if _LAST else None)
    if raised_in is None:
        return f"the command failed: {cause}"
    who = raised_in[2] if len(raised_in) > 2 else None
    if getattr(exc, "kvfence_raised_in", None):
        found = fault(raised_in[0], raised_in[1], f"raised {cause}", who)
    else:
        found = fault(raised_in[0], raised_in[1], f"answered something kvfence cannot use ({cause}; "
                                                  "docs/contract-api.md says what each method returns)", who)
    return str(found) if named else found.problem


def refusal(exc: BadInput) -> str:
    """A ``BadInput`` that ends a command, naming the contract and the method that raised it when one did (a
    ``from_json`` refusing a case its own ``cases()`` drew, say): the line says whose refusal it is."""
    raised_in = getattr(exc, "kvfence_raised_in", None)
    text = str(exc)
    who = (raised_in[2] if raised_in and len(raised_in) > 2 else None) or (raised_in and f"contract {raised_in[0]!r}")
    if isinstance(exc, ContractFault) or not raised_in or text.startswith(str(who)):
        return text
    return f"{who}: its {raised_in[1]} refused: {text}"


def contract_failure(exc: BaseException) -> Optional[str]:
    """``unexpected(exc)`` when a guarded (plug-in) contract's code ran in this process, else None (kvfence's own
    failure, which keeps its traceback)."""
    return unexpected(exc) if (getattr(exc, "kvfence_raised_in", None) or _LAST) else None


def child_prog(prog: str) -> str:
    """The name the user ran kvfence by: the parent's (``PROG_ENV``) in a command's child, else ``prog``."""
    return os.environ.get(PROG_ENV) or prog


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
