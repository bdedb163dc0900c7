"""Capturing a CUDA graph without Python's cyclic garbage collector running inside the capture.

Why: a collection that runs while a stream captures can free an unreachable ``torch.cuda.CUDAGraph`` (one a
dropped runner or verifier kept in a reference cycle). Its destructor destroys the graph, a CUDA call that is
not permitted while a stream captures: CUDA then invalidates the capture in progress ("operation failed due
to a previous error during capture"), and the case being captured fails though nothing is wrong with it.
torch no longer collects before a capture (``torch.compiler.config.force_cudagraph_gc`` is off by default),
and a collection starts whenever enough Python objects have been allocated, which a kernel launch does.
Seen on the H200 as a flaky failure of the whole suite under ``pytest -n auto``.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Hold off automatic cyclic collection for the ``with`` block (a capture); what was garbage before is
    collected at the next automatic collection after it, outside the capture."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
