"""Triton's once-per-process start-up costs, paid on a thread while a CUDA worker imports torch.

Why: the first kernel a fresh process launches pays, before anything of its own, for Triton's cache key
(``triton.runtime.cache.triton_key``: it hashes Triton's sources and its ~500 MB ``libtriton`` shared
library) and for compiler modules imported on first use. That is so even when every kernel is already in
Triton's on-disk cache. On the H200 (triton 3.6) the cache key took 0.43-0.78 s of a fresh process and the
first compile's imports 0.14 s, all of it on the path to its first verdict. None of it needs the GPU, and
reading and hashing a file release the GIL, so a thread started before the worker imports torch finishes while torch
imports (``benchmarks/ first_verdict.py`` times the effect). A warm-up is only ever an early copy of work the first
launch would do anyway: the cache key is memoised, the imports are the same modules, and a step this Triton version
does not have is skipped (the launch then does what it needs itself, and reports its own errors).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import threading
import time
from typing import Any, Optional

#: Modules the first compile imports lazily (those a Triton version lacks are skipped). triton 3.6 imports
#: ``triton.experimental.gluon`` on the first compile (0.14 s on the H200).
FIRST_COMPILE_MODULES = ("triton.compiler", "triton.backends.nvidia.compiler", "triton.backends.nvidia.driver",
                         "triton.experimental.gluon")


def wanted(device: str) -> bool:
    """Whether a worker asked for ``device`` ("cuda", "auto" or "cpu") compiles kernels: not on the CPU,
    and not under ``TRITON_INTERPRET=1`` (the interpreter compiles nothing)."""
    return device != "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def _warm(record: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    for name in FIRST_COMPILE_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        except ImportError:  # this Triton version lays its modules out otherwise: the launch imports them
            pass
    from triton.runtime import cache

    key = getattr(cache, "triton_key", None)
    if key is not None:
        key()
    record["warmup_s"] = time.perf_counter() - t0


class TritonWarmup:
    """``start()`` runs the warm-up on a daemon thread; ``join()`` waits for it and returns its seconds
    (None when it did not finish: an error, which the first launch will meet and report itself)."""

    def __init__(self) -> None:
        self._record: dict[str, Any] = {}
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "TritonWarmup":
        def run() -> None:
            try:
                _warm(self._record)
            except Exception as exc:  # noqa: BLE001 - kept for join(); the first launch raises its own
                self._record["error"] = f"{type(exc).__name__}: {exc}"

        self._thread = threading.Thread(target=run, name="kvfence-triton-warmup", daemon=True)
        self._thread.start()
        return self

    def join(self) -> Optional[float]:
        if self._thread is not None:
            self._thread.join()
        return self._record.get("warmup_s")

    @property
    def error(self) -> Optional[str]:
        """Why the warm-up did not finish (its exception, one line), or None."""
        return self._record.get("error")
