"""The machine's CPUs and GPUs as the benchmarks that pin runs to them see them (``plain_fuzz_mutants.py
--parallel``): sysfs cpulists, whole physical cores, each GPU's NUMA node."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Dict, List


def cpu_list(text: str) -> List[int]:
    """``"0-3,8,10-11"`` (a sysfs cpulist) -> ``[0, 1, 2, 3, 8, 10, 11]``."""
    out = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def physical_order(cpus: List[int]) -> List[int]:
    """``cpus`` ordered by socket, then physical core, so consecutive slices hold whole cores (both
    hyperthreads of a core go to the same run) on one socket; plain order where sysfs does not say."""
    def key(cpu):
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            return (int((topo / "physical_package_id").read_text()), int((topo / "core_id").read_text()), cpu)
        except (OSError, ValueError):
            return (0, cpu, cpu)

    return sorted(cpus, key=key)


def gpu_local_cpus(gpus: List[int]) -> Dict[int, set]:
    """Per GPU index, the CPUs of its NUMA node (``nvidia-smi`` bus ids, then sysfs); empty if unknown."""
    try:
        lines = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {}
    out = {}
    for line in lines:
        index, _, bus = (x.strip() for x in line.partition(","))
        domain, _, rest = bus.lower().partition(":")
        path = Path(f"/sys/bus/pci/devices/{domain[-4:]}:{rest}/local_cpulist")
        try:
            if int(index) in gpus:
                out[int(index)] = set(cpu_list(path.read_text()))
        except (OSError, ValueError):
            continue
    return out
