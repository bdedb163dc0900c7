"""Choosing where kernels run: compiled on CUDA, or under Triton's interpreter on the CPU; and what of the host a
process may use (its GPUs, ``cuda_device_count``; its CPU cores, ``usable_cores``).

Triton decides interpreter-or-compiler when ``triton.language`` is first imported (its builtins such
as ``tl.sum`` are themselves jitted), so the choice is made once per process, before Triton loads.
"""

from __future__ import annotations

import os
import sys

from kvfence.errors import BadInput, require

DEVICES = ("auto", "cpu", "cuda")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def cuda_device_count() -> int:
    """GPUs the CUDA driver shows this process (``CUDA_VISIBLE_DEVICES`` honoured), asked of the driver
    library itself: no torch import and no CUDA context, so a process that only draws, shrinks or merges
    knows whether a GPU is there in milliseconds. 0 when there is no driver or it fails."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    except (OSError, AttributeError):
        return 0


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask (``taskset``, a container's or a batch
    scheduler's cpuset), not every core of the host."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity call on this platform
        return os.cpu_count() or 1


def select(device: str = "auto", *, announce=None, prepare: bool = True) -> str:
    """Resolve ``auto``/``cpu``/``cuda`` to ``cpu`` or ``cuda`` and prepare Triton for it.

    ``announce`` (e.g. a stderr printer) is told when ``auto`` falls back to the interpreter, so the
    fallback is never silent. ``prepare=False`` is for processes that launch no kernel (a fuzz run's
    supervisor, a ``--jobs`` parent): the choice is made and exported (``TRITON_INTERPRET`` for the
    workers), but neither torch nor Triton is imported; the worker that launches checks torch itself.
    """
    require(device in DEVICES, f"unknown device {device!r}: choose {', '.join(DEVICES)}")
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    has_cuda = cuda_available if prepare else (lambda: cuda_device_count() > 0)
    if device == "auto":
        device = "cuda" if (not interpreting and has_cuda()) else "cpu"
        if device == "cpu" and announce is not None:
            why = "TRITON_INTERPRET=1 is set" if interpreting else "no CUDA device"
            announce(f"kvfence: {why}; running kernels under the Triton interpreter on the CPU (slow)")
    if device == "cuda":
        require(has_cuda(), "--device cuda: no CUDA device is available (torch.cuda.is_available() is False)"
                if prepare else "--device cuda: no CUDA device is available (the CUDA driver shows none)")
        require(not interpreting, "--device cuda: TRITON_INTERPRET=1 is set; unset it to run compiled kernels")
        return "cuda"
    check_interpreter_numpy()
    if not interpreting:
        require("triton.language" not in sys.modules,
                "the CPU interpreter must be chosen before triton is imported (set TRITON_INTERPRET=1)")
        os.environ["TRITON_INTERPRET"] = "1"
    if prepare:
        skip_discarded_overflow_checks()
    return "cpu"


def skip_discarded_overflow_checks() -> bool:
    """Stop the interpreter computing int32-overflow checks that it then throws away.

    With ``debug`` off (the default), the interpreter still builds every overflow check of every
    integer add/mul (``sanitize_overflow``) and discards the result in ``device_assert``: about half
    of the per-program time (BENCHMARKS.md). Turning it off changes no result. Returns whether the
    knob was found (Triton internals; absent in a future release means only slower runs).
    """
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if builder is None or options is None or getattr(options, "debug", True) \
            or not hasattr(options, "sanitize_overflow"):
        return False
    import dataclasses

    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True


def check_interpreter_numpy() -> None:
    """Refuse a known-broken pair instead of reporting every launch as LAUNCH_ERROR.

    Triton 3.6's interpreter converts scalar loads with ``__index__`` on 1-element arrays, which numpy
    2.4 turned into an error ("only 0-dimensional arrays can be converted to Python scalars"): every
    kernel whose loop bound is loaded fails. Seen with triton 3.6.0 + numpy 2.4.6 (BENCHMARKS.md);
    3.9 runs; 3.7 and 3.8 were not tried, so only 3.6 is refused.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        triton_v, numpy_v = version("triton"), version("numpy")
    except PackageNotFoundError:
        return
    major_minor = lambda v: tuple(int(x) for x in v.split(".")[:2])  # noqa: E731
    require(not (major_minor(triton_v) == (3, 6) and major_minor(numpy_v) >= (2, 4)),
            f"the Triton {triton_v} interpreter fails with numpy {numpy_v} (scalar loads); "
            "for --device cpu install numpy<2.4 or triton>=3.9")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def ensure(device: str) -> None:
    """Raise unless this process's Triton mode matches ``device`` (``select`` was called for it)."""
    if device == "cpu":
        require(interpreting(), "device cpu needs TRITON_INTERPRET=1 set before triton is imported")
    else:
        require(not interpreting(), "device cuda cannot run with TRITON_INTERPRET=1 set")
        if not cuda_available():
            raise BadInput("device cuda: no CUDA device is available")


def pin_worker_gpu(worker_id: str) -> int:
    """Pin a pytest-xdist worker (``gw3``) to GPU ``index mod device_count``; returns the index.

    Uses ``torch.cuda.set_device`` (every kvfence tensor and Triton launch goes to the current device)
    rather than ``CUDA_VISIBLE_DEVICES``, which no longer applies once the device count was read.
    """
    import torch

    require(worker_id.startswith("gw") and worker_id[2:].isdigit(), f"unexpected xdist worker id {worker_id!r}")
    count = torch.cuda.device_count()
    require(count >= 1, "no CUDA device to pin")
    index = int(worker_id[2:]) % count
    torch.cuda.set_device(index)
    return index
