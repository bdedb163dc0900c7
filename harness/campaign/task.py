"""One shard: a ``python -m kvfence fuzz ... --out DIR`` child under a timeout, and its row of the ``shards`` table.

The child is a fresh process (a crashed or hung kernel, a poisoned CUDA context, leaked memory never reaches the
next shard); it dies with whoever runs it (``child_dies_with_parent``: a killed Ray worker or a killed
``campaign`` takes its shard with it, so a retried shard never races a ghost of itself). A shard past its timeout
gets SIGTERM (a ``fuzz`` run writes its outputs on it), then SIGKILL after ``STOP_WAIT_S``.

What a shard's exit means (``status``): ``clean`` (0), ``findings`` (1 with findings), ``problems`` (1 without
findings: a job of the shard ended abnormally), ``bad-input`` (2), ``interrupted`` (a signal; its outputs written),
``timeout`` (its timeout ran out), ``died`` (anything else, e.g. killed without a summary). Findings, CRASH and HANG
cases are the shard's result, never a reason to run it again; only an engine's infrastructure failure (a lost
worker or node) is retried, by the engine.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, Optional

from kvfence.campaign.shards import ShardSpec
from kvfence.engine.interrupt import child_dies_with_parent

#: Seconds a shard gets between SIGTERM and SIGKILL (``fuzz`` writes its summary and reports in between).
STOP_WAIT_S = 30.0
#: The shard's own log, beside its outputs.
LOG_NAME = "shard.log"
#: Exit codes of a ``fuzz`` run stopped by a signal that still wrote its outputs (SIGINT, SIGTERM).
SIGNALLED_EXITS = (130, 143, -signal.SIGINT, -signal.SIGTERM)


def packed_budget(spec: ShardSpec) -> list:
    """``--max-gpu-mem`` for a shard packed on a card with others (``0 < gpus < 1``) that sets none: its share
    (``gpus``) of ``fuzz``'s default fraction of the card's free memory, so K shards on a card take what one
    ``fuzz`` would instead of K times it. Asked of ``nvidia-smi`` (never a CUDA context in this process); none
    where there is none (the shard then takes fuzz's own default) or the shard runs on the CPU."""
    argv = list(spec.argv)
    device = argv[argv.index("--device") + 1] if "--device" in argv else "auto"
    if not 0 < spec.gpus < 1 or "--max-gpu-mem" in argv or device == "cpu" or shutil.which("nvidia-smi") is None:
        return []
    from kvfence.engine.budget import DEFAULT_FRACTION, free_device_memory

    return ["--max-gpu-mem", str(int(free_device_memory() * DEFAULT_FRACTION * spec.gpus))]


def fuzz_command(spec: ShardSpec, out: Path) -> list:
    return [sys.executable, "-m", "kvfence", "fuzz", *spec.argv, *packed_budget(spec), "--out", str(out)]


def _read_summary(out: Path) -> Optional[dict]:
    try:
        doc = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def status_of(code: Optional[int], summary: Optional[dict], timed_out: bool) -> str:
    """The shard's status from its exit code, its summary (``None``: none written) and whether it timed out."""
    if timed_out:
        return "timeout"
    if summary is not None and code in SIGNALLED_EXITS:
        return "interrupted"
    if code == 0 and summary is not None:
        return "clean"
    if code == 1 and summary is not None:
        return "findings" if summary.get("findings") else "problems"
    if code == 2:
        return "bad-input"
    return "died"


def _log_tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def row(spec: ShardSpec, *, status: str, exit_code: Optional[int], summary: Optional[dict], gpu: Optional[str],
        wall_s: float, host: Optional[str] = None, note: str = "") -> dict:
    """The shard's row of the merged summary's ``shards`` table."""
    return {"shard": spec.name, "target": spec.target, "label": spec.label, "index": spec.index, "count": spec.count,
            "seed": spec.seed, "seed_block": f"seed {spec.seed} shard {spec.index}/{spec.count} (Hypothesis seed "
                                             f"{spec.seed * spec.count + spec.index - 1})",
            "host": host or socket.gethostname(), "gpu": gpu, "status": status, "exit": exit_code,
            "examples": (summary or {}).get("examples", 0), "findings": len((summary or {}).get("findings", [])),
            "wall_s": round(wall_s, 3), "note": note, "attempts": 1, "retried_for": []}


def run_shard(spec: ShardSpec, out: Path, *, gpu: Optional[str] = None, on_start=None) -> dict:
    """Run ``spec`` into ``out`` (created); ``gpu``: the ``CUDA_VISIBLE_DEVICES`` it gets (``None``: this process's
    own, e.g. the one Ray set). ``on_start(proc)`` sees the child (the local engine signals it on Ctrl-C)."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the child's --device decides (kvfence.device)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    visible = env.get("CUDA_VISIBLE_DEVICES") or None
    log_path = out / LOG_NAME
    start = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(fuzz_command(spec, out), stdout=log, stderr=subprocess.STDOUT, env=env,
                                preexec_fn=child_dies_with_parent(signal.SIGTERM))
        if on_start is not None:
            on_start(proc)
        try:
            code = proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
    summary = _read_summary(out)
    status = status_of(code, summary, timed_out)
    note = f"no result within its {spec.timeout_s:g} s timeout: stopped" if timed_out else (
        "" if status in ("clean", "findings", "interrupted") else _log_tail(log_path))
    return row(spec, status=status, exit_code=code, summary=summary, gpu=visible,
               wall_s=time.perf_counter() - start, note=note)


def pack(folder: Path) -> bytes:
    """A shard's output folder as a gzip'd tar (a Ray task returns it: the worker's disk need not be shared)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(str(folder), arcname=".")
    return buffer.getvalue()


def unpack(blob: bytes, folder: Path) -> None:
    """``pack``'s bytes into ``folder``: regular files and folders only, each inside ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        tar.extractall(str(folder), filter="data")


def shard_folders(out: Path) -> Dict[str, Path]:
    return {p.name: p for p in sorted((out / "shards").glob("t*-s*-of-*")) if p.is_dir()}


def run_command(cmd: list, folder: Path, timeout_s: float) -> dict:
    """A follow-up command (``kvfence sweep --cases ...`` under compute-sanitizer) into ``folder``, under a timeout;
    its exit code and last log line."""
    folder.mkdir(parents=True, exist_ok=True)
    log_path = folder / LOG_NAME
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*cmd, "--out", str(folder)], stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=child_dies_with_parent(signal.SIGTERM))
        try:
            code, timed_out = proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            proc.kill()
            code, timed_out = proc.wait(), True
    return {"name": folder.name, "host": socket.gethostname(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES") or None,
            "status": "timeout" if timed_out else {0: "clean", 1: "findings", 2: "bad-input"}.get(code, "died"),
            "exit": code, "wall_s": round(time.perf_counter() - start, 3), "note": _log_tail(log_path)}
