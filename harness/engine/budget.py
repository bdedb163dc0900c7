"""A run's memory budget: the device memory one config (one launch's tables) may take, ``--max-gpu-mem``.

Each contract fits its draws to it (the draft's ``kvfence.contracts.draft.budget``: a draw is shrunk to a config
that fits), and the engine refuses a launch over it before anything is built (``kvfence.engine.checking``).
"""

from __future__ import annotations

import re

from kvfence.errors import BadInput, require

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


