"""``--engine ray``: one Ray task per shard (the optional extra ``pip install "kvfence[ray]"``).

Each shard is one task asking for ``num_gpus`` (fractional packs shards on a card; Ray sets the task's
``CUDA_VISIBLE_DEVICES``) in a fresh worker process (``max_calls=1``), and the task runs the shard as its own
``python -m kvfence fuzz`` child under a timeout (``kvfence.campaign.task``): a poisoned CUDA context never meets
the next shard. The task writes into a temporary folder on its node and returns the folder packed, so the nodes
share no disk but the example database (Redis, or a directory on shared storage).

Retries: a task whose worker or node is lost (``WorkerCrashedError``, ``NodeDiedError``, an OOM kill: Ray's
*system* failures, ``INFRASTRUCTURE_FAILURES``) is submitted again by this driver, up to ``max_retries`` times, and
the shard's row counts its ``attempts`` and says what was lost (``retried_for``). The shard's own result (clean,
findings, a CRASH or HANG case, a timeout, bad input) is a value the task returns, never an exception, so it is never
retried away (``retry_exceptions=False``: a bug in the task itself is reported, not retried). The shared database lets a
retried shard replay any failure its lost attempt had stored. Ctrl-C cancels the pending and running tasks
(``ray.cancel(force=True)``: the worker is killed and its shard child dies with it) and keeps what finished.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import ray
import ray.exceptions

from kvfence.campaign.shards import ShardSpec
from kvfence.campaign.task import pack, row, run_command, run_shard, unpack
from kvfence.engine.interrupt import signals_interrupt
from kvfence.errors import BadInput, require

#: Seconds between looks at the tasks (the progress line is printed as each shard ends).
POLL_S = 0.5


def connect(address: str) -> bool:
    """``auto`` (the running cluster: ``RAY_ADDRESS`` or the one ``ray start`` left on this node), ``local`` (a new
    cluster of this machine), ``ray://HOST:10001`` (Ray Client) or ``HOST:PORT`` (a head node's GCS)."""
    if ray.is_initialized():
        return False  # the caller's own (the Python API, the tests): left as it is
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR, include_dashboard=False,
                 configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BadInput(f"--address {address}: cannot connect to a Ray cluster ({' '.join(str(exc).split())[:200]})"
                       ) from None
    return True


def disconnect(owned: bool) -> None:
    """Leave the cluster ``connect`` joined or started (``owned``); one the caller had joined stays."""
    if owned and ray.is_initialized():
        ray.shutdown()


def check_resources(specs: List[ShardSpec], cpus: float) -> None:
    """A shard asking for more GPUs or CPUs than the whole cluster has would wait forever: one line, exit 2."""
    have = ray.cluster_resources()
    need_gpus = max(s.gpus for s in specs)
    require(need_gpus <= have.get("GPU", 0.0),
            f"--gpus-per-shard {need_gpus:g}: the Ray cluster has {have.get('GPU', 0.0):g} GPU(s) "
            "(--device cpu shards need none: --gpus-per-shard 0)")
    require(cpus <= have.get("CPU", 0.0), f"--cpus-per-shard {cpus:g}: the Ray cluster has {have.get('CPU', 0.0):g} "
                                          "CPU(s)")


def _shard_task(spec_doc: dict, cwd: str) -> dict:
    """In the Ray worker: run the shard into a temporary folder, return its row and its folder packed."""
    spec = ShardSpec.from_dict(spec_doc)
    if os.path.isdir(cwd):
        os.chdir(cwd)  # plug-in paths and relative folders mean what they meant where the campaign was started
    with tempfile.TemporaryDirectory(prefix="kvfence-shard-") as tmp:
        folder = Path(tmp) / spec.name
        result = run_shard(spec, folder)
        result["files"] = pack(folder)
    return result


def _command_task(cmd: List[str], name: str, timeout_s: float, cwd: str) -> dict:
    """In the Ray worker: a follow-up command (compute-sanitizer on a case) into a temporary folder."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
    with tempfile.TemporaryDirectory(prefix="kvfence-follow-up-") as tmp:
        folder = Path(tmp) / name
        result = run_command(cmd, folder, timeout_s)
        result["files"] = pack(folder)
    return result


#: Ray's failures of the infrastructure, not of the shard: the task is submitted again (``--max-retries``).
INFRASTRUCTURE_FAILURES = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                           ray.exceptions.OutOfMemoryError, ray.exceptions.ObjectLostError,
                           ray.exceptions.LocalRayletDiedError, ray.exceptions.RaySystemError)


def _failed(spec: ShardSpec, exc: Exception, start: float, attempts: int, retried: List[str]) -> dict:
    if isinstance(exc, ray.exceptions.TaskCancelledError):
        status, note = "cancelled", "cancelled: the campaign was interrupted"
    elif isinstance(exc, INFRASTRUCTURE_FAILURES):
        status, note = "lost", f"{type(exc).__name__} on each of its {attempts} attempt(s)"
    else:  # the task itself raised (a bug in kvfence's task, not the shard's result): reported, not retried
        status, note = "error", f"the shard's task raised {type(exc).__name__}: {' '.join(str(exc).split())[-300:]}"
    result = row(spec, status=status, exit_code=None, summary=None, gpu=None, wall_s=time.perf_counter() - start,
                 host="?", note=note)
    return dict(result, attempts=attempts, retried_for=retried)


class _Shards:
    """The campaign's tasks in flight: each shard's current task, its attempts and why earlier ones were lost."""

    def __init__(self, specs: List[ShardSpec], cpus: float, retries: int):
        self.remote = ray.remote(max_calls=1)(_shard_task)
        self.cpus, self.retries, self.cwd = cpus, retries, os.getcwd()
        self.start = time.perf_counter()
        self.spec: Dict[object, ShardSpec] = {}
        self.attempts: Dict[str, int] = {}
        self.retried: Dict[str, List[str]] = {}
        for spec in specs:
            self.submit(spec)

    def submit(self, spec: ShardSpec) -> None:
        # max_retries=0: this driver retries (and counts) infrastructure failures itself; retry_exceptions=False
        # anyway, so nothing the shard returns is ever run again.
        ref = self.remote.options(num_gpus=spec.gpus, num_cpus=self.cpus, max_retries=0, retry_exceptions=False,
                                  name=f"kvfence-{spec.name}").remote(spec.to_dict(), self.cwd)
        self.spec[ref] = spec
        self.attempts[spec.name] = self.attempts.get(spec.name, 0) + 1
        self.retried.setdefault(spec.name, [])

    def collect(self, ref, out: Path, *, retry: bool = True) -> Optional[dict]:
        """The shard's row, or ``None`` when its task was lost to the infrastructure and submitted again."""
        spec = self.spec.pop(ref)
        attempts, retried = self.attempts[spec.name], self.retried[spec.name]
        try:
            result = ray.get(ref)
        except ray.exceptions.RayError as exc:
            if retry and isinstance(exc, INFRASTRUCTURE_FAILURES) and attempts <= self.retries:
                retried.append(f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
                self.submit(spec)
                return None
            return _failed(spec, exc, self.start, attempts, retried)
        unpack(result.pop("files"), out / "shards" / spec.name)
        return dict(result, attempts=attempts, retried_for=retried)


def run_ray(specs: List[ShardSpec], out: Path, *, cpus: float, retries: int,
            on_row: Callable[[dict], None]) -> tuple:
    """Run every shard as a Ray task; unpack each into ``OUT/shards/<name>``; return ``(rows, interrupted)``."""
    shards = _Shards(specs, cpus, retries)
    rows: List[dict] = []
    interrupted = None
    try:
        with signals_interrupt():
            while shards.spec:
                done, _ = ray.wait(list(shards.spec), num_returns=1, timeout=POLL_S)
                for ref in done:
                    result = shards.collect(ref, out)
                    if result is not None:
                        rows.append(result)
                        on_row(result)
    except KeyboardInterrupt as exc:  # ours (Interrupted), or Ray's own when the signal lands inside ray.wait
        interrupted = getattr(exc, "signal_name", "SIGINT")
        for ref in list(shards.spec):
            ray.cancel(ref, force=True)
        for ref in list(shards.spec):
            collected = shards.collect(ref, out, retry=False)
            assert collected is not None  # without a retry a lost task is a failed row, not None
            rows.append(collected)
            on_row(collected)
    return rows, interrupted


def run_follow_ups(commands: List[tuple], out: Path, *, gpus: float, cpus: float, timeout_s: float) -> List[dict]:
    """``(name, cmd)`` follow-ups (compute-sanitizer on a CRASH or HANG case), one task each, unpacked into
    ``OUT/sanitizer/<name>``."""
    remote = ray.remote(max_calls=1)(_command_task)
    refs = {remote.options(num_gpus=gpus, num_cpus=cpus, max_retries=1, retry_exceptions=False)
            .remote(cmd, name, timeout_s, os.getcwd()): name for name, cmd in commands}
    results = []
    for ref, name in refs.items():
        try:
            result = ray.get(ref)
        except ray.exceptions.RayError as exc:
            results.append({"name": name, "status": "lost", "exit": None, "note": type(exc).__name__})
            continue
        unpack(result.pop("files"), out / "sanitizer" / name)
        results.append(result)
    return results
