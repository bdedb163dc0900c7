"""``--engine ray``: one Ray task per shard (the optional extra ``pip install "kvfence[ray]"``).

Each shard is one task asking for ``num_gpus`` (fractional packs shards on a card; Ray sets the task's
``CUDA_VISIBLE_DEVICES``) in a fresh worker process (``max_calls=1``), and the task runs the shard as its own
``python -m kvfence fuzz`` child under a timeout (``kvfence.campaign.task``): a poisoned CUDA context never meets
the next shard. The task writes into a temporary folder on its node and returns the folder packed, so the nodes
share no disk but the example database (Redis, or a directory on shared storage).

Retries: a task whose worker or node is lost (``WorkerCrashedError``, ``NodeDiedError``, an OOM kill: Ray's
*system* failures) is run again, up to ``max_retries`` times; the shard's own result (clean, findings, a CRASH or
HANG case, a timeout, bad input) is a value the task returns, never an exception, so it is never retried away
(``retry_exceptions=False``: a bug in the task itself is reported, not retried). The shared database lets a
retried shard replay any failure its lost attempt had stored. Ctrl-C cancels the pending and running tasks
(``ray.cancel(force=True)``: the worker is killed and its shard child dies with it) and keeps what finished.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import ray
import ray.exceptions

from kvfence.campaign.shards import ShardSpec
from kvfence.campaign.task import pack, row, run_command, run_shard, unpack
from kvfence.engine.interrupt import Interrupted, signals_interrupt
from kvfence.errors import BadInput, require

#: Seconds between looks at the tasks (the progress line is printed as each shard ends).
POLL_S = 0.5


def connect(address: str) -> bool:
    """``auto`` (the running cluster: ``RAY_ADDRESS`` or the one ``ray start`` left on this node), ``local`` (a new
    cluster of this machine), ``ray://HOST:10001`` (Ray Client) or ``HOST:PORT`` (a head node's GCS)."""
    if ray.is_initialized():
        return False  # the caller's own (the Python API, the tests): left as it is
    target = None if address == "local" else address
    try:
        ray.init(address=target, log_to_driver=False, logging_level="ERROR", include_dashboard=False,
                 configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BadInput(f"--address {address}: cannot connect to a Ray cluster ({' '.join(str(exc).split())[:200]})"
                       ) from None
    return True


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


def _failed(spec: ShardSpec, exc: Exception, start: float) -> dict:
    if isinstance(exc, ray.exceptions.TaskCancelledError):
        status, note = "cancelled", "cancelled: the campaign was interrupted"
    elif isinstance(exc, ray.exceptions.RayTaskError):
        status, note = "error", f"the shard's task raised: {' '.join(str(exc).split())[-300:]}"
    else:  # a lost worker or node, after its retries
        status, note = "lost", f"{type(exc).__name__} after its retries: {' '.join(str(exc).split())[:300]}"
    return row(spec, status=status, exit_code=None, summary=None, gpu=None, wall_s=time.perf_counter() - start,
               host="?", note=note)


def run_ray(specs: List[ShardSpec], out: Path, *, cpus: float, retries: int,
            on_row: Callable[[dict], None]) -> tuple:
    """Run every shard as a Ray task; unpack each into ``OUT/shards/<name>``; return ``(rows, interrupted)``."""
    remote = ray.remote(max_calls=1)(_shard_task)
    start = time.perf_counter()
    cwd = os.getcwd()
    refs: Dict[object, ShardSpec] = {
        remote.options(num_gpus=spec.gpus, num_cpus=cpus, max_retries=retries, retry_exceptions=False,
                       name=f"kvfence-{spec.name}").remote(spec.to_dict(), cwd): spec for spec in specs}
    pending = list(refs)
    rows: List[dict] = []
    interrupted = None
    try:
        with signals_interrupt():
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
                for ref in done:
                    rows.append(_collect(ref, refs[ref], out, start))
                    on_row(rows[-1])
    except Interrupted as exc:
        interrupted = exc.signal_name
        for ref in pending:
            ray.cancel(ref, force=True)
        for ref in pending:
            rows.append(_collect(ref, refs[ref], out, start))
            on_row(rows[-1])
    return rows, interrupted


def _collect(ref, spec: ShardSpec, out: Path, start: float) -> dict:
    try:
        result = ray.get(ref)
    except ray.exceptions.RayError as exc:
        return _failed(spec, exc, start)
    unpack(result.pop("files"), out / "shards" / spec.name)
    return result


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
