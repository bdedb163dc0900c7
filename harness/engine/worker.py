"""The checking worker: a process that owns the device and checks launches for a supervisor.

The fuzzing process (the supervisor: Hypothesis, journal, reports; ``kvfence.engine.supervisor``) never
launches a kernel itself. It starts this process (``python -m kvfence.engine.worker``: a fresh interpreter that
picks CUDA or the Triton interpreter for itself) with the run's plan as data; the worker loads the contract's
record by its registry entry and checks with the checker the engine gives it for the plan
(``kvfence.engine.checking.checker_for``: the contract's own, or the engine's). Launches arrive as plain JSON
records (``kvfence.engine.launch.to_record``), findings go back as ``Finding.to_dict`` JSON: nothing is pickled
either way, so a kernel plug-in running here cannot make the supervisor run code. A shared 8-byte counter tells
the supervisor which launch is running, so when this process dies or stalls the guilty launch is known.

What the kernel can do here, and what becomes of it: a death (segfault, ``os.abort``, ``os._exit``) or a
``KeyboardInterrupt`` it raises ends this process (the supervisor's ``CRASH``); a CUDA context it leaves
unusable is reported as ``CRASH`` for its launch and ends this process; ``sys.exit()`` inside a launch is a
``LAUNCH_ERROR`` (the checker catches it like any launch error).
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any, BinaryIO, Callable, List, Optional, Tuple

from kvfence.contract import Checker, Launch
from kvfence.engine.boundary import contract_failure, convert_exits, refusal
from kvfence.engine.findings import Finding, Kind
from kvfence.engine.triton_warmup import TritonWarmup
from kvfence.engine.triton_warmup import wanted as triton_warmup_wanted
from kvfence.errors import BadInput


def _cuda_context_alive() -> bool:
    """After a launch error on CUDA: can the context still run a kernel? (A fault makes it sticky.)"""
    import torch

    try:
        x = torch.ones(1, device="cuda")
        x.add_(1)
        torch.cuda.synchronize()
        return True
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return False


def _send(conn: Connection, message: dict[str, Any]) -> None:
    conn.send_bytes(json.dumps(message, separators=(",", ":")).encode())


def _worker_check(session: Checker, case: Launch[Any], device: str) -> Tuple[List[dict[str, Any]], bool]:
    """``(finding dicts, fatal)`` for one case; ``fatal`` when the CUDA context died with it."""
    try:
        findings = session.check(case)
    except KeyboardInterrupt:  # raised by plug-in code (SIGINT is ignored here): a crash of this case
        os._exit(EXIT_PLUGIN_INTERRUPT)
    except SystemExit as exc:  # a plug-in exited outside the launch itself (e.g. in a sizing callable)
        findings = [Finding(Kind.LAUNCH_ERROR, "kernel", "launch", detail=f"SystemExit: {exc.code!r}")]
    except BadInput:
        raise
    except Exception as exc:
        if device == "cuda" and not _cuda_context_alive():
            detail = f"CUDA context lost: {type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
            return [Finding(Kind.CRASH, "kernel", "launch", detail=detail).to_dict()], True
        raise
    if device == "cuda" and any(f.kind is Kind.LAUNCH_ERROR for f in findings) and not _cuda_context_alive():
        errors = "; ".join(f.detail for f in findings if f.kind is Kind.LAUNCH_ERROR)
        crash = Finding(Kind.CRASH, "kernel", "launch", detail=f"CUDA context lost: {errors}"[:500])
        return [crash.to_dict()] + [f.to_dict() for f in findings if f.kind is not Kind.LAUNCH_ERROR], True
    return [f.to_dict() for f in findings], False


#: Exit status of a worker whose CUDA context died during a batch of several cases: the supervisor
#: re-runs them one at a time to find the guilty one (a single case's CRASH is reported directly).
EXIT_CONTEXT_LOST = 70
#: The worker's exit status when kernel or plug-in code raised ``KeyboardInterrupt`` (the worker ignores
#: SIGINT, so it is the code's own): the supervisor reports the case as a ``CRASH``.
EXIT_PLUGIN_INTERRUPT = 71


def _worker_check_many(session: Any, cases: list[Any], device: str) -> List[list[Any]]:
    """Finding dicts for a run of one config, through ``Session.check_many``. If the batch leaves the
    CUDA context dead, the worker exits without a reply: which case did it is not known here."""
    try:
        out = session.check_many(cases)
    except KeyboardInterrupt:  # plug-in code (SIGINT is ignored here): the supervisor finds the case alone
        os._exit(EXIT_PLUGIN_INTERRUPT)
    except BadInput:
        raise
    except (Exception, SystemExit):
        if device == "cuda" and not _cuda_context_alive():
            os._exit(EXIT_CONTEXT_LOST)
        raise
    if device == "cuda" and any(f.kind is Kind.LAUNCH_ERROR for fs in out for f in fs) \
            and not _cuda_context_alive():
        os._exit(EXIT_CONTEXT_LOST)
    return [[f.to_dict() for f in findings] for findings in out]


def _worker_side(options: dict[str, Any], device: str
                 ) -> Tuple[Checker, Callable[[dict[str, Any]], List[Launch[Any]]]]:
    """The contract's record, loaded here by its registry entry (a plug-in's import runs in this process only),
    and the checker of the run's plan on this device: ``(checker, decode(message) -> launches)``."""
    from kvfence.engine.checking import checker_for
    from kvfence.engine.launch import from_record
    from kvfence.engine.plan import RunPlan
    from kvfence.engine.registry import load_in_worker

    record = load_in_worker(options["loading"])
    plan = RunPlan.from_dict(dict(options["plan"], device=device))
    checker = checker_for(record, plan)

    def decode(message: dict[str, Any]) -> List[Launch[Any]]:
        return [from_record(record, data) for data in message["launches"]]

    return checker, decode


def _worker_main(conn: Connection, progress: ProgressCounter, options: dict[str, Any]) -> None:
    """Entry point of the worker process: set up the device and session, then serve ``check`` messages."""
    # Ctrl-C in a terminal reaches the whole process group: the supervisor decides when the worker ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Triton's per-process start-up runs beside torch's import (kvfence.engine.triton_warmup says why).
    warmup = TritonWarmup().start() if triton_warmup_wanted(options["device"]) else None
    try:
        from kvfence.device import select

        device = select(options["device"])
        session, decode = _worker_side(options, device)
    except BadInput as exc:
        _send(conn, {"op": "bad_input", "message": str(exc)})
        return
    except BaseException:  # noqa: BLE001 - reported to the supervisor, which raises it there
        _send(conn, {"op": "error", "traceback": traceback.format_exc()})
        return
    if device == "cuda":  # create the CUDA context before "ready": a spare worker has it waiting
        import torch

        torch.zeros(1, device="cuda")
        if warmup is not None and warmup.join() is None:
            print(f"kvfence worker: Triton's start-up was not warmed ({warmup.error}); the first launch pays for it",
                  file=sys.stderr, flush=True)
    try:
        _send(conn, {"op": "ready", "pid": os.getpid(), "device": device})
    except OSError:
        return  # the supervisor is gone (a spare it no longer needs)
    _serve(conn, progress, session, decode, device)


def _serve(conn: Connection, progress: ProgressCounter, session: Any, decode: Callable[[dict[str, Any]], List[Any]],
           device: str) -> None:
    """Answer ``check`` messages until the supervisor is gone, sends anything else, or a case was fatal."""
    while True:
        try:
            message = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the supervisor is gone
        if message.get("op") != "check":
            return
        try:
            results, fatal = _check_message(message, progress, session, decode, device)
        except BadInput as exc:
            _send(conn, {"op": "bad_input", "message": refusal(exc)})
            continue
        except BaseException as exc:  # noqa: BLE001 - a plug-in contract's failure (one line), else a kvfence bug
            said = contract_failure(exc)
            _send(conn, {"op": "bad_input", "message": said} if said else
                  {"op": "error", "traceback": traceback.format_exc()})
            continue
        stats = {k: v for k, v in session.stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        _send(conn, {"op": "results", "results": results, "fatal": fatal, "stats": stats})
        if fatal:
            return


def _check_message(message: dict[str, Any], progress: ProgressCounter, session: Any,
                   decode: Callable[[dict[str, Any]], List[Any]],
                   device: str) -> Tuple[List[Any], bool]:
    """The findings of one ``check`` message's cases, as data, and whether one was fatal (the rest unchecked).
    A run of cases of one group (one config) goes to the checker's ``check_many``: one device round trip."""
    results: List[Any] = []
    fatal = False
    cases = decode(message)
    groups = message.get("groups") or list(range(len(cases)))
    if message.get("dry"):  # RemoteSession.round_trip: the messaging cost alone
        results = [[] for _ in cases]
    i = len(results)
    while i < len(cases):
        progress.value = i + 1  # cases started: the supervisor's clock for HANG and CRASH
        j = i + 1
        while j < len(cases) and groups[j] == groups[i]:
            j += 1
        if j - i > 1 and hasattr(session, "check_many"):
            results += _worker_check_many(session, cases[i:j], device)
        else:
            findings, fatal = _worker_check(session, cases[i], device)
            results.append(findings)
            j = i + 1
            if fatal:
                break
        i = j
    return results, fatal


class ProgressCounter:
    """One int64 in a shared file mapping: the number of cases the worker has started on the list
    in flight. The worker writes it before each case, so when it dies or stalls the supervisor knows
    which case it was on, at the cost of a memory store per case (no message)."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._map = mmap.mmap(file.fileno(), 8)

    @property
    def value(self) -> int:
        return int.from_bytes(self._map[:8], "little", signed=True)

    @value.setter
    def value(self, v: int) -> None:
        self._map[:8] = int(v).to_bytes(8, "little", signed=True)

    def close(self) -> None:
        self._map.close()
        self._file.close()


def main(argv: Optional[List[str]] = None) -> None:
    """``python -m kvfence.engine.worker SOCKET_FD PROGRESS_FD OPTIONS_JSON``: started by ``RemoteSession``."""
    argv = sys.argv[1:] if argv is None else argv
    convert_exits(False)  # a contract's exit or interrupt here is judged by the supervisor (module docstring)
    conn = Connection(int(argv[0]))
    progress = ProgressCounter(os.fdopen(int(argv[1]), "r+b"))
    _worker_main(conn, progress, json.loads(argv[2]))


if __name__ == "__main__":
    main()
