"""``--engine local``: a campaign's shards as processes on this host, at most ``parallel`` at a time.

Placement is ``--jobs``'s: on CUDA each running shard holds one GPU slot (``gpu_slots``: each visible GPU, honouring a
``CUDA_VISIBLE_DEVICES`` the user set, once per shard it may hold: ``--gpus-per-shard 0.5`` packs two shards on a
card); on the CPU shards get no GPU. Ctrl-C (or SIGTERM) stops the running shards (each writes its outputs) and
starts no new one.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Dict, List, Optional

from kvfence.campaign.shards import ShardSpec
from kvfence.campaign.task import STOP_WAIT_S, row, run_shard
from kvfence.engine.interrupt import signals_interrupt
from kvfence.errors import require

#: Seconds the running shards get to stop on their own after a Ctrl-C before they are signalled.
INTERRUPT_GRACE_S = 2.0


def gpu_slots(gpus: List[str], per_shard: float) -> List[Optional[str]]:
    """The GPU each concurrently running shard may take: every card ``floor(1 / per_shard)`` times."""
    if not gpus or per_shard == 0:
        return []
    require(0 < per_shard <= 1, f"--gpus-per-shard {per_shard:g}: --engine local gives a shard at most one GPU "
                                "(use --engine ray for shards spanning several)")
    return [g for g in gpus for _ in range(int(1 / per_shard + 1e-9))]


def run_local(specs: List[ShardSpec], out: Path, *, parallel: int, slots: List[Optional[str]],
              on_row: Callable[[dict], None]) -> tuple:
    """Run every shard into ``OUT/shards/<name>``; return ``(rows, interrupted)`` (``interrupted``: the signal's
    name). ``on_row(row)`` is called as each shard ends (the progress line)."""
    free: "queue.Queue[Optional[str]]" = queue.Queue()
    for slot in slots or [None] * parallel:
        free.put(slot)
    width = min(parallel, len(slots)) if slots else parallel
    stopping = threading.Event()
    live: Dict[str, subprocess.Popen] = {}  # shard name -> its child process (run_shard's on_start)

    def one(spec: ShardSpec) -> dict:
        if stopping.is_set():
            return row(spec, status="cancelled", exit_code=None, summary=None, gpu=None, wall_s=0.0,
                       note="not started: the campaign was interrupted")
        slot = free.get()
        try:
            return run_shard(spec, out / "shards" / spec.name, gpu=slot,
                             on_start=lambda proc: live.__setitem__(spec.name, proc))
        finally:
            live.pop(spec.name, None)
            free.put(slot)

    rows: List[dict] = []
    interrupted = None
    with ThreadPoolExecutor(max_workers=max(1, width)) as pool:
        futures = {pool.submit(one, spec) for spec in specs}
        try:
            with signals_interrupt():
                while futures:
                    done, futures = wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
                    for future in done:
                        rows.append(future.result())
                        on_row(rows[-1])
        except KeyboardInterrupt as exc:  # ours (Interrupted), or Ray's own when the signal lands inside its calls
            interrupted = getattr(exc, "signal_name", "SIGINT")
            stopping.set()
            # A Ctrl-C in a terminal reaches the shards too (one process group): a second signal would cut their
            # own summary short, so only those still running after INTERRUPT_GRACE_S are asked (SIGINT).
            deadline = time.monotonic() + INTERRUPT_GRACE_S
            while time.monotonic() < deadline and any(p.poll() is None for p in list(live.values())):
                time.sleep(0.1)
            for proc in list(live.values()):
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)  # it ends as an interrupted fuzz run: its outputs written
            for future in futures:
                rows.append(future.result(timeout=2 * STOP_WAIT_S + 60))
                on_row(rows[-1])
    return rows, interrupted
