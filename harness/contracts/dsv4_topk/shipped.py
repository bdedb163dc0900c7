"""What vLLM's releases say of the DeepSeek-V4 top-k global-index kernel (``kvfence.release.knowledge``, entry-point
group ``kvfence.shipped``): where the wheels define it. The kernel source ``vllm`` (``kvfence.release.vllm_kernels``)
reads them: ``--kernel vllm==VERSION`` is DeepSeek-V4's, ``--kernel vllm==VERSION:v41`` DeepSeek-V4.1's.

In 0.34.0 V4's kernel is the ``@staticmethod`` ``@triton.jit`` body of a ``VllmTritonJitKernel``
(``ComputeGlobalTopkIndicesAndLensKernel.kernel``, ``vllm/models/deepseek_v4/common/ops/cache_utils.py:592-643``,
launched by ``compute_global_topk_indices_and_lens`` at ``:550-576``), which the kernel source lifts to the top
level; V4.1's is a plain jit function (``_compute_global_topk_indices_and_lens_kernel``,
``vllm/models/deepseek_v41/common/ops/cache_utils.py:763-811``, launched at ``:729-760``). Both take the same
parameters and have the same body. ``vllm_affected`` answers ``kvfence affected`` for a vLLM launch command
(``kvfence.contracts.dsv4_topk.affected``).
"""

from __future__ import annotations

from kvfence.release.knowledge import Shipped, Upstream

V4 = Upstream("ComputeGlobalTopkIndicesAndLensKernel.kernel", ("vllm/models/deepseek_v4/common/ops/cache_utils.py",))
V41 = Upstream("_compute_global_topk_indices_and_lens_kernel", ("vllm/models/deepseek_v41/common/ops/cache_utils.py",))


def vllm_affected(deployment, out, device: str) -> list:
    """``affected`` for a vLLM deployment (``kvfence.contracts.dsv4_topk.affected``)."""
    from kvfence.contracts.dsv4_topk.affected import topk_verdicts

    return topk_verdicts(deployment, out, device)


DSV4_TOPK = Shipped(Upstream(V4.function, V4.paths, variants=(("v41", V41),)), sizings=("safe", "block-floor"),
                    vllm_affected=vllm_affected)
