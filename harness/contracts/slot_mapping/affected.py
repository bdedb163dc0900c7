"""``affected`` for vLLM's slot mapping (``Shipped.vllm_affected``, docs/contract.md §11): does a vLLM deployment
reach the kernel's load past a block-table row (vllm#53982), and what does the release's own kernel
(``vllm==VERSION``) do there?

The load of ``_compute_slot_mappings_kernel`` is bounded by the request's row only through ``is_local &
is_real_req``: a token whose block index passes its group's row reads the next row (another request's block
ids). A deployment reaches it only through a KV-cache group that takes the slot mapping and whose row holds fewer
blocks than the positions below ``max_model_len`` ask for. Which groups there are is the model's (its layers'
cache specs), not the flags': the line names what decided it.

* A model whose layers are all vLLM's ``Attention`` (the architectures of ``PLAIN``, read in 0.33.0 and 0.34.0)
  has FullAttentionSpec / SlidingWindowSpec groups whose rows are sized for ``max_model_len``; with a draft of the
  same kind, or none (ngram, suffix), no block index passes its row: NOT AFFECTED, and the release's kernel is run
  on the longest admitted launch (a request whose last token sits at ``max_model_len - 1``) to show it clean.
* A group the deployer declares (``--kv-cache-group BLOCK_SIZE:BLOCKS``, a cache type of the model's own) whose
  row is narrower than ``max_model_len``: the release's kernel is run on a request whose tokens pass that row with
  another request in the next row; AFFECTED when it shows an observed kind there (the slot of another request's
  block, or poison past the table).
* Anything else (no config.json on this host, an architecture kvfence has not read, a draft it cannot read, a
  release whose layers it has not read) is UNKNOWN: the line says what the release's kernel does were such a group
  there.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from kvfence.errors import BadInput
from kvfence.release.affected_verdict import SILENT, Verdict, fixed_in, step

NAME = "slot-mapping"
SITE = "_compute_slot_mappings_kernel, model runner V2"
#: Architectures whose vLLM model is built of ``Attention`` layers only (``model_executor/layers/attention/
#: attention.py``: ``get_kv_cache_spec`` gives FullAttentionSpec, or SlidingWindowSpec for a windowed layer), read in
#: the releases of ``READ_IN``: architecture -> its module (``model_executor/models/X.py``, through the registry).
PLAIN = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral (llama's layers)", "Qwen2ForCausalLM": "qwen2",
         "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe", "Gemma2ForCausalLM": "gemma2",
         "Gemma3ForCausalLM": "gemma3", "Phi3ForCausalLM": "phi3 (llama's layers)",
         "EagleLlamaForCausalLM": "llama_eagle", "Eagle3LlamaForCausalLM": "llama_eagle3",
         "LlamaForCausalLMEagle3": "llama_eagle3"}
READ_IN = ("0.33.0", "0.34.0")
#: ``--speculative-config`` methods without a draft model's KV cache (0.34.0 ``config/speculative.py:84-97``).
NO_DRAFT_KV = ("ngram", "ngram_gpu", "suffix")
#: Methods whose draft is a model of its own, named by ``--speculative-config``'s ``model``.
DRAFT_MODEL = ("eagle", "eagle3", "draft_model")
DAMAGE = ("VALUE_MISMATCH", "POISON_READ", "OOB_READ")
IMPACT = ("the token's slot names a block of the next row's request (or a wild id past the table): the attention "
          "layers write its K/V there, over another request's cache, silently")
#: Where each fact is, per release read (``file:lines``, under ``vllm/``).
EVIDENCE = {
    "0.34.0": ("v1/worker/gpu/block_table.py:333-414: the block-table load masked by is_local & is_real_req only",
               "v1/worker/gpu/model_runner.py:669-709: each group's row is spec.max_num_blocks_per_req(max_model_len)",
               "v1/kv_cache_interface.py:621-626: an attention spec's row is cdiv(max_len, block_size * dcp)",
               "v1/core/sched/scheduler.py:866-873: positions stay below max_model_len",
               "model_executor/layers/attention/attention.py:637-711: Attention's spec is FullAttentionSpec or "
               "SlidingWindowSpec"),
    "0.33.0": ("v1/worker/gpu/block_table.py:333-414: the block-table load masked by is_local & is_real_req only",
               "v1/worker/gpu/model_runner.py:634-670: each group's row is spec.max_num_blocks_per_req(max_model_len)",
               "v1/kv_cache_interface.py:610-615: an attention spec's row is cdiv(max_len, block_size * dcp)",
               "v1/core/sched/scheduler.py:850-857: positions stay below max_model_len",
               "model_executor/layers/attention/attention.py:611-681: Attention's spec is FullAttentionSpec or "
               "SlidingWindowSpec"),
}


def _groups_known(dep) -> Tuple[Optional[bool], str]:
    """``(True, how)`` when every KV-cache group of the model and its draft is one of vLLM's attention specs sized
    for ``max_model_len``; ``(None, why not)`` when kvfence cannot tell."""
    if dep.version not in READ_IN:
        return None, (f"kvfence read the models' layers in vllm {', '.join(READ_IN)}, not {dep.version}")
    if not dep.architectures:
        return None, f"the model's architecture is not known: {dep.config_source}"
    other = [a for a in dep.architectures if a not in PLAIN]
    if other:
        return None, (f"{', '.join(other)} is not an architecture kvfence has read (it has read "
                      f"{', '.join(sorted(PLAIN))}); its layers decide its cache groups")
    how = (f"{', '.join(dep.architectures)} (model_executor/models/{PLAIN[dep.architectures[0]].split(' ')[0]}.py, "
           f"from {dep.config_source}) is built of vLLM's Attention layers")
    method = dep.spec_method
    if method is None and dep.draft_model is None:
        return True, how + ("" if not dep.spec_tokens else "; the speculative config names no draft")
    if method in NO_DRAFT_KV:
        return True, how + f"; --speculative-config method {method} has no draft KV cache"
    if method is not None and method not in DRAFT_MODEL:
        return None, (f"{how}, but --speculative-config method {method} adds the draft's own layers, which "
                      "kvfence has not read")
    if not dep.draft_architectures:
        return None, f"{how}, but the draft's architecture is not known: {dep.draft_config_source}"
    other = [a for a in dep.draft_architectures if a not in PLAIN]
    if other:
        return None, f"{how}, but the draft's {', '.join(other)} is not an architecture kvfence has read"
    return True, how + f"; so is the draft ({', '.join(dep.draft_architectures)}, from {dep.draft_config_source})"


def _run(dep, groups, requests, device: str):
    """The release's kernel on one launch: ``groups`` (``Group``s), ``requests`` ``(row, first position, tokens)``;
    the tables sized for ``max_model_len`` (the ``safe`` sizing, vLLM's). ``(launch, findings, note)``."""
    from kvfence.contracts.slot_mapping.case import SlotCase
    from kvfence.contracts.slot_mapping.record import SLOT_MAPPING
    from kvfence.engine.checking import TableChecker
    from kvfence.engine.launch import bind

    # Triton's interpreter cannot run the release's context-parallel branch (docs/contract.md §11): on the CPU the
    # launch runs without it (the row bound it lacks is the same).
    cp = dep.dcp if device != "cpu" else 1
    note = "" if cp == dep.dcp else (f"; the launch ran without context parallelism (dcp {dep.dcp}): Triton's "
                                     "interpreter cannot run the release's context-parallel branch")
    if cp > 1:
        groups = tuple(g.__class__(g.block_size, g.blocks, g.enabled, True) for g in groups)
    case = SlotCase(ctx=dep.max_model_len, groups=tuple(groups), req_rows=tuple(r for r, _, _ in requests),
                    starts=tuple(s for _, s, _ in requests), query_lens=tuple(q for _, _, q in requests),
                    table_rows=max(r for r, _, _ in requests) + 1, cp_size=cp,
                    cp_interleave=dep.cp_interleave if cp > 1 else 1).validate()
    launch = bind(SLOT_MAPPING, case, "safe", f"vllm=={dep.version}", "eager", "production")
    return launch, TableChecker(SLOT_MAPPING, device).check(launch), note


def _kinds(launch, findings, out: Path, device: str, dep) -> Tuple[List[str], List[str], str]:
    from kvfence.contracts.slot_mapping.record import SLOT_MAPPING
    from kvfence.engine.casefile import write_case
    from kvfence.engine.findings import observed

    kinds = sorted({f.kind.value for f in findings})
    path = write_case(launch, findings, out_dir=out / f"vllm-{dep.version}" / NAME, device=device, source="affected")
    return [k for k in kinds if observed(SLOT_MAPPING, k)], [k for k in kinds if not observed(SLOT_MAPPING, k)], \
        str(path)


def _narrow_witness(dep, group, device: str):
    """A request whose tokens pass ``group``'s row (its first block past it) in row 0, another request in row 1
    (the row the load reads), beside an attention group sized for ``max_model_len``."""
    from kvfence.contracts.slot_mapping.case import Group

    q = 1 + dep.spec_tokens
    first = min(group.blocks * group.block_size, dep.max_model_len - q)
    return _run(dep, (Group(dep.block_size), Group(group.block_size, group.blocks)),
                ((0, first, q), (1, 0, q)), device)


def slot_verdicts(dep, out: Path, device: str) -> List[Verdict]:
    from kvfence.contracts.slot_mapping.case import Group
    from kvfence.contracts.slot_mapping.record import SLOT_MAPPING
    from kvfence.engine import kernels
    from kvfence.release.upstream import NO_KERNEL, Refused

    v = Verdict(NAME, "not affected", site=SITE, evidence=[f"vllm {dep.version}: {e}" for e in EVIDENCE.get(
        dep.version, ())])
    if dep.version == "0.33.0":
        v.reach = ("0.33.0 runs model runner V1 instead where V2 lacks a feature (config/vllm.py:731-767); V1's "
                   "twin (v1/worker/block_table.py:319-376) has the same unbounded load and is not launched here")
    kernel = f"vllm=={dep.version}"
    step(f"{NAME}: reading {kernel}'s kernel")
    try:
        kernels.resolve(SLOT_MAPPING, kernel)
    except Refused as exc:
        v.status, v.condition = ("not launched" if exc.status == NO_KERNEL else "unknown"), str(exc)
        return [v]
    except BadInput as exc:  # no wheel (offline, or no such release)
        v.status, v.condition = "unknown", f"vllm {dep.version}'s kernel is not one kvfence can read: {exc}"
        return [v]
    M = dep.max_model_len
    reach = [g for g in dep.kv_groups if g.blocks * g.block_size < M]
    if reach:
        g = reach[0]
        step(f"{NAME}: running {kernel}'s kernel past a row of {g.blocks} block(s) of {g.block_size} tokens")
        launch, findings, note = _narrow_witness(dep, g, device)
        v.seen, v.arithmetic, v.case_file = _kinds(launch, findings, out, device, dep)
        base = (f"the declared group (--kv-cache-group {g.block_size}:{g.blocks}) holds {g.blocks * g.block_size} "
                f"positions a row, max_model_len {M} lets a request's tokens reach position {M - 1}: from position "
                f"{g.blocks * g.block_size} on a token's block index passes its row and the load reads the next "
                f"row (vllm#53982){note}")
        if not any(k in DAMAGE for k in v.seen):
            v.status = "unknown"
            v.condition = f"{base}; but the release's kernel showed {', '.join(v.seen) or 'nothing'} there"
            return [v]
        v.status, v.severity, v.impact, v.condition = "affected", SILENT, IMPACT, base

        def overflows(version: str) -> Optional[bool]:
            from dataclasses import replace

            try:
                kernels.resolve(SLOT_MAPPING, f"vllm=={version}")
                later, found, _ = _narrow_witness(replace(dep, version=version), g, device)
            except BadInput:
                return None
            return any(f.kind.value in DAMAGE for f in found)

        from kvfence.release.affected_vllm import vllm_releases

        v.fixed_in, v.fixed_text = fixed_in(dep.version, vllm_releases(), overflows)
        v.fixed_text += "; the open fix is vllm#54296 (block_indices < block_table_stride in the load's mask)"
        return [v]
    known, how = _groups_known(dep)
    declared = ("; the declared group(s) " + ", ".join(f"{g.block_size}:{g.blocks}" for g in dep.kv_groups)
                + f" hold every position below max_model_len {M}") if dep.kv_groups else ""
    if known is None:
        step(f"{NAME}: running {kernel}'s kernel past a row of one block")
        launch, findings, note = _narrow_witness(dep, Group(dep.block_size, 1), device)
        seen, _, v.case_file = _kinds(launch, findings, out, device, dep)
        v.status = "unknown"
        v.condition = (f"the load past a row needs a KV-cache group that takes the slot mapping and whose row is "
                       f"narrower than the positions below max_model_len (vllm#53982): {how}{declared}; the cache "
                       f"specs of vLLM {dep.version}'s own that take the slot mapping hold every position below "
                       "max_model_len (docs/contract.md §11), a cache type of the model's own may not "
                       "(declare one with kvfence's --kv-cache-group BLOCK_SIZE:BLOCKS, or give a model whose "
                       "config.json is on this host); were one there, the release's kernel showed "
                       f"{', '.join(seen) or 'nothing'} on a row of one block{note}")
        return [v]
    q = 1 + dep.spec_tokens
    groups = (Group(dep.block_size),)
    step(f"{NAME}: running {kernel}'s kernel on the longest admitted launch")
    launch, findings, note = _run(dep, groups, ((0, M - q, q), (1, max(0, M - 2 * q), q)), device)
    v.seen, v.arithmetic, v.case_file = _kinds(launch, findings, out, device, dep)
    blocks = -(-M // (dep.block_size * dep.dcp))
    v.condition = (f"{how}: every group's row holds cdiv(max_model_len, block_size * dcp) = {blocks} block(s) at "
                   f"block {dep.block_size}, and the scheduler keeps positions below max_model_len {M}: no block "
                   f"index passes its row (arithmetic){declared}; the release's kernel on the longest admitted "
                   f"launch ({q} token(s) up to position {M - 1}) "
                   + ("mapped every token to its own row's blocks" if not v.seen and not v.arithmetic else
                      f"showed {', '.join(v.seen + v.arithmetic)}") + note)
    if v.seen or v.arithmetic:  # a launch inside its rows is clean: anything else is not understood
        v.status = "unknown"
    return [v]
