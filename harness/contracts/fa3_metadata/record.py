"""The FA3 fused decode-metadata contract (docs/contract.md §9): ``fa3-decode-metadata``.

``_fused_decode_metadata_kernel`` (SGLang 0.5.23: ``sglang/kernels/ops/attention/metadata.py``) publishes each
request's length plus a delta (``cache_seqlens``) and their prefix sum (``cu_seqlens_k``), and writes page-table
rows clamped to ``max_seq_pages`` columns. A later kernel reads ``ceil(cache_seqlens[b] / P)`` pages of row
``b``: when that exceeds the row, the table is truncated while the published length says otherwise
(``PUBLISHED_PAST_TABLE``). The record reuses the page-table contract's slot layout; its draws are
``kvfence.contracts.fa3_metadata.strategies``, its kernel ``kernels/fa3_metadata/fa3_decode_metadata.py``.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass
from typing import Dict, NamedTuple, Tuple

from kvfence.contract import Contract, FindingKind, Keys, Mutant, Table
from kvfence.contracts.page_table.record import BLOCK_TOKENS, PAGE_SIZES, PageTableCase, cdiv, slot_table
from kvfence.engine.findings import ContractKind, Finding
from kvfence.errors import require

PUBLISHED_PAST_TABLE = "PUBLISHED_PAST_TABLE"
KERNEL_MODULE = "kvfence.kernels.fa3_metadata.fa3_decode_metadata"


@dataclass(frozen=True)
class MetadataCase:
    page_size: int
    ctx: int
    delta: int
    seq_lens: Tuple[int, ...]
    req_pool_indices: Tuple[int, ...]
    pool_rows: int
    zero_tail: bool = False
    skip_page_table: bool = False
    seed: int = 0

    @property
    def slots(self) -> PageTableCase:
        """The same pool as a page-table case of these lengths plus the delta (every slot the kernel reads)."""
        return PageTableCase(self.page_size, self.ctx, self.delta, tuple(n + self.delta for n in self.seq_lens),
                             self.req_pool_indices, self.pool_rows, None, False, self.seed)

    def validate(self) -> "MetadataCase":
        require(all(0 <= n <= self.ctx for n in self.seq_lens), f"every length must be in [0, ctx] = [0, {self.ctx}]")
        require(0 <= self.delta <= 64, "delta must be in [0, 64]")
        self.slots.validate()
        return self


class Program(NamedTuple):
    """A program of the kernel's grid ``(batch, column blocks)``, in findings ``(request 2, block 0)``."""

    request: int
    block: int


def _pages(case: MetadataCase, b: int) -> int:
    return cdiv(case.seq_lens[b] + case.delta, case.page_size)


#: The kinds a dropped, misplaced or mis-read column shows as.
_WRONG = ("MISSING_WRITE", "VALUE_MISMATCH", "STRAY_WRITE", "GUARD_OVERWRITE", "POISON_READ")


def _release_mutants():
    """Planted bugs in the text of ``_fused_decode_metadata_kernel`` as 0.5.23 ships it, made from the wheel at run
    time (``kvfence.contracts.page_table.release_mutants``)."""
    from kvfence.contracts.page_table.release_mutants import release_mutant

    name = "fa3-decode-metadata"
    return (
        release_mutant(name, "release_block_offset_128", "Block pid_c starts at column pid_c * 128, right except at "
                       "page 1 (256 columns a block): there block 1 rewrites block 0's columns and leaves its own.",
                       _WRONG, (("col_start = pid_c * BLOCK_COLS", "col_start = pid_c * 128"),)),
        release_mutant(name, "release_block_guard_no_delta", "The block guard bounds the committed length's pages, "
                       "without SEQ_LEN_DELTA: a block whose first column only the delta reaches is skipped (a "
                       "published length just past a block boundary).", ("MISSING_WRITE",),
                       (("if not ZERO_TAIL and col_start >= num_live_pages:",
                         "if not ZERO_TAIL and col_start >= tl.cdiv(seq_len, PAGE_SIZE):"),)),
        release_mutant(name, "release_load_mask_table", "The page-table load is masked by the table's width, not the "
                       "length: with ZERO_TAIL the tail holds ids of pages past the length instead of 0.",
                       _WRONG + ("OOB_READ",),
                       (("        mask=live_mask,\n        other=0,\n",
                         "        mask=cols < max_seq_pages,\n        other=0,\n"),)),
        release_mutant(name, "release_row_stride_contiguous", "Row pid_b of the page table is found at pid_b * "
                       "max_seq_pages, not by its row stride: right only for a contiguous table.",
                       _WRONG + ("OOB_WRITE",),
                       (("page_table + pid_b * page_table_stride_0 + cols * page_table_stride_1",
                         "page_table + pid_b * max_seq_pages + cols * page_table_stride_1"),)),
        release_mutant(name, "release_pool_stride_from_table", "The req_to_token row is found with the page table's "
                       "row stride: a request in pool row r > 0 reads another row (or past the pool).",
                       _WRONG + ("OOB_READ",),
                       (("+ row_idx * req_to_token_stride_0", "+ row_idx * page_table_stride_0"),)),
        release_mutant(name, "release_lengths_capped_16", "The lengths and their prefix sum are published for the "
                       "first 16 requests only (a scale bug: the CPU domain launches at most 4).", ("MISSING_WRITE",),
                       (("for idx in range(B):", "for idx in range(tl.minimum(B, 16)):"),), domain="gpu"),
    )


class FA3Metadata(Contract[MetadataCase]):
    name = "fa3-decode-metadata"
    doc = "docs/contract.md §9"
    kinds = (FindingKind(PUBLISHED_PAST_TABLE, observed=False,
                         doc="a published length needs more pages than its page-table row holds: a consumer bounding "
                             "its reads by cache_seqlens reads past the row"),)
    reference = f"{KERNEL_MODULE}:_fused_decode_metadata_kernel"
    sizings = {"safe": lambda c, mode: cdiv(c.ctx + c.delta, c.page_size),
               "context": lambda c, mode: cdiv(c.ctx, c.page_size)}
    mutants = (
        Mutant("delta_not_published", "cache_seqlens leaves out SEQ_LEN_DELTA.", ("VALUE_MISMATCH",),
               (("length = (tl.load(seq_lens + i * seq_lens_stride_0) + SEQ_LEN_DELTA).to(tl.int32)",
                 "length = (tl.load(seq_lens + i * seq_lens_stride_0) + 0 * SEQ_LEN_DELTA).to(tl.int32)"),)),
        Mutant("prefix_sum_inclusive", "cu_seqlens_k[i] includes request i.", ("VALUE_MISMATCH",),
               (("            tl.store(cu_seqlens_k + i * cu_seqlens_k_stride_0, total)\n"
                 "            total += length\n",
                 "            total += length\n"
                 "            tl.store(cu_seqlens_k + i * cu_seqlens_k_stride_0, total)\n"),)),
        Mutant("rows_not_clamped", "Rows are not clamped to max_seq_pages (the row width): under a table narrower "
               "than a length, pages land past the row.", ("GUARD_OVERWRITE",),
               (("live = tl.minimum(tl.cdiv(length, PAGE_SIZE), max_seq_pages)",
                 "live = tl.cdiv(length, PAGE_SIZE) + 0 * max_seq_pages"),), sizing="context"),
        Mutant("zero_tail_ignored", "ZERO_TAIL leaves the tail columns unwritten.", ("MISSING_WRITE",),
               (("store_mask = cols < max_seq_pages if ZERO_TAIL else live_mask", "store_mask = live_mask"),)),
        Mutant("sizing_context", "The table is ceil(context_len / P) wide while the published length carries the "
               "delta.", (PUBLISHED_PAST_TABLE, "SIZING_VIOLATION"), sizing="context"),
    ) + _release_mutants()

    def cases(self, domain):
        from kvfence.contracts.fa3_metadata.strategies import fa3_metadata_cases

        return fa3_metadata_cases(domain.name, PAGE_SIZES, BLOCK_TOKENS).map(lambda f: MetadataCase(**f).validate())

    def to_json(self, case):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(case).items()}

    def from_json(self, data):
        require(isinstance(data, dict), "case: expected an object")
        fields = {"page_size", "ctx", "delta", "seq_lens", "req_pool_indices", "pool_rows", "zero_tail",
                  "skip_page_table", "seed"}
        require(set(data) == fields, f"case: expected the fields {', '.join(sorted(fields))}")
        for key in ("seq_lens", "req_pool_indices"):
            require(isinstance(data[key], list) and all(type(v) is int for v in data[key]),
                    f"case: {key} must be a list of integers")
        for key in ("page_size", "ctx", "delta", "pool_rows", "seed"):
            require(type(data[key]) is int, f"case: {key} must be an integer")
        for key in ("zero_tail", "skip_page_table"):
            require(type(data[key]) is bool, f"case: {key} must be true or false")
        return MetadataCase(**dict(data, seq_lens=tuple(data["seq_lens"]),
                                   req_pool_indices=tuple(data["req_pool_indices"]))).validate()

    def tables(self, launch):
        case, width = launch.case, launch.width
        slots = case.slots
        b = len(case.seq_lens)
        return [Table("req_to_token", slots.pool_len, case.pool_rows, "input", lambda: slot_table(slots)),
                Table("req_pool_indices", b, None, "input", list(case.req_pool_indices)),
                Table("seq_lens", b, None, "input", list(case.seq_lens)),
                Table("cache_seqlens", b, None, "output"), Table("cu_seqlens_k", b + 1, None, "output"),
                Table("page_table", width, b, "output")]

    def expected(self, launch) -> Dict[str, Dict[Tuple[int, int], int]]:
        """Plain Python, docs/contract.md §9: the published lengths and prefix sum, and each row's live pages
        (clamped to the width), then zeros to the width with ``ZERO_TAIL``."""
        case, width = launch.case, launch.width
        lengths = [n + case.delta for n in case.seq_lens]
        out = {"cache_seqlens": {(0, b): n for b, n in enumerate(lengths)},
               "cu_seqlens_k": {(0, b): sum(lengths[:b]) for b in range(len(lengths) + 1)}}
        table = {}
        if not case.skip_page_table and width > 0:
            slots, P = slot_table(case.slots), case.page_size
            for b in range(len(lengths)):
                live = min(_pages(case, b), width)
                for j in range(live):
                    table[(b, j)] = int(slots[case.req_pool_indices[b]][j * P]) // P
                if case.zero_tail:
                    table.update({(b, j): 0 for j in range(live, width)})
        out["page_table"] = table
        return out

    def need(self, launch):
        case = launch.case
        return 0 if case.skip_page_table else max(_pages(case, b) for b in range(len(case.seq_lens)))

    def owner(self, launch, table, row, column):
        """Program ``(0, 0)`` publishes every length and prefix sum; program ``(b, c)`` writes row ``b``'s columns of
        block ``c`` (``BLOCK_COLS`` each), up to its live pages, or the width with ``ZERO_TAIL``."""
        case = launch.case
        if table != "page_table":
            return Program(0, 0)
        from kvfence.kernels.fa3_metadata.fa3_decode_metadata import block_cols

        limit = launch.width if case.zero_tail else _pages(case, row)
        return Program(row, column // block_cols(case.page_size, case.skip_page_table)) if column < limit else None

    def findings_before_launch(self, launch) -> list:
        case, width = launch.case, launch.width
        if case.skip_page_table:
            return []
        from kvfence.kernels.fa3_metadata.fa3_decode_metadata import block_cols

        cols = block_cols(case.page_size, case.skip_page_table)
        return [Finding(ContractKind(PUBLISHED_PAST_TABLE), "cache_seqlens", f"row {b}", width, _pages(case, b), [],
                        [Program(b, c) for c in range(cdiv(width, cols))],
                        f"published length {case.seq_lens[b] + case.delta} needs {_pages(case, b)} pages, the "
                        f"width formula gives the page-table row {width}")
                for b in range(len(case.seq_lens)) if _pages(case, b) > width]

    def launch(self, kernel, buffers, launch):
        case, width = launch.case, launch.width
        module = importlib.import_module(KERNEL_MODULE)
        module.launch(kernel, seq_lens=buffers["seq_lens"], req_to_token=buffers["req_to_token"],
                      req_pool_indices=buffers["req_pool_indices"], cache_seqlens=buffers["cache_seqlens"],
                      cu_seqlens_k=buffers["cu_seqlens_k"], page_table=buffers["page_table"], width=width,
                      page_size=case.page_size, delta=case.delta, skip_page_table=case.skip_page_table,
                      zero_tail=case.zero_tail)

    def keys(self, launch) -> Keys:
        """Config: what the backend fixes before the batch (page size first); structure: each row's page count and
        the flags."""
        case = launch.case
        pages = tuple(_pages(case, b) for b in range(len(case.seq_lens)))
        return Keys(config=(("page_size", case.page_size), ("ctx", case.ctx), ("delta", case.delta),
                            ("zero_tail", case.zero_tail), ("skip_page_table", case.skip_page_table)),
                    structure=(case.page_size, pages, case.zero_tail, case.skip_page_table),
                    requests=len(case.seq_lens))


FA3_METADATA = FA3Metadata()
