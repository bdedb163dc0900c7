"""Crash-proof checking, the supervisor's side: ``RemoteSession`` checks launches in a worker process.

The fuzzing process (the supervisor: Hypothesis, journal, reports) never launches the kernel itself.
``RemoteSession`` starts one worker process (``python -m kvfence.engine.worker``: a fresh interpreter that
picks CUDA or the Triton interpreter for itself) and talks to it over a socket pair: cases go as plain
JSON data (the launch's record: ``kvfence.engine.launch.to_record``), findings come back as
``Finding.to_dict`` JSON. The worker loads the contract's record by its registry entry and checks with the
checker the record gives it (``Contract.checker``, else the engine's ``TableChecker``): it knows no contract by
name.
Nothing is pickled either way, so a kernel plug-in running in the worker cannot make the supervisor
run code. The worker is started once and reused for many cases; ``check_many`` sends a whole list in
one message, and a shared 8-byte counter tells the supervisor which case is running.

What the kernel can do to the worker, and what the supervisor makes of it:

* it dies (segfault, ``os.abort``, an extension's trap, ``os._exit``): the case in flight is a ``CRASH``
  finding, a fresh worker is started on the next case;
* it leaves the CUDA context unusable (illegal address, misaligned access, device-side assert): the
  worker sees the launch error, finds the context dead, reports ``CRASH`` for that case and exits
  (when it was checking a run of several cases as one batch, it exits without a verdict instead);
* it runs longer than its time limit (``case_timeout`` scaled by the case's size, plus a warm-up
  allowance for a config the worker has not run yet: compile and capture): ``HANG``; the worker is
  killed and replaced;
* it calls ``sys.exit()``: a ``LAUNCH_ERROR`` (``kvfence.contracts.draft.runner`` catches ``SystemExit`` like any
  launch error), the worker lives on.

A worker killed from outside (SIGKILL or SIGTERM that the supervisor did not send: the OOM killer, a
user, a chaos test) is not the kernel's fault: its case is re-run alone in a fresh worker, and only a
case that dies so ``EXTERNAL_RETRIES`` times is a ``CRASH``. When a worker dies or stalls part-way
through a ``check_many`` list, the cases whose verdicts did not come back are re-run one at a time, so
only the guilty case becomes ``CRASH`` or ``HANG``. (The worker hands a run of one config to
``Session.check_many``, one device round trip; the per-case re-run is what names the guilty case.)

What a worker prints (its stdout and stderr: a kernel's own prints, Triton's warnings, the C++ abort
text of a dying CUDA context) goes to a file of its own, not to the terminal: when the worker dies or
is killed for a hang, the last ``OUTPUT_LINES`` lines go with that case's ``CRASH`` / ``HANG`` finding
(``extra["worker_output"]``, so into its case file); a worker that ends cleanly has what it printed
copied to this process's stderr when it ends (the last ``OUTPUT_RELAYED`` bytes). A replacement worker
that was started but never used prints nothing anywhere.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Dict, List, Optional, Sequence, Union

from kvfence.contract import Launch
from kvfence.engine.findings import Finding, Kind
from kvfence.engine.interrupt import child_dies_with_parent
from kvfence.engine.worker import ProgressCounter
from kvfence.engine.workers import (
    CRASHING_AFTER,
    OUTPUT_LINES,
    SPARES,
    LostCase,
    PendingWorker,
    Wire,
    WorkerError,
    output_tail,
    signal_name,
)
from kvfence.errors import BadInput, printable, redact, require

if TYPE_CHECKING:  # annotations only: the plan's module is the front end's
    from kvfence.engine.plan import RunPlan

#: Seconds a small case may take before it is a ``HANG`` (``--case-timeout``); scaled up by case size.
DEFAULT_CASE_TIMEOUT = 5.0
#: Elements (buffer + pool + expected writes) that add one more ``case_timeout`` to a case's limit.
ELEMENTS_PER_TIMEOUT = 1 << 20
#: A config new to a worker may compile its kernel and capture graphs first: this many extra
#: ``case_timeout``s (compiling a Triton kernel for CUDA takes seconds; the interpreter compiles nothing).
WARMUP_FACTOR = {"cuda": 12.0, "cpu": 1.0}
#: Seconds a worker may take to import torch/triton and resolve the kernel before the run gives up.
START_TIMEOUT = 300.0
#: A HANG is confirmed by a second run of its case, alone in a fresh worker, with this many times its limit.
CONFIRM_FACTOR = 4.0
#: Tries when a worker is killed from outside (SIGKILL/SIGTERM it does not raise itself): starts of a
#: worker, and runs of the case it was on. Only the last death counts (a CRASH, or BadInput at start).
START_ATTEMPTS = 10
EXTERNAL_RETRIES = 3
#: A spare is sent the session's last clean case to check as soon as it is ready (compiling or loading the
#: kernel and capturing its graphs for that config), so the first case of the worker that replaces a crashed
#: one does not pay for that: while a crash is shrunk its candidates mostly share the crashing case's config.
#: Only a small case: a message of at most ``WARM_MESSAGE_BYTES`` (it waits in the socket's buffer while the
#: spare imports) and at most ``WARM_ELEMENTS`` elements of work (what a spare then holds on the device stays
#: small: spares are not counted in ``--max-gpu-mem``).
WARM_MESSAGE_BYTES = 64 * 1024
WARM_ELEMENTS = ELEMENTS_PER_TIMEOUT
#: ``_adopt``'s answer for a spare whose warm-up case did not come back clean (it is discarded, not a death).
_WARM_FAILED = "warm-up failed"
#: How often the supervisor looks at the worker's progress counter while it waits.
POLL_S = 0.2
#: Exit statuses of a process killed by a signal the kernel does not send itself.
_EXTERNAL = {-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT}


class RemoteSession:
    """The checking interface of an in-process checker (``check``, ``check_many``, ``stats``), backed by a
    worker process that checks the plan's contract (``kvfence.engine.worker``).

    ``plan``: the run's ``RunPlan`` (the worker gets it as data); ``check_many(cases)`` sends the list in one
    message and returns one findings list per case. Use as a context manager (or call ``close()``): the worker
    is stopped on exit.
    """

    def __init__(self, plan: RunPlan, *, warmup_s: Optional[float] = None, start_timeout: float = START_TIMEOUT,
                 spares: Optional[int] = None, spares_crashing: Optional[int] = None,
                 background: bool = False) -> None:
        from kvfence.engine import registry

        case_timeout = plan.case_timeout
        require(isinstance(case_timeout, (int, float)) and math.isfinite(case_timeout) and case_timeout > 0,
                f"--case-timeout must be a positive number of seconds, got {case_timeout!r}")
        record = registry.get(plan.contract)
        self.plan = plan
        self.device = plan.device
        self.kernel = plan.kernel
        self.contract = record
        self.case_timeout = float(case_timeout)
        self.warmup_s = case_timeout * WARMUP_FACTOR.get(self.device, 1.0) if warmup_s is None else float(warmup_s)
        self.start_timeout = start_timeout
        #: The contract's launches on the wire.
        self.codec = Wire(record)
        self._options = {"plan": plan.to_dict(), "loading": registry.loading(record), "device": self.device}
        self._proc: Optional[subprocess.Popen[Any]] = None
        self._conn: Optional[Connection] = None
        self._progress: Optional[ProgressCounter] = None
        self._output: Optional[BinaryIO] = None  # the file the current worker's stdout and stderr go to
        #: What the last worker killed had printed (``_kill``), for the finding of its death or hang.
        self._last_output = ""
        #: After the first crash or hang, ``spares`` replacement workers are always starting in the
        #: background (a crash is usually followed by more while Hypothesis shrinks it), oldest used
        #: first, so a restart costs what is left of a start begun earlier instead of a whole one
        #: (imports, CUDA context, kernel load from Triton's on-disk cache).
        self._spare_count = SPARES.get(self.device, 1) if spares is None else spares
        #: Spares once the session has died ``CRASHING_AFTER`` times (``crash_spares``); never fewer.
        self._crashing_spare_count = max(self._spare_count, spares_crashing or 0)
        self._spares: List[PendingWorker] = []
        self._warm: set[Any] = set()  # compiled specializations this worker has run: no warm-up allowance
        #: What a case's time limit is multiplied by (``CONFIRM_FACTOR`` while a HANG is confirmed).
        self._slack = 1.0
        #: Worker starts, deaths (a dead worker or CUDA context), HANG kills, deaths caused from outside
        #: (re-run, not reported), and cases with a verdict from a worker.
        self.counters = {"worker_starts": 0, "deaths": 0, "hangs": 0, "hangs_unconfirmed": 0, "external_kills": 0,
                         "cases": 0, "spares_used": 0, "warm_ups": 0}
        self._last_clean = None  # the last case a worker found clean: what a spare warms up on
        self._retired: Dict[str, float] = {}  # Session.stats of workers that are gone, summed
        self._live: Dict[str, float] = {}  # Session.stats of the current worker, as of its last reply
        #: Epoch seconds when the first worker said ``ready`` (the run summary's ``startup_s``).
        self.ready_at: Optional[float] = None
        self._early: Optional[PendingWorker] = None
        if background:
            # Start-up off the critical path: the worker imports torch and creates its CUDA context
            # while this process imports Hypothesis and builds its strategies; ``wait_ready()`` joins it.
            self._early = self._spawn()
        else:
            self._start()  # a kernel spec that cannot be resolved is BadInput now, before any work

    def wait_ready(self) -> None:
        """Wait for the worker started with ``background=True`` (BadInput if it cannot start)."""
        if self._proc is None:
            self._start()

    @property
    def stats(self) -> Dict[str, float]:
        """The workers' ``Session.stats`` (launches, compiles, captures, ...) summed over every worker
        this session started, plus the supervisor's ``counters``."""
        out = dict(self._retired)
        for key, value in self._live.items():
            out[key] = out.get(key, 0) + value
        out.update(self.counters)
        return out

    # -- worker lifecycle ----------------------------------------------------------------------------
    @property
    def worker_pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        # A worker killed from outside while it starts (not by its kernel import) gets one more try.
        for attempt in range(START_ATTEMPTS):
            early, self._early = self._early, None
            spare = self._spares.pop(0) if self._spares and early is None else None
            if spare is not None:
                self.counters["spares_used"] += 1
            code = self._adopt(early or spare or self._spawn())
            if isinstance(code, str):  # _WARM_FAILED
                continue  # the next spare, or a fresh worker
            if code is None:
                if self.ready_at is None:
                    self.ready_at = time.time()
                if self.counters["deaths"] + self.counters["hangs"]:
                    self._prestart()  # this session has crashed before: have the next workers starting
                return
            self.counters["external_kills" if code in _EXTERNAL else "deaths"] += 1
            if code not in _EXTERNAL or attempt == START_ATTEMPTS - 1:
                said = [line for line in self._last_output.split("\n") if line.strip()]
                last = f"; its last output: {printable(said[-1])}" if said else ""
                raise BadInput(f"the checking worker died while starting ({signal_name(code)}): "
                               f"importing kernel {self.kernel!r} kills the process{last}")

    def _prestart(self) -> None:
        """Start replacement workers now, in the background, until ``spares`` are starting or ready (or
        ``spares_crashing`` once the session has died ``CRASHING_AFTER`` times)."""
        crashing = self.counters["deaths"] + self.counters["hangs"] >= CRASHING_AFTER
        while len(self._spares) < (self._crashing_spare_count if crashing else self._spare_count):
            pending = self._spawn()
            self._send_warm(pending)
            self._spares.append(pending)

    def _send_warm(self, pending: "PendingWorker") -> None:
        """Queue the last clean case for ``pending`` to check once ready (``WARM_MESSAGE_BYTES``)."""
        if self._last_clean is None or self.codec.elements(self._last_clean) > WARM_ELEMENTS:
            return
        data = json.dumps({"op": "check", "dry": False, **self.codec.encode([self._last_clean])},
                          separators=(",", ":")).encode()
        if len(data) > WARM_MESSAGE_BYTES:
            return
        try:
            pending.conn.send_bytes(data)
        except OSError:
            return  # it died already: adopting it says so
        pending.warming = self._last_clean

    def _spawn(self) -> "PendingWorker":
        """Start a worker process; it imports, sets up its device and says ``ready`` on its own time."""
        ours, theirs = socket.socketpair()
        progress_file = tempfile.TemporaryFile()
        progress_file.truncate(8)
        output = tempfile.TemporaryFile()  # the worker's stdout and stderr (module docstring)
        env = dict(os.environ)  # the installed kvfence, as this process imports it
        try:
            proc = subprocess.Popen([sys.executable, "-m", "kvfence.engine.worker", str(theirs.fileno()),
                                     str(progress_file.fileno()), json.dumps(self._options)],
                                    pass_fds=(theirs.fileno(), progress_file.fileno()), env=env,
                                    stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                                    preexec_fn=child_dies_with_parent(signal.SIGKILL))
        finally:
            theirs.close()
        self.counters["worker_starts"] += 1
        return PendingWorker(proc, Connection(ours.detach()), ProgressCounter(progress_file), output)

    def _adopt(self, pending: "PendingWorker") -> Union[int, str, None]:
        """Make ``pending`` the worker and wait for it to be ready (and for its warm-up case, if it was sent
        one); the exit status if it died instead, ``_WARM_FAILED`` if its warm-up did not come back clean."""
        self._proc, self._conn, self._progress = pending.proc, pending.conn, pending.progress
        self._output = pending.output
        self._warm = set()
        readable = wait([self._pipe()], timeout=self.start_timeout)
        message = self._recv() if readable else None
        if message is None:
            code = self._kill()
            if not readable:
                raise BadInput(f"the checking worker did not start within {self.start_timeout:g}s")
            return code
        if message["op"] != "ready":
            self._kill()
            self._raise(message)
        if pending.warming is not None:
            return self._warmed(pending.warming)
        return None

    def _warmed(self, case: Launch[Any]) -> Optional[str]:
        """Take the reply to the warm-up case sent ahead (``_send_warm``): None when it came back clean (its
        config is warm now), ``_WARM_FAILED`` (the worker killed) when it died, hung or found anything."""
        limit = self._case_limit(case, self.warmup_s)
        message = self._recv() if wait([self._pipe()], timeout=limit) else None
        if message is None or message.get("op") != "results" or message.get("fatal") \
                or [r for r in message.get("results", [[]]) if r]:
            self._kill()
            return _WARM_FAILED
        self._warm.add(self.codec.compiled(case))
        self._live = {k: v for k, v in message.get("stats", {}).items() if isinstance(v, (int, float))}
        self.counters["warm_ups"] += 1
        return None

    def _recv(self) -> Optional[dict[str, Any]]:
        try:
            message: Optional[dict[str, Any]] = json.loads(self._pipe().recv_bytes())
            return message
        except (EOFError, OSError):
            return None

    @staticmethod
    def _raise(message: dict[str, Any]) -> None:
        if message.get("op") == "bad_input":
            raise BadInput(message["message"])
        raise WorkerError("the checking worker failed:\n" + message.get("traceback", repr(message)))

    def _pipe(self) -> Connection:
        """The running worker's end of the pipe."""
        assert self._conn is not None, "no checking worker is running"
        return self._conn

    def _counter(self) -> ProgressCounter:
        """The running worker's progress counter."""
        assert self._progress is not None, "no checking worker is running"
        return self._progress

    def _kill(self) -> Optional[int]:
        """Kill the worker (if alive) and return its exit status; what it printed is ``_last_output``."""
        for key, value in self._live.items():
            self._retired[key] = self._retired.get(key, 0) + value
        self._live = {}
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        self._last_output = self._take_output()
        return code

    def _take_output(self) -> str:
        """What the current worker printed (its file closed): after ``proc.wait()``, so nothing is left unwritten."""
        output, self._output = self._output, None
        if output is None:
            return ""
        try:
            return redact(output_tail(output))  # a URL's credentials a plug-in printed stay out of case files
        finally:
            output.close()

    def _with_output(self, finding: Finding) -> Finding:
        """``finding`` (a dead or hung worker's) with the last ``OUTPUT_LINES`` lines that worker printed."""
        lines = self._last_output.rstrip("\n").split("\n") if self._last_output.strip() else []
        if lines:
            finding.extra = dict(finding.extra, worker_output="\n".join(lines[-OUTPUT_LINES:]))
            finding.detail += f" (its last output, {min(len(lines), OUTPUT_LINES)} lines, is in the case file)"
        return finding

    def close(self) -> None:
        """Stop the worker: closing the pipe ends its loop; a worker stuck in a kernel is killed."""
        spares, self._spares = self._spares + ([self._early] if self._early else []), []
        self._early = None
        for spare in spares:
            spare.kill()
        proc = self._proc
        if proc is None:
            return
        self._pipe().close()
        self._conn = None
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            pass
        self._kill()
        if self._last_output.strip():  # a worker that ended cleanly: what it printed is not lost
            text = "\n".join(printable(line, None) for line in self._last_output.rstrip("\n").split("\n"))
            sys.stderr.write("kvfence: the checking worker printed:\n" + text + "\n")
            sys.stderr.flush()

    def __enter__(self) -> "RemoteSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- checking --------------------------------------------------------------------------------------
    def _run_limit(self, cases: Sequence[Any], first: int) -> float:
        """Seconds for the run of one config that starts at ``first`` (the worker checks such a run as
        one batch and moves its progress counter once): the sum of its cases' limits, times ``_slack``."""
        head = self.codec.group(cases[first])
        total, i = 0.0, first
        while i < len(cases) and self.codec.group(cases[i]) == head:
            total += self._limit(cases[i]) if i == first else self._case_limit(cases[i])
            i += 1
        return total * self._slack

    def _case_limit(self, case: Launch[Any], warmup: float = 0.0) -> float:
        """Seconds ``case`` may run: ``case_timeout`` per started ``ELEMENTS_PER_TIMEOUT`` elements of its work
        (the codec's measure), plus ``warmup``."""
        return self.case_timeout * (1 + self.codec.elements(case) // ELEMENTS_PER_TIMEOUT) + warmup

    def _limit(self, case: Launch[Any]) -> float:
        warm = self.codec.compiled(case) in self._warm
        return self._case_limit(case, 0.0 if warm else self.warmup_s)

    def round_trip(self, cases: Sequence[Any]) -> None:
        """Send ``cases`` and get empty verdicts back without running them: what ``check_many`` adds to
        the checking itself (JSON both ways, the socket, rebuilding each case in the worker).
        For ``benchmarks/worker_ipc.py``."""
        self._exchange(cases, dry=True)

    def _exchange(self, cases: Sequence[Any], dry: bool = False) -> List[List[Finding]]:
        """One message to the worker; the verdicts of a prefix of ``cases`` (all, unless one was fatal).

        Raises ``LostCase`` when the worker dies or hangs before replying (its results are lost).
        """
        if self._proc is None:
            self._start()
        self._counter().value = 0
        try:
            message = {"op": "check", "dry": dry, **self.codec.encode(cases)}
            self._pipe().send_bytes(json.dumps(message, separators=(",", ":")).encode())
        except OSError:
            pass  # the worker is already dead: the wait below says so
        try:
            message = self._await(cases)
        except LostCase:
            raise
        except BaseException:
            # Interrupted while waiting (a signal): the reply still on its way would be read as the
            # next list's. The worker's state is unknown, so it goes; the next call starts a fresh one.
            self._kill()
            raise
        if message["op"] != "results":
            self._raise(message)
        for case in cases[:len(message["results"])]:
            self._warm.add(self.codec.compiled(case))
        self._live = {k: v for k, v in message.get("stats", {}).items() if isinstance(v, (int, float))}
        if message["fatal"]:
            self.counters["deaths"] += 1
            self._prestart()
            self._kill()
        self.counters["cases"] += len(message["results"])
        kinds = getattr(self.codec, "kinds", ())
        out = [[Finding.from_dict(f, kinds) for f in findings] for findings in message["results"]]
        for case, findings in zip(cases, out):
            if not findings and not dry:
                self._last_clean = case
        if message["fatal"] and out:  # the last case lost the CUDA context: its CRASH gets the worker's output
            out[-1] = [self._with_output(f) if f.kind is Kind.CRASH else f for f in out[-1]]
        return out

    def _await(self, cases: Sequence[Any]) -> dict[str, Any]:
        """The worker's reply to the list in flight; ``LostCase`` if it dies or stalls on a case first."""
        started, clock, limit = 0, time.monotonic(), 0.0
        while True:
            if wait([self._pipe()], timeout=POLL_S):
                message = self._recv()
                if message is not None:
                    break
                # End of file: the worker died without a reply.
                index = max(self._counter().value - 1, 0)
                self._prestart()  # the replacement starts while this one is reaped
                code = self._kill()
                assert code is not None  # a worker was running: _kill reaped it
                external = code in _EXTERNAL
                self.counters["external_kills" if external else "deaths"] += 1
                detail = f"the checking worker died with {signal_name(code)} during this launch"
                if external:
                    detail += (f" (a signal the kernel does not raise itself: it died so in each of "
                               f"{EXTERNAL_RETRIES} runs of this case alone)")
                raise LostCase(index, self._with_output(Finding(Kind.CRASH, "kernel", "launch", detail=detail)),
                            external)
            now = time.monotonic()
            if self._counter().value != started:
                started, clock = self._counter().value, now
                limit = self._run_limit(cases, started - 1)
            if started and now - clock > limit:
                self._prestart()
                self._kill()
                self.counters["hangs"] += 1
                index = started - 1
                detail = (f"no verdict after {now - clock:.1f}s (limit {limit:.1f}s: --case-timeout "
                          f"{self.case_timeout:g}s scaled by the case's size): the worker was killed")
                raise LostCase(index, self._with_output(Finding(Kind.HANG, "kernel", "launch", detail=detail)), False)
        return message

    def _check_alone(self, case: Launch[Any]) -> List[Finding]:
        """One case in its own message: a death is this case's ``CRASH`` (after one retry if external). A hang
        is a finding only once confirmed: the case runs again, alone, in a fresh worker (whose first launch
        of a config has the warm-up allowance for compiling), with ``CONFIRM_FACTOR`` times its limit; a case
        that then passes was slow on a loaded machine, not hung."""
        attempt, first_hang = 1, None
        while True:
            try:
                self._slack = CONFIRM_FACTOR if first_hang is not None else 1.0
                return self._exchange([case])[0]
            except LostCase as lost:
                if lost.finding.kind is Kind.HANG:
                    if first_hang is None:
                        first_hang = lost.finding
                        self.counters["hangs_unconfirmed"] += 1
                        continue
                    lost.finding.detail = f"{first_hang.detail}; again alone in a fresh worker: {lost.finding.detail}"
                    return [lost.finding]
                if not lost.external or attempt >= EXTERNAL_RETRIES:
                    return [lost.finding]
            finally:
                self._slack = 1.0
            attempt += 1

    def check(self, case: Launch[Any]) -> List[Finding]:
        """The findings of one case (``CRASH`` / ``HANG`` when the worker died or stalled on it)."""
        return self._check_alone(case)

    #: ``check_many`` takes ``enough`` (``kvfence.engine.loop`` asks before passing it).
    STOPS_EARLY = True

    def check_many(self, cases: Sequence[Any], enough: Optional[Callable[[List[Finding]], bool]] = None,
                   one_at_a_time: bool = False) -> List[Optional[List[Finding]]]:
        """One findings list per case, sent to the worker as one message.

        If the worker dies or stalls part-way, the cases without a verdict are re-run one at a time, so
        only the guilty case is reported as ``CRASH`` (or ``HANG``: a stalled case then waits out its
        time limit twice). ``enough(findings)``, when given, is asked after each of those one-case runs:
        once it is true the cases still without a verdict keep none (None). Each one-case run after a
        crash costs a worker restart, so a caller that needs only a first failure, or whose budget is
        spent, pays for no more restarts than that (a batch whose every case crashes: two, not one per case).

        ``one_at_a_time`` sends each case in a message of its own from the start (with ``enough`` asked
        after each): a crashing case then costs one restart, not two (the list's death, then its re-run
        alone). For lists that are likely to crash: the candidates of a ``CRASH`` being shrunk.
        """
        cases = list(cases)
        results: List[Optional[List[Finding]]] = [None] * len(cases)
        if one_at_a_time:
            for j, case in enumerate(cases):
                results[j] = alone = self._check_alone(case)
                if enough is not None and enough(alone):
                    break
            return results
        i = 0
        while i < len(cases):
            try:
                done = self._exchange(cases[i:])
            except LostCase:
                # Which case did it is certain only when it ran alone (the worker may batch a run of
                # one config into one launch sequence): every case without a verdict runs alone now.
                for j in range(i, len(cases)):
                    if results[j] is None:
                        results[j] = alone = self._check_alone(cases[j])
                        if enough is not None and enough(alone):
                            break
                break
            results[i:i + len(done)] = done
            i += len(done)
        return results

