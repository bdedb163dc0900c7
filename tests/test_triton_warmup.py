"""Triton's per-process start-up, warmed on a thread in a CUDA worker (kvfence.engine.triton_warmup)."""

from __future__ import annotations

import json
import subprocess
import sys

from kvfence.engine import triton_warmup
from kvfence.engine.triton_warmup import TritonWarmup, wanted

#: In a fresh interpreter (Triton's cache key not yet computed): warm up, then report what is ready.
_PROBE = """
import json, sys
from kvfence.engine.triton_warmup import FIRST_COMPILE_MODULES, TritonWarmup
from triton.runtime import cache
before = cache.triton_key.cache_info().currsize
seconds = TritonWarmup().start().join()
print(json.dumps({"before": before, "after": cache.triton_key.cache_info().currsize, "seconds": seconds,
                  "imported": [m for m in FIRST_COMPILE_MODULES if m in sys.modules]}))
"""


def test_the_warmup_computes_tritons_cache_key_and_imports_the_first_compile_modules():
    """After ``join()`` the memoised cache key is there (the first launch does not hash libtriton again)
    and the lazily imported compiler modules are loaded; the seconds it took are returned."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["before"], doc["after"]) == (0, 1)
    assert doc["seconds"] > 0 and "triton.compiler" in doc["imported"]


def test_a_failed_warmup_says_why_and_returns_no_seconds(monkeypatch):
    """A warm-up that raises is no verdict of anything: ``join()`` gives None and ``error`` one line."""
    def broken(record):
        raise OSError("libtriton unreadable")

    monkeypatch.setattr(triton_warmup, "_warm", broken)
    warmup = TritonWarmup().start()
    assert warmup.join() is None and warmup.error == "OSError: libtriton unreadable"


def test_only_a_compiling_worker_warms_up(monkeypatch):
    """The CPU and the Triton interpreter compile nothing: no warm-up there; CUDA and "auto" warm up."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert (wanted("cuda"), wanted("auto"), wanted("cpu")) == (True, True, False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert (wanted("cuda"), wanted("auto")) == (False, False)
