"""The FA3 fused decode-metadata contract (docs/contract.md §9): ``fa3-decode-metadata``.

``_fused_decode_metadata_kernel`` (SGLang 0.5.23: ``sglang/kernels/ops/attention/metadata.py``) publishes each
request's length plus a delta (``cache_seqlens``) and their prefix sum (``cu_seqlens_k``), and writes page-table
rows clamped to ``max_seq_pages`` columns. A later kernel reads ``ceil(cache_seqlens[b] / P)`` pages of row
``b``: when that exceeds the row, the table is truncated while the published length says otherwise
(``PUBLISHED_PAST_TABLE``). The record reuses the page-table contract's slot layout; its draws are
``kvfence.contracts.fa3_metadata.strategies``, its kernel ``kernels/fa3_metadata/fa3_decode_metadata.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Tuple

from kvfence.contract import ContractKind, ContractMutant, ShippedSite, Table, Upstream
from kvfence.contracts.tables import TableContract
from kvfence.engine.findings import Finding
from kvfence.contracts.page_table.record import BLOCK_TOKENS, KERNELS, PAGE_SIZES, PageTableCase, cdiv, slot_table
from kvfence.errors import require

PUBLISHED_PAST_TABLE = ContractKind("PUBLISHED_PAST_TABLE")


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
        require(all(1 <= n <= self.ctx for n in self.seq_lens), f"every length must be in [1, ctx] = [1, {self.ctx}]")
        require(0 <= self.delta <= 64, "delta must be in [0, 64]")
        self.slots.validate()
        return self


def _pages(case: MetadataCase, b: int) -> int:
    return cdiv(case.seq_lens[b] + case.delta, case.page_size)


class FA3Metadata(TableContract):
    name = "fa3-decode-metadata"
    section = "docs/contract.md §9"
    kinds = (PUBLISHED_PAST_TABLE,)
    reference_kernel = KERNELS.parent / "fa3_metadata" / "fa3_decode_metadata.py"
    reference_attr = "_fused_decode_metadata_kernel"
    upstream = Upstream("_fused_decode_metadata_kernel", ("sglang/kernels/ops/attention/metadata.py",))
    sizings = {"safe": lambda c: cdiv(c.ctx + c.delta, c.page_size), "context": lambda c: cdiv(c.ctx, c.page_size)}
    shipped_sites = (
        ShippedSite("fa3", "FlashAttentionBackend", "graph", "target_verify", "self.max_num_pages",
                    "self.speculative_num_draft_tokens", (1, 16, 32, 64, 128), within="_set_decode_page_metadata",
                    evidence="verify_delta = self.speculative_num_draft_tokens",
                    note="topk 1, not a ragged verify"),
    )
    mutants = (
        ContractMutant("delta_not_published", "cache_seqlens leaves out SEQ_LEN_DELTA.", ("VALUE_MISMATCH",),
                       (("length = (tl.load(seq_lens + i * seq_lens_stride_0) + SEQ_LEN_DELTA).to(tl.int32)",
                         "length = (tl.load(seq_lens + i * seq_lens_stride_0) + 0 * SEQ_LEN_DELTA).to(tl.int32)"),)),
        ContractMutant("prefix_sum_inclusive", "cu_seqlens_k[i] includes request i.", ("VALUE_MISMATCH",),
                       (("            tl.store(cu_seqlens_k + i * cu_seqlens_k_stride_0, total)\n"
                         "            total += length\n",
                         "            total += length\n"
                         "            tl.store(cu_seqlens_k + i * cu_seqlens_k_stride_0, total)\n"),)),
        ContractMutant("rows_not_clamped", "Rows are not clamped to max_seq_pages (the row width): under a table "
                       "narrower than a length, pages land past the row.", ("GUARD_OVERWRITE",),
                       (("live = tl.minimum(tl.cdiv(length, PAGE_SIZE), max_seq_pages)",
                         "live = tl.cdiv(length, PAGE_SIZE) + 0 * max_seq_pages"),), "context"),
        ContractMutant("zero_tail_ignored", "ZERO_TAIL leaves the tail columns unwritten.", ("MISSING_WRITE",),
                       (("store_mask = cols < max_seq_pages if ZERO_TAIL else live_mask",
                         "store_mask = live_mask"),)),
        ContractMutant("sizing_context", "The table is ceil(context_len / P) wide while the published length "
                       "carries the delta.", ("PUBLISHED_PAST_TABLE", "SIZING_VIOLATION"), (), "context"),
    )

    def wall_case(self, ctx: int, page_size: int, draft_tokens: int, length: int) -> MetadataCase:
        """One request of committed length ``length``; the kernel adds ``draft_tokens`` (SEQ_LEN_DELTA)."""
        return MetadataCase(page_size, ctx, draft_tokens, (length,), (0,), 1).validate()

    def cases(self, domain: str):
        from kvfence.contracts.fa3_metadata.strategies import fa3_metadata_cases

        return fa3_metadata_cases(domain, PAGE_SIZES, BLOCK_TOKENS).map(lambda f: MetadataCase(**f).validate())

    def case_to_dict(self, case):
        return asdict(case)

    def case_from_dict(self, data):
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

    def tables(self, case, width):
        slots = case.slots
        b = len(case.seq_lens)
        return [Table("req_to_token", slots.pool_len, case.pool_rows, "input", slot_table(slots)),
                Table("req_pool_indices", b, None, "input", list(case.req_pool_indices)),
                Table("seq_lens", b, None, "input", list(case.seq_lens)),
                Table("cache_seqlens", b, None, "output"), Table("cu_seqlens_k", b + 1, None, "output"),
                Table("page_table", width, b, "output")]

    def expected(self, case, width) -> Dict[str, Dict[Tuple[int, int], int]]:
        """Plain Python, docs/contract.md §9: the published lengths and prefix sum, and each row's live pages
        (clamped to the width), then zeros to the width with ``ZERO_TAIL``."""
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

    def need(self, case):
        return 0 if case.skip_page_table else max(_pages(case, b) for b in range(len(case.seq_lens)))

    def findings_before_launch(self, case, width) -> list:
        if case.skip_page_table:
            return []
        from kvfence.kernels.fa3_metadata.fa3_decode_metadata import block_cols

        cols = block_cols(case.page_size, case.skip_page_table)
        return [Finding(PUBLISHED_PAST_TABLE, "cache_seqlens", f"row {b}", width, _pages(case, b), [],
                        [(b, c) for c in range(cdiv(width, cols))],
                        f"published length {case.seq_lens[b] + case.delta} needs {_pages(case, b)} pages, the "
                        f"page-table row holds {width}")
                for b in range(len(case.seq_lens)) if _pages(case, b) > width]

    def launch(self, kernel, buffers, case, width):
        import importlib

        module = importlib.import_module("kvfence.kernels.fa3_metadata.fa3_decode_metadata")
        module.launch(kernel, seq_lens=buffers["seq_lens"], req_to_token=buffers["req_to_token"],
                      req_pool_indices=buffers["req_pool_indices"], cache_seqlens=buffers["cache_seqlens"],
                      cu_seqlens_k=buffers["cu_seqlens_k"], page_table=buffers["page_table"], width=width,
                      page_size=case.page_size, delta=case.delta, skip_page_table=case.skip_page_table,
                      zero_tail=case.zero_tail)

    def config_key(self, case) -> tuple:
        """What the backend fixes before the batch: page size, context, the published delta, the flags."""
        return (("page_size", case.page_size), ("ctx", case.ctx), ("delta", case.delta),
                ("zero_tail", case.zero_tail), ("skip_page_table", case.skip_page_table))

    def structural_key(self, case, width):
        return (case.page_size, width, tuple(_pages(case, b) for b in range(len(case.seq_lens))), case.zero_tail,
                case.skip_page_table)


FA3_METADATA = FA3Metadata()
