"""What vLLM's releases say of the slot-mapping kernel (``kvfence.release.knowledge``, entry-point group
``kvfence.shipped``): where the wheels define it. The paths name the wheel's own package (``vllm/...``): the
kernel source ``vllm`` (``kvfence.release.vllm_kernels``, ``--kernel vllm==VERSION``) reads them; SGLang's
wheels hold no such path, so ``--kernel sglang==VERSION`` is refused in one line.

``_compute_slot_mappings_kernel`` is model runner V2's (``vllm/v1/worker/gpu/block_table.py``: lines 333-414 in
0.33.0 and 0.34.0, the same text in both); it reaches each group's table through ``_load_ptr``
(``vllm/v1/worker/gpu/buffer_utils.py``), which the kernel source extracts beside it. Model runner V1's twin
(``ComputeSlotMappingKernel.kernel`` in ``vllm/v1/worker/block_table.py``, 0.33.0; gone from 0.34.0) takes one
table directly and is a method of a class, another ABI: it is not launched under this contract.
``vllm_affected`` answers ``kvfence affected`` for a vLLM launch command (``kvfence.contracts.slot_mapping.affected``).
"""

from __future__ import annotations

from kvfence.release.knowledge import Shipped, Upstream


def vllm_affected(deployment, out, device: str) -> list:
    """``affected`` for a vLLM deployment (``kvfence.contracts.slot_mapping.affected``)."""
    from kvfence.contracts.slot_mapping.affected import slot_verdicts

    return slot_verdicts(deployment, out, device)


SLOT_MAPPING = Shipped(Upstream("_compute_slot_mappings_kernel", ("vllm/v1/worker/gpu/block_table.py",)),
                       sizings=("safe", "block-floor", "per-rank"), vllm_affected=vllm_affected)
