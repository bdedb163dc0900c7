"""The slot-mapping contract (docs/contract.md §11): ``slot-mapping``, a *read* contract.

vLLM's model runner V2 computes each token's KV slot per KV-cache group with ``_compute_slot_mappings_kernel``
(``vllm/v1/worker/gpu/block_table.py`` in 0.33.0 and 0.34.0): the slot of position ``p`` is
``block_table[row, p // block_size] * block_size + p % block_size``, and the load of the block id is masked by
``is_local & is_real_req`` only, not by the row's width (its stride). A position whose block index passes its
group's row reads the next row of the table, another request's blocks (vllm#53982; the open fix vllm#54296 adds
``block_index < stride`` and PAD). The slot mapping tells the attention layers where to *write* each token's KV,
so such a slot names a block of another request.

The block tables are inputs laid out as vLLM lays them out, rows contiguous (the kernel's only bound is the
stride, which is the row width; a guard between rows would be inside that bound), with a guard row of poison
before the first row (row -1 of the kernel's table, a dummy request's row: ``_guarded_rows``), the engine's guard
poison after the last, and every row no request of the launch owns filled with poison: a slot derived from a guard
or a spare row is ``POISON_READ`` on any device (and on the CPU a load past the last row an ``OOB_READ`` of the
address audit); a slot derived from another request's row is ``VALUE_MISMATCH``: the oracle says PAD there.

This module is the record; the case and oracle are ``case``, the draws ``strategies``, the kernel
``kvfence.kernels.slot_mapping``, what vLLM's wheels ship ``shipped``.
"""

from __future__ import annotations

import functools
import importlib
from collections import OrderedDict
from dataclasses import asdict
from typing import Dict, List, NamedTuple, Tuple

from kvfence.contract import Contract, Keys, Mutant, Table
from kvfence.contracts.slot_mapping import case as model
from kvfence.contracts.slot_mapping.case import PAD, SPARE_POISON, Group, SlotCase
from kvfence.errors import require

KERNEL_MODULE = "kvfence.kernels.slot_mapping.compute_slot_mappings"
#: What catches a slot read past a row: the poison of a guard or a spare row, another request's block id, a load
#: outside the table's rows (the CPU's address audit).
READ_PAST = ("POISON_READ", "VALUE_MISMATCH", "OOB_READ")
#: The guard row before each block table's first row holds ``GUARD_ROW_POISON - column``: below every spare row's
#: poison (``SPARE_POISON - position``, positions < 2**20), so a value says which it came from.
GUARD_ROW_POISON = 2 * SPARE_POISON


class Program(NamedTuple):
    """A program of the kernel's grid ``(groups, requests + 1)``, in findings ``(group 0, request 2)`` (request
    ``num_reqs``: the program that pads the tokens past the last request)."""

    group: int
    request: int


def _widest_span(case: SlotCase) -> int:
    spans = [grp.block_size * case.shards(g) for g, grp in enumerate(case.groups) if grp.blocks is None]
    return max(spans or [1])


# -- sizings: (case, mode) -> the tokens the block tables are sized for ----------------------------------------
def _safe(case: SlotCase, mode: str) -> int:
    """ctx tokens: a row of ceil(ctx / (block_size * shards)) blocks holds every position below the context.

    vLLM sizes a group's row the same way (``max_num_blocks_per_req(max_model_len)``,
    ``v1/kv_cache_interface.py:279-289`` and ``:621-626`` in 0.34.0), then rounds it up to 128 tokens' worth of
    blocks (``get_block_table_width``, ``:337-349``), which only widens it."""
    return case.ctx


def _block_floor(case: SlotCase, mode: str) -> int:
    """ctx rounded down to the widest block span: a row short of the context's partial last block."""
    span = _widest_span(case)
    return max(1, case.ctx // span * span)


def _per_rank(case: SlotCase, mode: str) -> int:
    """ctx / cp_size tokens: the context one rank holds, taken for the context (the row formula divides again).

    Under context parallelism a sharded group's row then holds a cp_size-th of the context's blocks, an unsharded
    group's too; without it the policy is ``safe``."""
    return max(1, case.ctx // case.cp_size)


SIZINGS = {"safe": _safe, "block-floor": _block_floor, "per-rank": _per_rank}

_ROW = "row = tl.load(idx_mapping + b)"
_READ = "read = tl.where(real & enabled, mine & inside & in_req, False)"
MUTANTS = (
    Mutant("release_unguarded_load", "The released kernel's load (vLLM 0.33.0 / 0.34.0, block_table.py:404-413): "
           "masked by is_local & is_real_req only, no bound by the row's stride, and the slot derived from what it "
           "read.", READ_PAST, (("inside = j < row_width", "inside = j >= 0  # BUG: no row bound"),)),
    Mutant("guard_one_past", "The row guard lets the first block past the row through (<= stride).", READ_PAST,
           (("inside = j < row_width", "inside = j <= row_width  # BUG: one past"),)),
    Mutant("guard_without_pad", "The load is guarded but the slot is not padded: other=0 makes a slot in block 0 "
           "(what vllm#54296 pads explicitly).", ("VALUE_MISMATCH",),
           (("slot = tl.where(read, slot, PAD_ID)",
             "slot = tl.where(real & enabled, tl.where(mine & in_req, slot, PAD_ID), PAD_ID)  # BUG: no PAD past "
             "the row"),)),
    Mutant("dummy_row_read", "A dummy request's row (-1) is read and its slots derived from it: the row before the "
           "table's first, the guard row's poison in the slot on any device.", ("POISON_READ",),
           ((_READ, "read = tl.where(enabled, mine & inside & in_req, False)  # BUG: a dummy's row -1 is read"),)),
    Mutant("row_from_batch_index", "Reads row b (the batch index) instead of idx_mapping[b].",
           ("VALUE_MISMATCH", "POISON_READ"), ((_ROW, "row = b + 0 * tl.load(idx_mapping + b)  # BUG"),)),
    Mutant("group0_block_size", "Every group takes group 0's block size.", ("VALUE_MISMATCH", "POISON_READ",
                                                                            "OOB_READ"),
           (("block_size = tl.load(block_sizes + group)", "block_size = tl.load(block_sizes + 0 * group)  # BUG"),)),
    Mutant("enabled_ignored", "A group without a slot mapping gets slots.", ("VALUE_MISMATCH",),
           ((_READ, "read = tl.where(real, mine & inside & in_req, False)  # BUG: enabled ignored"),)),
    Mutant("cp_owner_ignored", "Under context parallelism every rank maps every token.", ("VALUE_MISMATCH",),
           (("mine = tl.where(sharded, owner == cp_rank, True)",
             "mine = tl.where(sharded, owner >= 0, True)  # BUG"),)),
    Mutant("tail_starts_one_late", "The last program pads from one past the batch's last token: the first "
           "padded column keeps what it held before the launch.", ("MISSING_WRITE",),
           (("first = tl.load(query_start_loc + b)", "first = tl.load(query_start_loc + b) + 1  # BUG"),)),
    Mutant("sizing_block_floor", "Tables sized for ctx rounded down to a block: the context's last partial block "
           "has no column.", ("SIZING_VIOLATION",), sizing="block-floor"),
    Mutant("sizing_per_rank", "Tables sized for the tokens one context-parallel rank holds (ctx / cp_size).",
           ("SIZING_VIOLATION",), sizing="per-rank"),
)


class SlotMapping(Contract[SlotCase]):
    name = "slot-mapping"
    doc = "docs/contract.md §11"
    reference = f"{KERNEL_MODULE}:compute_slot_mappings_kernel"
    sizings = SIZINGS
    mutants = MUTANTS

    def cases(self, domain):
        from kvfence.contracts.slot_mapping.strategies import slot_cases

        # Triton's interpreter (3.9) cannot run vLLM's context-parallel branch (``~sharded | is_local``: a scalar
        # bool joined with a block is integers there, which a masked load refuses; kvfence's kernel joins them
        # with tl.where), so on the CPU only kvfence's own kernels are drawn with context parallelism; on the GPU
        # every kernel is.
        own = domain.kernel == "reference" or domain.kernel.startswith("mutant:")
        cp = (1, 1, 2, 4) if domain.name == "gpu" or own else (1,)
        return slot_cases(domain.name, cp).map(
            lambda f: SlotCase(**dict(f, groups=tuple(Group(**g) for g in f["groups"]))).validate())

    def to_json(self, case: SlotCase) -> dict:
        data = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(case).items()}
        data["groups"] = [asdict(g) for g in case.groups]
        return data

    def from_json(self, data) -> SlotCase:
        require(isinstance(data, dict), "case: expected an object")
        ints = ("ctx", "table_rows", "pad", "cp_size", "cp_rank", "cp_interleave", "tile", "seed")
        lists = ("req_rows", "starts", "query_lens")
        unknown = sorted(set(data) - set(ints) - set(lists) - {"groups"})
        require(not unknown, f"case: unknown field(s) {', '.join(unknown)}")
        missing = sorted({"ctx", "groups", "table_rows", *lists} - set(data))
        require(not missing, f"case: missing field(s) {', '.join(missing)}")
        for key in ints:
            require(type(data.get(key, 0)) is int, f"case: {key} must be an integer")
        for key in lists:
            require(isinstance(data[key], list) and all(type(v) is int for v in data[key]),
                    f"case: {key} must be a list of integers")
        groups = data["groups"]
        require(isinstance(groups, list) and groups and len(groups) <= model.MAX_GROUPS,
                f"case: groups must be a list of 1 to {model.MAX_GROUPS} objects")
        built = []
        for g in groups:
            require(isinstance(g, dict) and set(g) <= {"block_size", "blocks", "enabled", "sharded"}
                    and "block_size" in g, "case: a group is an object with block_size, blocks, enabled, sharded")
            require(type(g["block_size"]) is int and (g.get("blocks") is None or type(g["blocks"]) is int),
                    "case: a group's block_size must be an integer, its blocks an integer or null")
            require(type(g.get("enabled", True)) is bool and type(g.get("sharded", True)) is bool,
                    "case: a group's enabled and sharded must be true or false")
            built.append(Group(g["block_size"], g.get("blocks"), g.get("enabled", True), g.get("sharded", True)))
        fields = {k: data[k] for k in ints if k in data}
        return SlotCase(groups=tuple(built), req_rows=tuple(data["req_rows"]), starts=tuple(data["starts"]),
                        query_lens=tuple(data["query_lens"]), **fields).validate()

    def tables(self, launch) -> List[Table]:
        case = launch.case
        blocks = model.row_blocks(case, launch.width)
        n, groups = case.num_reqs, len(case.groups)
        out = [Table(f"block_table_{g}", blocks[g], case.table_rows + 1, "input",
                     functools.partial(_guarded_rows, case, g, blocks[g]), guards="ends") for g in range(groups)]
        return out + [
            Table("idx_mapping", n, None, "input", list(case.req_rows)),
            Table("query_start_loc", n + 1, None, "input", case.query_start_loc()),
            Table("positions", case.num_tokens, None, "input", case.positions(), dtype="int64"),
            Table("block_sizes", groups, None, "input", [g.block_size for g in case.groups]),
            Table("slot_mapping_enabled", groups, None, "input", [int(g.enabled) for g in case.groups], dtype="int8"),
            Table("dcp_sharded", groups, None, "input", [int(g.sharded) for g in case.groups], dtype="int8"),
            Table("slot_mappings", case.max_num_tokens, groups, "output", dtype="int64"),
        ]

    def expected(self, launch) -> Dict[str, Dict[Tuple[int, int], int]]:
        return {"slot_mappings": model.oracle(launch.case, launch.width)}

    def need(self, launch) -> int:
        return model.need(launch.case)

    def launch(self, kernel, buffers, launch) -> None:
        import torch

        case = launch.case
        module = importlib.import_module(KERNEL_MODULE)
        # The kernel's table starts at row 1 of each buffer: row 0 is the guard row (``_guarded_rows``).
        ptrs, strides = _layout([buffers[f"block_table_{g}"][1:] for g in range(len(case.groups))])
        module.launch(kernel, slot_mappings=buffers["slot_mappings"], idx_mapping=buffers["idx_mapping"],
                      query_start_loc=buffers["query_start_loc"], positions=buffers["positions"],
                      block_table_ptrs=ptrs, block_table_strides=strides, block_sizes=buffers["block_sizes"],
                      slot_mapping_enabled=buffers["slot_mapping_enabled"].view(torch.bool),
                      dcp_sharded=buffers["dcp_sharded"].view(torch.bool), cp_rank=case.cp_rank,
                      cp_size=case.cp_size, cp_interleave=case.cp_interleave, pad_id=PAD, tile=case.tile)

    def keys(self, launch) -> Keys:
        """Config: the groups (their count first: the coverage plot's panels), the context, context parallelism,
        the tile; structure: where each request's tokens fall against each row (inside, the first block past it,
        further) and which rows are dummies; compile: the constexprs and the group count."""
        case = launch.case
        blocks = model.row_blocks(case, launch.width)
        reach = model.reach(case, launch.width)
        classes = tuple(tuple(() if not r else (max(-1, min(r[0], 1)), max(-1, min(r[1], 1))) for r in per)
                        for per in reach)
        rows = tuple(r >= 0 for r in case.req_rows)
        return Keys(config=(("groups", len(case.groups)),
                            ("block_sizes", tuple(g.block_size for g in case.groups)),
                            ("narrow", tuple(g.blocks or 0 for g in case.groups)),
                            ("enabled", tuple(g.enabled for g in case.groups)), ("ctx", case.ctx),
                            ("cp", (case.cp_size, case.cp_rank, case.cp_interleave)), ("tile", case.tile)),
                    structure=(classes, rows, case.query_lens, case.pad, blocks),
                    compile=(len(case.groups), case.cp_size, case.cp_interleave, case.tile),
                    reads=(case.starts, case.req_rows, case.table_rows), edges=edges(case, launch.width),
                    requests=case.num_reqs)

    def owner(self, launch, table, row, column):
        case = launch.case
        if table != "slot_mappings":
            return None
        if column >= case.num_tokens:
            return Program(row, case.num_reqs)
        return Program(row, model.token_owner(case)[column])


def _guarded_rows(case: SlotCase, g: int, blocks: int):
    """Group ``g``'s buffer: a guard row of poison (``GUARD_ROW_POISON - column``), then the block table's rows
    (``model.block_table``). The kernel gets the address of the table's first row, so row ``-1`` (a dummy
    request's ``idx_mapping``) is the guard row, a whole row wide: a slot derived from it is ``POISON_READ`` on any
    device, where the engine's front guard (64 elements) would leave a wider row's load before the allocation."""
    import numpy as np

    guard = GUARD_ROW_POISON - np.arange(blocks, dtype=np.int64)
    return np.vstack([guard[None, :], model.block_table(case, g, blocks)]).astype(np.int32)


def edges(case: SlotCase, width: int) -> Tuple[str, ...]:
    """The edge classes a launch sits on (the summary counts them)."""
    reach = model.reach(case, width)
    out = set()
    owned = {r for r in case.req_rows if r >= 0}
    for g, per in enumerate(reach):
        for b, r in enumerate(per):
            if not r or r[1] < 0:
                continue
            out.add("past the row")
            if r[0] <= 0 <= r[1]:
                out.add("first block past the row")
            row = case.req_rows[b]
            out.add("last row" if row == case.table_rows - 1 else
                    "next row owned" if row + 1 in owned else "next row spare")
            if case.groups[g].blocks is None:
                out.add("row narrower than the context")
    if any(r < 0 for r in case.req_rows):
        out.add("dummy request")
    if not all(g.enabled for g in case.groups):
        out.add("group without slot mapping")
    if case.cp_size > 1:
        out.add("context parallel")
    if any(q > case.tile for q in case.query_lens):
        out.add("request longer than the tile")
    return tuple(sorted(out))


#: The block-table address and stride tables of recent launches, by the views they describe. A CUDA-graph capture
#: may not copy from the host, so the launch that compiles (outside the capture) makes them and the captured
#: launch of the same views finds them here; the key holds every value the tables hold, so a hit is always right.
_LAYOUTS: "OrderedDict[tuple, tuple]" = OrderedDict()


def _layout(views) -> tuple:
    import torch

    key = tuple((str(v.device), v.data_ptr(), v.stride(0)) for v in views)
    found = _LAYOUTS.get(key)
    if found is None:
        device = views[0].device
        found = (torch.tensor([v.data_ptr() for v in views], dtype=torch.uint64, device=device),
                 torch.tensor([v.stride(0) for v in views], dtype=torch.int64, device=device))
        _LAYOUTS[key] = found
        while len(_LAYOUTS) > 16:
            _LAYOUTS.popitem(last=False)
    return found


SLOT_MAPPING = SlotMapping()
