"""A checking worker's process as the supervisor sees it (``kvfence.engine.supervisor``): the contract's launches
on its wire, a worker started ahead (a spare), how many spares a crashing run keeps, the tail of what a worker
printed, and how a worker ended, in words.
"""

from __future__ import annotations

import os
import signal
import subprocess
from functools import lru_cache
from multiprocessing.connection import Connection
from typing import Any, BinaryIO, Dict, Sequence, Tuple

from kvfence import device as host
from kvfence.contract import Contract, Launch
from kvfence.engine import launch as launches
from kvfence.engine.findings import Finding
from kvfence.engine.worker import EXIT_PLUGIN_INTERRUPT, ProgressCounter

#: Replacement workers kept starting once a session has seen a crash or hang (``RemoteSession(spares=)``):
#: on CUDA a start (torch import, CUDA context, kernel load) takes about 4.5 s and a crash with a spare
#: ready costs about 0.8 s (``benchmarks/worker_restart.py``), so while Hypothesis shrinks a crash (one
#: death per crashing candidate) the spares decide its pace: ``k`` of them sustain about ``k`` restarts per
#: start time. The host has the cores; each idle spare holds a CUDA context.
SPARES = {"cuda": 2, "cpu": 1}
#: Spares at most once a session has died ``CRASHING_AFTER`` times (a crash being shrunk, or ``--keep-going``
#: over a kernel that keeps crashing): a crash then comes about every second (its verdict, then the next
#: candidate's first case in a fresh worker), faster than two starts of about 3.5 s can follow, so more
#: spares keep the restarts at about that second. Each spare is a process starting (CPU bound): a session
#: gets more than ``SPARES`` only where its share of the host's cores has room (``crash_spares``).
CRASH_SPARES = {"cuda": 4, "cpu": 1}
CRASHING_AFTER = 2
#: Lines of a dead or hung worker's output kept with its case's finding (``extra["worker_output"]``).
OUTPUT_LINES = 40
#: Bytes of a worker's output read back at most: the tail kept with a finding, or relayed when it ends.
OUTPUT_RELAYED = 64 * 1024
def crash_spares(device: str, jobs: int = 1) -> int:
    """Spares for a session that keeps crashing, one of ``jobs`` sessions on this host: its share of the
    usable cores (``kvfence.device.usable_cores``), between ``SPARES`` and ``CRASH_SPARES``."""
    base = SPARES.get(device, 1)
    return max(base, min(CRASH_SPARES.get(device, base), host.usable_cores() // max(1, jobs)))


class WorkerError(RuntimeError):
    """kvfence itself failed inside the worker (not the kernel): carries the worker's traceback."""


def signal_name(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    if code == EXIT_PLUGIN_INTERRUPT:
        return (f"exit status {code} (a KeyboardInterrupt raised by the kernel or a plug-in: the worker ignores "
                "SIGINT, so none comes from the keyboard)")
    return f"exit status {code}"


class PendingWorker:
    """A worker process that was started and may not be ready yet: its pipe, progress counter and the
    file its stdout and stderr go to."""

    def __init__(self, proc: subprocess.Popen[Any], conn: Connection, progress: ProgressCounter,
                 output: BinaryIO) -> None:
        self.proc, self.conn, self.progress, self.output = proc, conn, progress, output
        self.warming = None  # the case sent ahead for it to check once ready (``RemoteSession._prestart``)

    def kill(self) -> None:
        """Stop a worker that was never used: what it printed (imports only) is dropped."""
        self.conn.close()
        self.progress.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.output.close()


def output_tail(output: BinaryIO) -> str:
    """The last ``OUTPUT_RELAYED`` bytes a worker wrote to ``output``, as text (bytes that are not UTF-8
    replaced; the JSON of a case file and the reports escape what is left)."""
    size = output.seek(0, os.SEEK_END)
    output.seek(max(0, size - OUTPUT_RELAYED))
    text = output.read().decode("utf-8", "replace")
    if size > OUTPUT_RELAYED:
        text = f"[{size - OUTPUT_RELAYED} bytes before left out]\n" + text.split("\n", 1)[-1]
    return text


class LostCase(Exception):
    """The worker gave no verdict for the case at ``index`` of the list in flight."""

    def __init__(self, index: int, finding: Finding, external: bool):
        self.index = index
        self.finding = finding
        self.external = external  # killed from outside: worth one more try


class Wire:
    """A contract's launches on the worker's wire: each as its JSON record (``kvfence.engine.launch.to_record``),
    with the run of one config it belongs to (the worker checks such a run in one device round trip); how much
    work a launch is (its time limit scales with it) and what its compiled specialization is (a new one gets
    the warm-up allowance)."""

    #: Elements of an output table weigh this much beside an input's: the plain-Python oracle builds each.
    OUTPUT_WEIGHT = 4

    def __init__(self, record: Contract[Any]) -> None:
        self.record = record
        self.kinds = tuple(k.name for k in record.kinds)
        # A batch's launches (a few hundred at most): a larger cache only keeps old cases alive for the collector.
        self._keys = lru_cache(maxsize=512)(lambda x: launches.keys(record, x))

    def encode(self, cases: Sequence[Launch[Any]]) -> dict[str, Any]:
        ids: Dict[object, int] = {}
        return {"launches": [launches.to_record(self.record, x) for x in cases],
                "groups": [ids.setdefault(self.group(x), len(ids)) for x in cases]}

    def group(self, launch: Launch[Any]) -> Tuple[Any, ...]:
        return launch.kernel, launch.sizing, launch.mode, launch.layout, self._keys(launch).config

    def compiled(self, launch: Launch[Any]) -> Tuple[Any, ...]:
        found = self._keys(launch)
        return launch.kernel, launch.mode, found.compile if found.compile is not None else found.config

    def elements(self, launch: Launch[Any]) -> int:
        return sum((t.rows or 1) * t.width * (self.OUTPUT_WEIGHT if t.role == "output" else 1)
                   for t in self.record.tables(launch))
