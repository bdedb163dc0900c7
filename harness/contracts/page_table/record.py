"""The page-table builder contracts (docs/contract.md §9): ``flashmla-page-table`` and ``trtllm-mha-page-table``.

Both kernels turn each request's token slots into a row of page ids: page ``j`` of request ``b`` is
``req_to_token[rpi_b, start_b + j*P] // P`` for ``j < ceil(L_b / P)``, in row ``b`` of a table ``W`` pages
wide. They bound their stores by the length, not by ``W``, and launch ``ceil(W / (4096 / P))`` page blocks
per request. So ``ceil(L_b / P) > W`` writes past the row (into the next row, in production's contiguous
table) as far as the launched blocks reach, and drops the rest; the consumer, told ``L_b``, reads past its
row either way. The lengths include draft tokens (target verify passes ``seq_len + draft tokens``), while
graph-mode tables are commonly ``ceil(context_len / P)`` wide: that is the ``context`` sizing.

This module is the contracts' record (``kvfence.contract.Contract``): the case, the plain-Python oracle, the
sizing policies, the mutants. Draws: ``strategies``; kernels: ``kvfence.kernels.page_table``; what releases
ship: ``shipped``.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import asdict, dataclass
from typing import Dict, List, NamedTuple, Optional, Tuple

from kvfence.contract import Contract, FindingKind, Keys, Mutant, Table
from kvfence.engine.findings import ContractKind, Finding
from kvfence.errors import require

TABLE_TRUNCATED = "TABLE_TRUNCATED"
#: Tokens one program covers along grid axis 1, in both kernels (docs/contract.md §9).
BLOCK_TOKENS = 4096
PAGE_SIZES = (1, 16, 32, 64, 128)


class Program(NamedTuple):
    """A program of the builder's grid ``(num_seqs, blocks)``, in findings ``(request 2, block 0)``."""

    request: int
    block: int


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class PageTableCase:
    """One launch: the config (page size, the model's context length, the draft tokens a length may carry
    past it, SWA / start offsets) and the batch (lengths, pool rows, the slot layout's seed)."""

    page_size: int
    ctx: int
    draft_tokens: int
    seq_lens: Tuple[int, ...]
    req_pool_indices: Tuple[int, ...]
    pool_rows: int
    kv_start: Optional[Tuple[int, ...]] = None
    swa: bool = False
    seed: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def pool_len(self) -> int:
        """Width of a ``req_to_token`` row: every token a request of this launch can name."""
        starts = self.kv_start or (0,) * self.num_seqs
        return max([1] + [s + n for s, n in zip(starts, self.seq_lens)] + [self.ctx + self.draft_tokens])

    def start(self, b: int) -> int:
        return self.kv_start[b] if self.kv_start else 0

    def validate(self) -> "PageTableCase":
        require(self.page_size in PAGE_SIZES, f"page_size {self.page_size} is not one of {PAGE_SIZES}")
        require(self.ctx >= 1 and self.draft_tokens >= 0, "ctx must be >= 1 and draft_tokens >= 0")
        require(self.num_seqs >= 1, "a case needs at least one request")
        require(all(0 <= n <= self.ctx + self.draft_tokens for n in self.seq_lens),
                f"every length must be in [0, ctx + draft_tokens] = [0, {self.ctx + self.draft_tokens}]")
        require(len(self.req_pool_indices) == self.num_seqs
                and len(set(self.req_pool_indices)) == self.num_seqs
                and all(0 <= r < self.pool_rows for r in self.req_pool_indices),
                "req_pool_indices: one distinct pool row per request, each below pool_rows")
        require(self.kv_start is None or (len(self.kv_start) == self.num_seqs and min(self.kv_start) >= 0),
                "kv_start: one non-negative start per request, or null")
        require(self.pool_rows * cdiv(self.pool_len, self.page_size) * self.page_size < 2 ** 31,
                "slot ids must fit int32: fewer pool rows or a shorter context")
        require(0 <= self.seed < 1 << 32, "seed must be in [0, 2**32)")  # numpy's generator takes no negative seed
        return self


# -- the oracle: plain Python, docs/contract.md §9 ------------------------------------------------------------
@functools.lru_cache(maxsize=4)  # tables() and the oracle both read it, once per case
def slot_table(case: PageTableCase):
    """``req_to_token`` (a ``pool_rows x pool_len`` array): each pool row's pages are distinct physical pages (a
    seeded shuffle), and a token's slot is ``page * P + position mod P``, as a paged KV pool lays them out."""
    import numpy as np

    P, per_row = case.page_size, cdiv(case.pool_len, case.page_size)
    pages = np.random.default_rng(case.seed).permutation(case.pool_rows * per_row).reshape(case.pool_rows, per_row)
    t = np.arange(case.pool_len)
    return pages[:, t // P] * P + t % P


@functools.lru_cache(maxsize=4)
def swa_table(case: PageTableCase):
    """``full_to_swa``: slot -> SWA slot, a seeded permutation of page ids that keeps the offset in the page."""
    import numpy as np

    P = case.page_size
    pages = case.pool_rows * cdiv(case.pool_len, P)
    perm = np.random.default_rng(case.seed + 1).permutation(pages)
    s = np.arange(pages * P)
    return perm[s // P] * P + s % P


def pages_needed(case: PageTableCase, b: int) -> int:
    return cdiv(case.seq_lens[b], case.page_size)


def page_ids(case: PageTableCase) -> List[List[int]]:
    """Row ``b``: the page id of each of request ``b``'s pages, as long as its length needs."""
    slots, P = slot_table(case), case.page_size
    return [[int(slots[case.req_pool_indices[b]][case.start(b) + j * P]) // P for j in range(pages_needed(case, b))]
            for b in range(case.num_seqs)]


# -- sizings: (case, mode) -> row width in pages ---------------------------------------------------------------
def _safe(case: PageTableCase, mode: str) -> int:
    """``ceil((ctx + d) / P)``: room for the longest length the scheduler may pass, context plus draft tokens."""
    return cdiv(case.ctx + case.draft_tokens, case.page_size)


def _context(case: PageTableCase, mode: str) -> int:
    """``ceil(ctx / P)``: no room for draft tokens; the TRTLLM-MHA backend's static width in SGLang 0.5.23
    (``layers/attention/trtllm_mha_backend.py:351-353``, ``max_context_len`` = the model's context)."""
    return cdiv(case.ctx, case.page_size)


def _flashmla_graph(case: PageTableCase, mode: str) -> int:
    """``(ctx + P) // P``: the FlashMLA backend's CUDA-graph table in SGLang 0.5.23
    (``layers/attention/flashmla_backend.py:281-282``); one page over ``context_len``, which holds the draft
    tokens only while ``ctx mod P + draft_tokens <= P``."""
    return (case.ctx + case.page_size) // case.page_size


def _context_floor(case: PageTableCase, mode: str) -> int:
    """``max(1, ctx // P)``: a page short when the context is not a multiple of the page size."""
    return max(1, case.ctx // case.page_size)


SIZINGS = {"safe": _safe, "context": _context, "flashmla-graph": _flashmla_graph, "context-floor": _context_floor}


# -- the records ------------------------------------------------------------------------------------------------
class PageTableContract(Contract[PageTableCase]):
    doc = "docs/contract.md §9"
    kinds = (FindingKind(TABLE_TRUNCATED, observed=False,
                         doc="a row's length needs more pages than the row holds: the consumer, given that length, "
                             "reads past its table"),)
    sizings = SIZINGS

    def __init__(self, name: str, abi: str, kernel_module: str, attr: str, mutants):
        self.name, self.abi = name, abi
        self.kernel_module = f"kvfence.kernels.page_table.{kernel_module}"
        self.reference = f"{self.kernel_module}:{attr}"
        self.mutants = tuple(mutants)

    def cases(self, domain):
        from kvfence.contracts.page_table.strategies import page_table_cases

        return page_table_cases(self.abi, domain.name, PAGE_SIZES, BLOCK_TOKENS).map(
            lambda fields: PageTableCase(**fields).validate())

    def to_json(self, case: PageTableCase) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(case).items()}

    def from_json(self, data) -> PageTableCase:
        require(isinstance(data, dict), "case: expected an object")
        fields = {"page_size", "ctx", "draft_tokens", "seq_lens", "req_pool_indices", "pool_rows", "kv_start",
                  "swa", "seed"}
        unknown = sorted(set(data) - fields)
        require(not unknown, f"case: unknown field(s) {', '.join(unknown)}")

        def ints(key, optional=False):
            value = data.get(key)
            if optional and value is None:
                return None
            require(isinstance(value, list) and all(type(v) is int for v in value),
                    f"case: {key} must be a list of integers")
            return tuple(value)

        for key in ("page_size", "ctx", "draft_tokens", "pool_rows", "seed"):
            require(type(data.get(key)) is int, f"case: {key} must be an integer")
        require(type(data.get("swa", False)) is bool, "case: swa must be true or false")
        case = PageTableCase(data["page_size"], data["ctx"], data["draft_tokens"], ints("seq_lens"),
                             ints("req_pool_indices"), data["pool_rows"], ints("kv_start", True),
                             data.get("swa", False), data["seed"])
        require(self.abi == "flashmla" or case.kv_start is None, f"{self.name}: the ABI takes no kv_start")
        require(self.abi == "trtllm_mha" or not case.swa, f"{self.name}: the ABI has no SWA table")
        return case.validate()

    def _outputs(self) -> Tuple[str, ...]:
        return ("kv_indices",) if self.abi == "flashmla" else ("page_table", "swa_page_table")

    def tables(self, launch) -> List[Table]:
        case, width = launch.case, launch.width
        out = [Table("req_to_token", case.pool_len, case.pool_rows, "input", lambda: slot_table(case)),
               Table("req_pool_indices", case.num_seqs, None, "input", list(case.req_pool_indices)),
               Table("seq_lens", case.num_seqs, None, "input", list(case.seq_lens))]
        if case.kv_start:
            out.append(Table("kv_start", case.num_seqs, None, "input", list(case.kv_start)))
        if case.swa:
            slots = case.pool_rows * cdiv(case.pool_len, case.page_size) * case.page_size
            out.append(Table("full_to_swa", slots, None, "input", lambda: swa_table(case)))
        outputs = self._outputs() if case.swa or self.abi == "flashmla" else self._outputs()[:1]
        return out + [Table(name, width, case.num_seqs, "output") for name in outputs]

    def expected(self, launch) -> Dict[str, Dict[Tuple[int, int], int]]:
        case = launch.case
        ids = page_ids(case)
        first = {(b, j): v for b, row in enumerate(ids) for j, v in enumerate(row)}
        out = {self._outputs()[0]: first}
        if case.swa:
            slots, swa, P = slot_table(case), swa_table(case), case.page_size
            out["swa_page_table"] = {
                (b, j): int(swa[min(max(int(slots[case.req_pool_indices[b]][j * P]), 0), len(swa) - 1)]) // P
                for (b, j) in first}
        return out

    def need(self, launch) -> int:
        case = launch.case
        return max(pages_needed(case, b) for b in range(case.num_seqs))

    def launch(self, kernel, buffers, launch) -> None:
        module = importlib.import_module(self.kernel_module)
        common = dict(req_to_token=buffers["req_to_token"], req_pool_indices=buffers["req_pool_indices"],
                      seq_lens=buffers["seq_lens"], width=launch.width, page_size=launch.case.page_size)
        if self.abi == "flashmla":
            module.launch(kernel, kv_start=buffers.get("kv_start"), kv_indices=buffers["kv_indices"], **common)
        else:
            module.launch(kernel, full_to_swa=buffers.get("full_to_swa"), page_table=buffers["page_table"],
                          swa_page_table=buffers.get("swa_page_table"), **common)

    def keys(self, launch) -> Keys:
        """Config: what a backend fixes before the batch (page size first: the coverage plot's panels); structure:
        each row's page count and start, SWA (not the slot layout's seed nor which pool row is read); compile: the
        constexprs and both row strides (width and pool row length), which optional inputs are passed."""
        case, width = launch.case, launch.width
        pages = tuple(pages_needed(case, b) for b in range(case.num_seqs))
        # Ints, bools and tuples only: the structure's hash must be the same in every process (``--jobs`` merges
        # count structures across jobs), and hash(None) is not before Python 3.12 (no kv_start: an empty tuple).
        return Keys(config=(("page_size", case.page_size), ("ctx", case.ctx), ("draft_tokens", case.draft_tokens),
                            ("kv_start", case.kv_start is not None), ("swa", case.swa)),
                    structure=(case.page_size, pages, case.kv_start or (), case.swa),
                    compile=(case.page_size, width, case.pool_len, case.kv_start is not None, case.swa),
                    requests=case.num_seqs)

    def owner(self, launch, table, row, column):
        case = launch.case
        return Program(row, column * case.page_size // BLOCK_TOKENS) if column < pages_needed(case, row) else None

    def findings_before_launch(self, launch) -> list:
        """``TABLE_TRUNCATED`` per row whose length needs more pages than the row holds: arithmetic of the case
        and the width, whatever the kernel does with the pages that do not fit."""
        case, width, out = launch.case, launch.width, []
        for b in range(case.num_seqs):
            need = pages_needed(case, b)
            if need > width:
                out.append(Finding(ContractKind(TABLE_TRUNCATED), self._outputs()[0], f"row {b}", width, need, [],
                                   [Program(b, blk) for blk in range(cdiv(need * case.page_size, BLOCK_TOKENS))],
                                   f"length {case.seq_lens[b]} needs {need} pages, the width formula gives the row "
                                   f"{width}"))
        return out


def _mutants(kernel: str, *, swa: bool):
    """The planted bugs of one page-table kernel (docs/contract.md §9, "Bug classes")."""
    size = "PAGED_SIZE" if kernel == "flashmla" else "PAGE_SIZE"
    pages = f"num_pages = tl.cdiv(length, {size})"
    truncated = ("SIZING_VIOLATION", TABLE_TRUNCATED, "GUARD_OVERWRITE")
    out = [
        Mutant("page_count_floor", "The page count rounds down: a partial last page gets no id.",
               ("MISSING_WRITE",), ((pages, f"num_pages = length // {size}  # BUG: must round up"),)),
        Mutant("one_page_more", "One page more than the length needs is written (mask <= num_pages).",
               ("STRAY_WRITE", "GUARD_OVERWRITE", "VALUE_MISMATCH"),
               (("mask = page < num_pages", "mask = page <= num_pages  # BUG: one page too many"),)),
        Mutant("pool_row_from_request", "Reads pool row b instead of req_pool_indices[b].", ("VALUE_MISMATCH",),
               (("pool_row = tl.load(req_pool_indices + b).to(tl.int64)",
                 "pool_row = (b + 0 * tl.load(req_pool_indices + b)).to(tl.int64)  # BUG"),)),
        Mutant("sizing_context", "Graph-mode table sized ceil(context_len / P): no room for the draft tokens target "
               "verify adds to a length at the context wall.", truncated, sizing="context"),
        Mutant("sizing_context_floor", "Table sized context_len // P: a page short when the context is not a "
               "multiple of the page size.", truncated, sizing="context-floor"),
    ]
    if kernel == "flashmla":
        out.append(Mutant("start_ignored", "kv_start_idx is read but not added to the token position.",
                          ("VALUE_MISMATCH",), (("first_token = start + page.to(tl.int64) * PAGED_SIZE",
                                                 "first_token = 0 * start + page.to(tl.int64) * PAGED_SIZE  # BUG"),)))
    if swa:
        out.append(Mutant("swa_table_unmapped", "The SWA table gets the full table's page ids (the full_to_swa lookup "
                          "is skipped).", ("VALUE_MISMATCH",),
                          (("tl.store(swa_page_table + out, (swa_slot // PAGE_SIZE).to(tl.int32), mask=mask)",
                            "tl.store(swa_page_table + out, ((slot + 0 * swa_slot) // PAGE_SIZE).to(tl.int32), "
                            "mask=mask)  # BUG"),)))
    return out


#: The kinds a dropped, misplaced or mis-read page shows as (an output element's value, a write off the row).
_WRONG = ("MISSING_WRITE", "VALUE_MISMATCH", "STRAY_WRITE", "GUARD_OVERWRITE", "POISON_READ")


def _flashmla_release_mutants():
    """Planted bugs in the text of ``create_flashmla_kv_indices_triton`` as 0.5.23 ships it (and the kernel of PR
    #11985's era), made from the wheel at run time (``kvfence.contracts.page_table.release_mutants``)."""
    from kvfence.contracts.page_table.release_mutants import release_mutant

    name = "flashmla-page-table"
    guard = "    if i < num_pages_loop:\n"
    return [
        release_mutant(name, "release_block_guard_pages", "The page-block guard counts pages, not tokens, against "
                       "4096: at a page size over 1 a length past 4096 tokens gets one block, its later pages no id.",
                       ("MISSING_WRITE",),
                       (("num_pages_loop = tl.cdiv(kv_end - kv_start, FLASHMLA_CREATE_KV_BLOCK_SIZE_TRITON)",
                         "num_pages_loop = tl.cdiv(num_paged, FLASHMLA_CREATE_KV_BLOCK_SIZE_TRITON)"),)),
        release_mutant(name, "release_block_offset_64", "Block i's output offset is i * 64 pages, right only at "
                       "page 64: block 1 writes over block 0's pages (or short of its own).", _WRONG,
                       (("paged_offset_out = tl.arange(0, NUM_PAGE_PER_BLOCK) + i * NUM_PAGE_PER_BLOCK",
                         "paged_offset_out = tl.arange(0, NUM_PAGE_PER_BLOCK) + i * 64"),)),
        release_mutant(name, "release_blocks_capped_2", "The grid's page blocks are capped at two: pages past 8192 "
                       "tokens (the third block) get no id.", ("MISSING_WRITE",),
                       ((guard, "    if i < tl.minimum(num_pages_loop, 2):\n"),)),
        release_mutant(name, "release_blocks_capped_3", "Page blocks capped at three: pages past 12288 tokens get no "
                       "id (a scale bug: the CPU domain's lengths stop at 12288).", ("MISSING_WRITE",),
                       ((guard, "    if i < tl.minimum(num_pages_loop, 3):\n"),), domain="gpu"),
        release_mutant(name, "release_load_mask_floor", "The load mask counts whole pages: a partial last page is "
                       "not read, and the masked-off load's value is stored as its id.", _WRONG,
                       (("mask = paged_offset < num_paged * PAGED_SIZE",
                         "mask = paged_offset < (kv_end - kv_start) // PAGED_SIZE * PAGED_SIZE"),)),
        release_mutant(name, "release_pool_stride_from_output", "The req_to_token row is found with the output's row "
                       "stride: a request in pool row r > 0 reads another row (or past the pool).",
                       _WRONG + ("OOB_READ",),
                       (("+ req_pool_index * req_to_token_ptr_stride", "+ req_pool_index * kv_indices_ptr_stride"),)),
        release_mutant(name, "release_pr11985_kernel", "The kernel of PR #11985's era (0.4.10.post1 .. 0.5.3.post3): "
                       "64 pages per 4096-token block at every page size, so below page 64 a length past 64 pages "
                       "gets ids for its first 64 pages of each 4096 tokens only (launched as it shipped, with "
                       "NUM_PAGE_PER_BLOCK at its default, TRITON_PAD_NUM_PAGE_PER_BLOCK = 64).",
                       ("MISSING_WRITE",),
                       (("    NUM_PAGE_PER_BLOCK: tl.constexpr = TRITON_PAD_NUM_PAGE_PER_BLOCK,\n", ""),
                        ("    BLOCK_SIZE: tl.constexpr = 4096\n", "    BLOCK_SIZE: tl.constexpr = 4096\n"
                         "    NUM_PAGE_PER_BLOCK: tl.constexpr = 64  # the launch's default\n")),
                       version="0.5.3.post3"),
    ]


def _trtllm_mha_release_mutants():
    """Planted bugs in the text of ``create_trtllm_mha_kv_indices_triton`` as 0.5.23 ships it."""
    from kvfence.contracts.page_table.release_mutants import release_mutant

    name = "trtllm-mha-page-table"
    guard = "    if pid_blk >= num_page_blocks:\n"
    return [
        release_mutant(name, "release_block_guard_pages", "The page-block guard counts pages, not tokens, against "
                       "4096: at a page size over 1 a length past 4096 tokens gets one block, its later pages no id.",
                       ("MISSING_WRITE",),
                       (("num_page_blocks = tl.cdiv(seq_len, _MHA_KV_INDEX_BLOCK_TOKENS_TL)",
                         "num_page_blocks = tl.cdiv(num_pages, _MHA_KV_INDEX_BLOCK_TOKENS_TL)"),)),
        release_mutant(name, "release_block_offset_64", "Block pid_blk's pages start at pid_blk * 64, right only at "
                       "page 64: block 1 writes over block 0's pages (or short of its own).", _WRONG,
                       (("page_idx = tl.arange(0, PAGES_PER_BLOCK) + pid_blk * PAGES_PER_BLOCK",
                         "page_idx = tl.arange(0, PAGES_PER_BLOCK) + pid_blk * 64"),)),
        release_mutant(name, "release_blocks_capped_2", "The grid's page blocks are capped at two: pages past 8192 "
                       "tokens (the third block) get no id.", ("MISSING_WRITE",),
                       ((guard, "    if pid_blk >= tl.minimum(num_page_blocks, 2):\n"),)),
        release_mutant(name, "release_blocks_capped_3", "Page blocks capped at three: pages past 12288 tokens get no "
                       "id (a scale bug: the CPU domain's lengths stop at 12288).", ("MISSING_WRITE",),
                       ((guard, "    if pid_blk >= tl.minimum(num_page_blocks, 3):\n"),), domain="gpu"),
        release_mutant(name, "release_load_mask_floor", "The slot load's mask counts whole pages: a partial last page "
                       "is not read, and the masked-off load's value is stored as its id (and looked up for SWA).",
                       _WRONG, (("        mask=mask,\n    )\n",
                                 "        mask=page_idx < seq_len // PAGE_SIZE,\n    )\n"),)),
        release_mutant(name, "release_pool_stride_from_output", "The req_to_token row is found with the page "
                       "table's row stride: a request in pool row r > 0 reads another row (inside the pool: the "
                       "table's stride is the shorter).", _WRONG + ("OOB_READ",),
                       (("+ req_pool_index.to(tl.int64) * req_to_token_stride",
                         "+ req_pool_index.to(tl.int64) * page_table_stride"),)),
    ]


FLASHMLA = PageTableContract("flashmla-page-table", "flashmla", "flashmla_page_table",
                             "create_flashmla_kv_indices_triton",
                             _mutants("flashmla", swa=False) + _flashmla_release_mutants())
TRTLLM_MHA = PageTableContract("trtllm-mha-page-table", "trtllm_mha", "trtllm_mha_page_table",
                               "create_trtllm_mha_kv_indices_triton",
                               _mutants("trtllm_mha", swa=True) + _trtllm_mha_release_mutants())
