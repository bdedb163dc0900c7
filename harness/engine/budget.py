"""A run's memory budget, ``--max-gpu-mem``, and what one launch costs against it: one number for every contract.

``launch_bytes(record, launch)`` is the device memory a launch takes, known from shapes before anything is built:
its tables in the engine's guarded buffers (``table_bytes``: ``kvfence.engine.tables.allocated_elements``, guards
and output tails included) plus what the contract's own checker holds beside them (``Contract.checker_bytes``: 0
for the engine's checker; the draft's CUDA-graph runner, its pool and the verifier's copy). The engine refuses a
launch over the budget before anything is built (``kvfence.engine.checking.require_fits``), and a contract's draws
are fitted to it with ``fit``: a draw over the budget becomes a smaller case (its free fields halved), not an
out-of-memory crash.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Optional, Sequence, TypeVar

from kvfence.contract import Contract, Launch
from kvfence.engine.launch import spill
from kvfence.engine.record_check import fail
from kvfence.engine.tables import allocated_elements
from kvfence.errors import BadInput, require

#: A draw's value that ``fit`` shrinks (a contract's config or case).
V = TypeVar("V")

#: Bytes per element of each ``Table.dtype``.
DTYPE_BYTES = {"int8": 1, "int16": 2, "int32": 4, "int64": 8}

#: Fraction of free device memory the default budget takes (split between ``--jobs`` processes).
DEFAULT_FRACTION = 0.6


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: str) -> int:
    """``"8G"``, ``"512MiB"``, ``"1.5g"`` or a plain byte count -> bytes (``BadInput`` otherwise)."""
    m = _SIZE.match(str(text))
    if m is None:
        raise BadInput(f"--max-gpu-mem {text!r}: expected a size such as 8G, 512M or a byte count")
    value = float(m.group(1)) * _UNITS[(m.group(2) or "").lower()[:1]]
    require(value >= 1, f"--max-gpu-mem {text!r} must be at least one byte")
    return int(value)


def free_device_memory() -> int:
    """Free memory of the current GPU, asked of ``nvidia-smi`` so the asking process (the one running
    Hypothesis) never creates a CUDA context of its own; torch's ``mem_get_info`` when that fails."""
    import os
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    cmd = ["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"]
    if visible:
        cmd.insert(1, f"--id={visible}")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.split()
        return int(out[0]) * 2**20  # MiB
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        import torch

        return torch.cuda.mem_get_info()[0]


def default_budget(device: str, jobs: int = 1) -> int:
    """``DEFAULT_FRACTION`` of the device's free memory split over ``jobs`` (CPU: 4 GiB per job)."""
    if device == "cuda":
        return int(free_device_memory() * DEFAULT_FRACTION / max(1, jobs))
    return 4 * 2**30




def size_text(nbytes: int) -> str:
    """``nbytes`` for a message: whole MiB from 1 MiB up (``12288 MiB``), else KiB or bytes."""
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.0f} MiB"
    return f"{nbytes / 2**10:.1f} KiB" if nbytes >= 2**10 else f"{nbytes} bytes"


def table_bytes(record: Contract[Any], launch: Launch[Any]) -> int:
    """Bytes the launch's tables take in their guarded buffers (``kvfence.engine.tables``: guards and the output
    tails included, as ``absorb`` lays them out), from their shapes alone: nothing is built."""
    past = spill(record, launch)
    return sum(allocated_elements(t, layout=launch.layout, spill=past) * DTYPE_BYTES.get(t.dtype, 8)
               for t in record.tables(launch))


def launch_bytes(record: Contract[Any], launch: Launch[Any]) -> int:
    """The device bytes one launch costs: ``table_bytes`` plus ``record.checker_bytes(launch)`` (what its own
    checker holds beside the tables). The number the budget is held to, for a launch and for a draw."""
    own = record.checker_bytes(launch)
    if type(own) is not int or own < 0:
        raise fail(record.name, f"checker_bytes(launch) must return a non-negative int, got {own!r}")
    return table_bytes(record, launch) + own


def halve_field(value: V, name: str) -> Optional[V]:
    """``value`` (a dataclass) with its integer field ``name`` halved, or None when it is 1 already."""
    current = getattr(value, name)
    if current <= 1:
        return None
    changed: V = dataclasses.replace(value, **{name: current // 2})  # type: ignore[type-var]
    return changed


def fit(value: V, max_bytes: Optional[int], free: Sequence[str], cost: Callable[[V], int],
        halve: Callable[[V, str], Optional[V]] = halve_field) -> Optional[V]:
    """``value`` itself if ``cost(value)`` fits ``max_bytes`` (None: no budget), else a smaller one: each round the
    first of the ``free`` fields that ``halve`` can still shrink (None: at its floor) is halved, until it fits.
    Deterministic, so a shrinking Hypothesis draw maps to a shrinking value. None when nothing is left to halve.
    ``cost`` is the contract's value priced by ``launch_bytes`` (of its widest launch, for a config)."""
    if max_bytes is None:
        return value
    while cost(value) > max_bytes:
        for name in free:
            smaller = halve(value, name)
            if smaller is not None:
                value = smaller
                break
        else:
            return None
    return value
