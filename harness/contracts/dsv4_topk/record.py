"""The DeepSeek-V4 top-k global-index contract (docs/contract.md §12): ``dsv4-topk-indices``, a *read* contract.

vLLM's DeepSeek-V4 and V4.1 sparse attention map each token's local top-k indices (compressed-token positions, -1
for none) to KV-cache slots through the request's block-table row before the sparse MLA kernel gathers them
(``compute_global_topk_indices_and_lens``, ``vllm/models/deepseek_v4/common/ops/cache_utils.py`` and its V4.1 twin
in 0.34.0). The indices of a CUDA-graph padding token are whatever the buffer every indexer layer shares last held
(a ``torch.empty``), and the released kernel's block-table load is masked by ``idx >= 0`` only: an index past the
row reads the next request's row or past the table (vllm#56771; the open fix vllm#57388 bounds ``idx // B`` by the
row and gates the load by ``is_valid_token``).

The block table is an input laid out as vLLM lays it out, rows contiguous (the kernel's row stride is the row's
width), guard poison before the first row and after the last, and every row no token names filled with poison: a
slot derived from a guard or a spare row is ``POISON_READ`` (on the CPU, a load outside the table an ``OOB_READ``
of the address audit); a slot derived from another request's row is ``VALUE_MISMATCH`` (the oracle says -1).

This module is the record; the case and oracle are ``case``, the draws ``strategies``, the kernel
``kvfence.kernels.dsv4_topk``, what vLLM's wheels ship ``shipped``, the planted bugs of the release's own text
``release_mutants``.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict
from typing import List, NamedTuple

from kvfence.contract import Contract, Keys, Mutant, Table
from kvfence.contracts.dsv4_topk import case as model
from kvfence.contracts.dsv4_topk.case import TopkCase
from kvfence.contracts.dsv4_topk.release_mutants import READ_PAST, READ_UNBOUNDED, release_mutants
from kvfence.errors import require

KERNEL_MODULE = "kvfence.kernels.dsv4_topk.global_topk_indices"


class Program(NamedTuple):
    """A program of the kernel's grid ``(num_tokens,)``, in findings ``token 7``."""

    token: int


def _safe(case: TopkCase, mode: str) -> int:
    """ctx compressed tokens: vLLM's row holds ``cdiv(max_model_len, cache_block_size)`` blocks of ``B =
    cache_block_size // compress_ratio`` compressed tokens (0.34.0 ``v1/kv_cache_interface.py:621-626``), every
    compressed position of the context."""
    return case.ctx


def _block_floor(case: TopkCase, mode: str) -> int:
    """ctx rounded down to a block: a row short of the context's partial last block."""
    return max(1, case.ctx // case.block_size * case.block_size)


SIZINGS = {"safe": _safe, "block-floor": _block_floor}

_INSIDE = "inside = (local_idx >= 0) & (block_indices < block_table_stride)"
_MAPPED = "mapped = tl.where(is_valid_token, in_topk & inside, False)"
_SLOT = "slot_ids = tl.where(mapped, block_numbers * block_size + local_idx % block_size, -1)"
MUTANTS = (
    Mutant("release_unbounded_load", "The released kernel's load (vLLM 0.34.0, cache_utils.py:624-628): masked by "
           "idx >= 0 only, no row bound, no is_valid_token gate; the slot derived from what it read.", READ_UNBOUNDED,
           ((_INSIDE, "inside = local_idx >= 0  # BUG: no row bound"),
            (_MAPPED, "mapped = in_topk & inside  # BUG: no valid-token gate"),
            ("count += tl.sum(mapped.to(tl.int32), axis=0)",
             "count += tl.sum(tl.where(is_valid_token, mapped, False).to(tl.int32), axis=0)"))),
    Mutant("ungated_bound_one_past", "The valid-token gate dropped and the row bound one block too far (<= the "
           "stride): a padding token's index in the first block past the row reads the next row.", READ_PAST,
           ((_INSIDE, "inside = (local_idx >= 0) & (block_indices <= block_table_stride)  # BUG: one past"),
            (_MAPPED, "mapped = in_topk & inside  # BUG: no valid-token gate"),
            ("count += tl.sum(mapped.to(tl.int32), axis=0)",
             "count += tl.sum(tl.where(is_valid_token, mapped, False).to(tl.int32), axis=0)"))),
    Mutant("offset_dropped", "The slot is the block's first slot: idx % B dropped.", ("VALUE_MISMATCH",),
           ((_SLOT, "slot_ids = tl.where(mapped, block_numbers * block_size, -1)  # BUG"),)),
    Mutant("row_of_token", "Token t reads block-table row t instead of token_to_req_indices[t].",
           READ_PAST, (("req_idx = tl.load(token_to_req_indices_ptr + token_idx).to(tl.int64)",
                        "req_idx = (token_idx + 0 * tl.load(token_to_req_indices_ptr + token_idx)).to(tl.int64)"),)),
    Mutant("stride_is_topk", "Row req is found at req * topk (the indices' stride), not the table's.", READ_PAST,
           (("row = block_table_ptr + req_idx * block_table_stride",
             "row = block_table_ptr + req_idx * topk  # BUG"),)),
    Mutant("lens_count_padding", "topk_lens counts a padding token's non-negative indices (not zeroed).",
           ("VALUE_MISMATCH",), (("count += tl.sum(mapped.to(tl.int32), axis=0)",
                                  "count += tl.sum((in_topk & (local_idx >= 0)).to(tl.int32), axis=0)  # BUG"),)),
    Mutant("none_is_zero", "An index without a slot maps to 0, not -1.", ("VALUE_MISMATCH",),
           ((_SLOT, "slot_ids = tl.where(mapped, block_numbers * block_size + local_idx % block_size, 0)  # BUG"),)),
    Mutant("sizing_block_floor", "Rows sized for the context rounded down to a block: a valid token's index in the "
           "context's partial last block has no column.", ("SIZING_VIOLATION",), sizing="block-floor"),
)


class Dsv4TopkIndices(Contract[TopkCase]):
    name = "dsv4-topk-indices"
    doc = "docs/contract.md §12"
    reference = f"{KERNEL_MODULE}:global_topk_indices_kernel"
    sizings = SIZINGS

    # A property for the data member: read when asked, since the release's planted bugs import release tooling.
    @property
    def mutants(self) -> tuple:  # type: ignore[override]
        return MUTANTS + release_mutants()

    def cases(self, domain):
        from kvfence.contracts.dsv4_topk.strategies import topk_cases

        return topk_cases(domain.name).map(lambda fields: TopkCase(**fields).validate())

    def to_json(self, case: TopkCase) -> dict:
        data = asdict(case)
        data.update(reqs=list(case.reqs), valid=list(case.valid), indices=[list(r) for r in case.indices])
        return data

    def from_json(self, data) -> TopkCase:
        require(isinstance(data, dict), "case: expected an object")
        ints = ("block_size", "ctx", "topk", "table_rows", "tile", "seed")
        unknown = sorted(set(data) - set(ints) - {"reqs", "valid", "indices"})
        require(not unknown, f"case: unknown field(s) {', '.join(unknown)}")
        missing = sorted({"block_size", "ctx", "topk", "table_rows", "reqs", "valid", "indices"} - set(data))
        require(not missing, f"case: missing field(s) {', '.join(missing)}")
        for key in ints:
            require(type(data.get(key, 0)) is int, f"case: {key} must be an integer")
        reqs, valid, indices = data["reqs"], data["valid"], data["indices"]
        require(isinstance(reqs, list) and all(type(r) is int for r in reqs), "case: reqs must be a list of integers")
        require(isinstance(valid, list) and all(type(v) is bool for v in valid),
                "case: valid must be a list of true/false")
        require(isinstance(indices, list) and len(indices) <= model.MAX_TOKENS and all(
            isinstance(row, list) and len(row) <= model.MAX_TOPK and all(type(i) is int for i in row)
            for row in indices), "case: indices must be a list of lists of integers")
        fields = {k: data[k] for k in ints if k in data}
        return TopkCase(reqs=tuple(reqs), valid=tuple(valid), indices=tuple(tuple(r) for r in indices),
                        **fields).validate()

    def tables(self, launch) -> List[Table]:
        case = launch.case
        blocks = model.row_blocks(case, launch.width)
        return [
            Table("block_table", blocks, case.table_rows, "input", lambda: model.block_table(case, blocks),
                  guards="ends"),
            Table("topk_indices", case.topk, case.num_tokens, "input", [list(r) for r in case.indices]),
            Table("token_to_req_indices", case.num_tokens, None, "input", list(case.reqs)),
            Table("is_valid_token", case.num_tokens, None, "input", [int(v) for v in case.valid], dtype="int8"),
            Table("global_topk_indices", case.topk, case.num_tokens, "output"),
            Table("topk_lens", case.num_tokens, None, "output"),
        ]

    def expected(self, launch):
        return model.oracle(launch.case, launch.width)

    def need(self, launch) -> int:
        return model.need(launch.case)

    def launch(self, kernel, buffers, launch) -> None:
        import torch

        importlib.import_module(KERNEL_MODULE).launch(
            kernel, global_topk_indices=buffers["global_topk_indices"], topk_lens=buffers["topk_lens"],
            topk_indices=buffers["topk_indices"], token_to_req_indices=buffers["token_to_req_indices"],
            block_table=buffers["block_table"], block_size=launch.case.block_size,
            is_valid_token=buffers["is_valid_token"].view(torch.bool), tile=launch.case.tile)

    def keys(self, launch) -> Keys:
        """Config: the block size (the coverage plot's panels), topk, the context, the tile; structure: which tokens
        are padding and how each token's indices sit against its row; compile: the constexprs (the strides, the row
        width, topk, the block size, the tile)."""
        case = launch.case
        blocks = model.row_blocks(case, launch.width)
        return Keys(config=(("block_size", case.block_size), ("topk", case.topk), ("ctx", case.ctx),
                            ("tile", case.tile)),
                    structure=(case.valid, model.reach(case, launch.width), case.table_rows),
                    compile=(case.block_size, case.topk, blocks, case.tile, launch.layout),
                    reads=(case.reqs, case.seed), edges=edges(case, launch.width), requests=case.table_rows)

    def owner(self, launch, table, row, column):
        if table == "global_topk_indices":
            return Program(row)
        return Program(column) if table == "topk_lens" else None


def edges(case: TopkCase, width: int):
    """The edge classes a launch sits on (the summary counts them)."""
    blocks = model.row_blocks(case, width)
    wall = blocks * case.block_size
    out = set()
    for req, valid, row in zip(case.reqs, case.valid, case.indices):
        who = "valid token" if valid else "padding token"
        for idx in row:
            if idx == wall - 1:
                out.add(f"{who}: index at the row's last position")
            elif idx == wall:
                out.add(f"{who}: index at the wall (W * B)")
            elif idx == wall + 1:
                out.add(f"{who}: index one past the wall")
            elif idx > wall:
                out.add(f"{who}: index past the row")
        if not valid and req == case.table_rows - 1 and any(i >= wall for i in row):
            out.add("padding token past the last row")
    if case.topk > case.tile:
        out.add("topk longer than the tile")
    return tuple(sorted(out))


DSV4_TOPK = Dsv4TopkIndices()
