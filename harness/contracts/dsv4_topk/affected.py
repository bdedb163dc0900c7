"""``affected`` for vLLM's DeepSeek-V4 top-k global indices (``Shipped.vllm_affected``, docs/contract.md §12): does a
vLLM deployment reach the released kernel's block-table load past a request's row (vllm#56771), and what does the
release's own kernel (``vllm==VERSION``, ``:v41`` for DeepSeek-V4.1) do there?

The kernel runs only for DeepSeek-V4 and V4.1 models (their C4A layers' sparse decode). Its load is masked by ``idx
>= 0`` only, so it reads past the row exactly when a token's row of the shared top-k buffer holds an index at or
past ``W * B`` (``W``: the row's blocks, ``cdiv(max_model_len, block_size)``; ``B = block_size // 4``): the row's
wall. kvfence runs the release's kernel on such a launch (a CUDA-graph padding token, mapped to request 0 as vLLM
maps it, whose row holds the wall, another request in the next row) and reports what it did. Whether a server puts
such an index there is the producer's business, which kvfence reads but does not run: in 0.34.0 the indexer sets
the rows of the step's tokens to -1 before its top-k and writes indices below each request's compressed length, so
kvfence names no launch flag that reaches it and answers UNKNOWN with that reading; the upstream report says stale
rows do reach it. A model of another architecture gets no line (the kernel is DeepSeek-V4's); a model whose
config.json is not on this host is taken for DeepSeek-V4 by its name (said as an assumption), else UNKNOWN.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional, Tuple

from kvfence.errors import BadInput
from kvfence.release.affected_verdict import Verdict, fixed_in, step

NAME = "dsv4-topk-indices"
SITE = "compute_global_topk_indices_and_lens, C4A sparse decode"
#: Architectures whose vLLM model launches the kernel -> the kernel spec's variant (``vllm==V`` + it).
ARCHITECTURES = {"DeepseekV4ForCausalLM": "", "DeepseekV4ForConditionalGeneration": "",
                 "DeepseekV41ForCausalLM": ":v41"}
READ_IN = ("0.34.0",)
DAMAGE = ("VALUE_MISMATCH", "POISON_READ", "OOB_READ")
IMPACT = ("a padding token's top-k entry is read from past its request's block-table row: another request's KV block "
          "id, or memory past the table (an illegal address on the GPU)")
#: Where each fact is (``file:lines``, under ``vllm/``), read in 0.34.0.
EVIDENCE = (
    "models/deepseek_v4/common/ops/cache_utils.py:624-628: the block-table load masked by mask & (idx >= 0) only "
    "(V4.1: models/deepseek_v41/common/ops/cache_utils.py:794-798)",
    "models/deepseek_v4/nvidia/flashmla.py:186-198: C4A decode maps topk_indices_buffer[:num_decode_tokens] through "
    "block_table[:num_decodes], is_valid_token[:num_decode_tokens]",
    "models/deepseek_v4/nvidia/model.py:859-864: one torch.empty(max_num_batched_tokens, index_topk) buffer for every "
    "indexer layer",
    "v1/attention/backends/mla/sparse_swa.py:626-631: is_valid_token = slot_mapping >= 0 (false for CUDA-graph "
    "padding); v1/attention/ops/metadata.py:38-41: tokens past the batch's map to request 0",
    "model_executor/layers/sparse_attn_indexer.py:757-763: the indexer sets buffer[:num_tokens] to -1 before its top-k "
    "(skip_topk_buffer_clear, default False, is not set by deepseek_v4)",
    "models/deepseek_v4/common/ops/cache_utils.py:682-693: the C4A kernel's B = cache block size // 4, its row "
    "stride cdiv(max_model_len, cache block size)",
)


def _kernel_of(dep) -> Tuple[Optional[str], str]:
    """``(variant, how it was decided)`` of a DeepSeek-V4 deployment, ``(None, why)`` for another model."""
    found = [a for a in dep.architectures if a in ARCHITECTURES]
    if found:
        return ARCHITECTURES[found[0]], f"{found[0]} (from {dep.config_source})"
    if dep.architectures:
        return None, ""
    name = dep.model or ""
    if re.search(r"deepseek[-_.]?v4", name, re.I):
        variant = ":v41" if re.search(r"deepseek[-_.]?v4[._-]?1", name, re.I) else ""
        arch = "DeepseekV41ForCausalLM" if variant else "DeepseekV4ForCausalLM"
        return variant, (f"{arch}, assumed from the model's name {name} ({dep.config_source}; give its config.json "
                         "with --hf-config-path to read it)")
    return None, dep.config_source


def _witness(dep, kernel: str, device: str):
    """The release's kernel on the wall: a valid token and a padding token in row 0 (request 0), the padding token's
    top-k row holding -1 and ``W * B``, another request in row 1. ``(launch, findings, W, B)``."""
    from kvfence.contracts.dsv4_topk.case import TopkCase
    from kvfence.contracts.dsv4_topk.record import DSV4_TOPK
    from kvfence.engine.checking import TableChecker
    from kvfence.engine.launch import bind

    bs = max(1, dep.block_size // 4)
    blocks = -(-dep.max_model_len // dep.block_size)
    case = TopkCase(block_size=bs, ctx=blocks * bs, topk=2, table_rows=2, reqs=(0, 1, 0), valid=(True, True, False),
                    indices=((0, -1), (blocks * bs - 1, 0), (-1, blocks * bs))).validate()
    launch = bind(DSV4_TOPK, case, "safe", kernel, "eager", "production")
    return launch, TableChecker(DSV4_TOPK, device).check(launch), blocks, bs


def _kinds(launch, findings, out: Path, device: str, dep) -> Tuple[List[str], str]:
    from kvfence.contracts.dsv4_topk.record import DSV4_TOPK
    from kvfence.engine.casefile import write_case
    from kvfence.engine.findings import observed

    kinds = sorted({f.kind.value for f in findings})
    path = write_case(launch, findings, out_dir=out / f"vllm-{dep.version}" / NAME, device=device, source="affected")
    return [k for k in kinds if observed(DSV4_TOPK, k)], str(path)


def topk_verdicts(dep, out: Path, device: str) -> List[Verdict]:
    from kvfence.contracts.dsv4_topk.record import DSV4_TOPK
    from kvfence.engine import kernels
    from kvfence.release.affected_vllm import vllm_releases
    from kvfence.release.upstream import NO_KERNEL, Refused

    variant, how = _kernel_of(dep)
    if variant is None and dep.architectures:
        return []  # another model: the kernel is DeepSeek-V4's
    v = Verdict(NAME, "unknown", site=SITE, evidence=[f"vllm 0.34.0: {e}" for e in EVIDENCE])
    if variant is None:
        v.condition = (f"the kernel runs only for DeepSeek-V4 / V4.1 ({', '.join(ARCHITECTURES)}); the model's "
                       f"architecture is not known: {how}")
        return [v]
    kernel = f"vllm=={dep.version}{variant}"
    step(f"{NAME}: reading {kernel}'s kernel")
    try:
        kernels.resolve(DSV4_TOPK, kernel)
    except Refused as exc:
        v.status, v.condition = ("not launched" if exc.status == NO_KERNEL else "unknown"), str(exc)
        return [v]
    except BadInput as exc:  # no wheel (offline, or no such release)
        v.condition = f"vllm {dep.version}'s kernel is not one kvfence can read: {exc}"
        return [v]
    if dep.block_size > 256:
        v.condition = f"block size {dep.block_size}: kvfence's case model takes B = block size // 4 up to 64"
        return [v]
    step(f"{NAME}: running {kernel}'s kernel on a padding token whose top-k row holds its row's wall")
    launch, findings, blocks, bs = _witness(dep, kernel, device)
    v.seen, v.case_file = _kinds(launch, findings, out, device, dep)
    v.reach = f"{how} launches {kernel}'s kernel in its C4A layers' sparse decode"
    v.condition = (f"the load is masked by idx >= 0 only: a token whose top-k row holds an index at or past the "
                   f"row's wall W * B = {blocks} * {bs} = {blocks * bs} (W = cdiv(max_model_len {dep.max_model_len}, "
                   f"block {dep.block_size}), B = {bs}) reads past its block-table row (the launch run: a CUDA-graph "
                   "padding token of request 0 holding it, another request in the next row); whether a server leaves "
                   "such an index in a padding token's row is the producer's: "
                   + ("kvfence read 0.34.0's (the indexer sets the step's rows to -1, then writes indices below each "
                      "request's compressed length) and found no launch flag that does; vllm#56771 reports stale "
                      "rows reaching it" if dep.version in READ_IN else
                      f"kvfence read the producer in vllm {', '.join(READ_IN)}, not {dep.version}"))
    if not any(k in DAMAGE for k in v.seen):
        v.condition += "; the release's kernel read nothing past the row there, which kvfence does not understand"
        return [v]
    # What a reached read does; no severity: that is for a status kvfence can establish.
    v.impact = IMPACT
    v.condition += f"; were it reached: {IMPACT}"

    def reads_past(version: str) -> Optional[bool]:
        from dataclasses import replace

        try:
            kernels.resolve(DSV4_TOPK, f"vllm=={version}{variant}")
            _, found, _, _ = _witness(replace(dep, version=version), f"vllm=={version}{variant}", device)
        except BadInput:
            return None
        return any(f.kind.value in DAMAGE for f in found)

    v.fixed_in, v.fixed_text = fixed_in(dep.version, vllm_releases(), reads_past)
    v.fixed_text += ("; the open fix is vllm#57388 (idx // B < the row's stride and is_valid_token in the load's "
                     "mask); kvfence knows no flag that avoids the kernel on a DeepSeek-V4 model")
    return [v]
