"""The page-table builder contracts (docs/contract.md §9): ``flashmla-page-table`` and ``trtllm-mha-page-table``.

Both kernels turn each request's token slots into a row of page ids: page ``j`` of request ``b`` is
``req_to_token[rpi_b, start_b + j*P] // P`` for ``j < ceil(L_b / P)``, in row ``b`` of a table ``W`` pages
wide. They bound their stores by the length, not by ``W``, and launch ``ceil(W / (4096 / P))`` page blocks
per request. So ``ceil(L_b / P) > W`` writes past the row (into the next row, in production's contiguous
table) as far as the launched blocks reach, and drops the rest; the consumer, told ``L_b``, reads past its
row either way. The lengths include draft tokens (target verify passes ``seq_len + draft tokens``), while
graph-mode tables are commonly ``ceil(context_len / P)`` wide: that is the ``context`` sizing.

This module is the contract's record (``kvfence.contracts.tables.TableContract``): the case, the plain-Python
oracle, the sizing policies, the mutants. Its draws are ``kvfence.contracts.page_table.strategies``; its kernels
``kernels/page_table/flashmla_page_table.py`` and ``kernels/page_table/trtllm_mha_page_table.py``.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from kvfence.contract import ContractKind, ContractMutant, ShippedSite, Table, Upstream
from kvfence.contracts.tables import TableContract
from kvfence.engine.findings import Finding, Kind
from kvfence.errors import require

from kvfence.kernels import KERNELS_DIR

KERNELS = KERNELS_DIR / "page_table"

TABLE_TRUNCATED = ContractKind("TABLE_TRUNCATED")
#: Tokens one program covers along grid axis 1, in both kernels (docs/contract.md §9).
BLOCK_TOKENS = 4096
PAGE_SIZES = (1, 16, 32, 64, 128)


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
        require(all(1 <= n <= self.ctx + self.draft_tokens for n in self.seq_lens),
                f"every length must be in [1, ctx + draft_tokens] = [1, {self.ctx + self.draft_tokens}]")
        require(len(self.req_pool_indices) == self.num_seqs
                and len(set(self.req_pool_indices)) == self.num_seqs
                and all(0 <= r < self.pool_rows for r in self.req_pool_indices),
                "req_pool_indices: one distinct pool row per request, each below pool_rows")
        require(self.kv_start is None or (len(self.kv_start) == self.num_seqs and min(self.kv_start) >= 0),
                "kv_start: one non-negative start per request, or null")
        require(self.pool_rows * cdiv(self.pool_len, self.page_size) * self.page_size < 2 ** 31,
                "slot ids must fit int32: fewer pool rows or a shorter context")
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


# -- the record ----------------------------------------------------------------------------------------------
def _safe(case: PageTableCase) -> int:
    """Room for the longest length the scheduler may pass: context plus draft tokens."""
    return cdiv(case.ctx + case.draft_tokens, case.page_size)


def _context(case: PageTableCase) -> int:
    """``ceil(context_len / P)``: no room for draft tokens; the TRTLLM-MHA backend's static width in SGLang
    0.5.23 (``layers/attention/trtllm_mha_backend.py:351-353``, ``max_context_len`` = the model's context)."""
    return cdiv(case.ctx, case.page_size)


def _flashmla_graph(case: PageTableCase) -> int:
    """``(context_len + P) // P``: the FlashMLA backend's CUDA-graph table in SGLang 0.5.23
    (``layers/attention/flashmla_backend.py:281-282``); one page over ``context_len``, which holds the draft
    tokens only while ``ctx mod P + draft_tokens <= P``."""
    return (case.ctx + case.page_size) // case.page_size


def _context_floor(case: PageTableCase) -> int:
    """``context_len // P``: a page short when the context is not a multiple of the page size."""
    return max(1, case.ctx // case.page_size)


class PageTableContract(TableContract):
    section = "docs/contract.md §9"
    kinds = (TABLE_TRUNCATED,)
    sizings = {"safe": _safe, "context": _context, "flashmla-graph": _flashmla_graph, "context-floor": _context_floor}

    def __init__(self, name: str, abi: str, kernel_file: str, attr: str, upstream: Upstream, mutants, sites=()):
        self.name, self.abi = name, abi
        self.reference_kernel, self.reference_attr = KERNELS / kernel_file, attr
        self.upstream, self.mutants = upstream, tuple(mutants)
        self.shipped_sites = tuple(sites)

    def wall_case(self, ctx: int, page_size: int, draft_tokens: int, length: int) -> PageTableCase:
        """The kernel receives ``length + draft_tokens`` (target verify's lengths), one request."""
        return PageTableCase(page_size, ctx, draft_tokens, (length + draft_tokens,), (0,), 1).validate()

    # draws and case files
    def cases(self, domain: str):
        from kvfence.contracts.page_table.strategies import page_table_cases

        return page_table_cases(self.abi, domain, PAGE_SIZES, BLOCK_TOKENS).map(
            lambda fields: PageTableCase(**fields).validate())

    def case_to_dict(self, case: PageTableCase) -> dict:
        return asdict(case)

    def case_from_dict(self, data: dict) -> PageTableCase:
        require(isinstance(data, dict), "case: expected an object")
        fields = {"page_size", "ctx", "draft_tokens", "seq_lens", "req_pool_indices", "pool_rows", "kv_start",
                  "swa", "seed"}
        unknown = sorted(set(data) - fields)
        require(not unknown, f"case: unknown field(s) {', '.join(unknown)}")

        def ints(key, optional=False):
            value = data.get(key)
            if optional and value is None:
                return None
            require(isinstance(value, list) and all(type(v) is int for v in value), f"case: {key} must be a "
                                                                                     "list of integers")
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

    # buffers, oracle, launch
    def _outputs(self) -> Tuple[str, ...]:
        return ("kv_indices",) if self.abi == "flashmla" else ("page_table", "swa_page_table")

    def tables(self, case: PageTableCase, width: int) -> List[Table]:
        out = [Table("req_to_token", case.pool_len, case.pool_rows, "input", slot_table(case)),
               Table("req_pool_indices", case.num_seqs, None, "input", list(case.req_pool_indices)),
               Table("seq_lens", case.num_seqs, None, "input", list(case.seq_lens))]
        if case.kv_start:
            out.append(Table("kv_start", case.num_seqs, None, "input", list(case.kv_start)))
        if case.swa:
            swa = swa_table(case)
            out.append(Table("full_to_swa", len(swa), None, "input", swa))
        outputs = self._outputs() if case.swa or self.abi == "flashmla" else self._outputs()[:1]
        return out + [Table(name, width, case.num_seqs, "output") for name in outputs]

    def expected(self, case: PageTableCase, width: int) -> Dict[str, Dict[Tuple[int, int], int]]:
        ids = page_ids(case)
        first = {(b, j): v for b, row in enumerate(ids) for j, v in enumerate(row)}
        out = {self._outputs()[0]: first}
        if case.swa:
            slots, swa, P = slot_table(case), swa_table(case), case.page_size
            out["swa_page_table"] = {
                (b, j): int(swa[min(max(int(slots[case.req_pool_indices[b]][j * P]), 0), len(swa) - 1)]) // P
                for (b, j) in first}
        return out

    def need(self, case: PageTableCase) -> int:
        return max(pages_needed(case, b) for b in range(case.num_seqs))

    def owner(self, case, table, row, column):
        return (row, column * case.page_size // BLOCK_TOKENS) if column < pages_needed(case, row) else None

    def findings_before_launch(self, case: PageTableCase, width: int) -> list:
        """``TABLE_TRUNCATED`` per row whose length needs more pages than the row holds: the consumer, given
        that length, reads past its table (whatever the kernel did with the pages that do not fit)."""
        out = []
        for b in range(case.num_seqs):
            need = pages_needed(case, b)
            if need > width:
                out.append(Finding(TABLE_TRUNCATED, self._outputs()[0], f"row {b}", width, need, [],
                                   [(b, blk) for blk in range(cdiv(need * case.page_size, BLOCK_TOKENS))],
                                   f"length {case.seq_lens[b]} needs {need} pages, the row holds {width}"))
        return out

    def launch(self, kernel, buffers, case: PageTableCase, width: int) -> None:
        module = _kernel_module(self.reference_kernel)
        common = dict(req_to_token=buffers["req_to_token"], req_pool_indices=buffers["req_pool_indices"],
                      seq_lens=buffers["seq_lens"], width=width, page_size=case.page_size)
        if self.abi == "flashmla":
            module.launch(kernel, kv_start=buffers.get("kv_start"), kv_indices=buffers["kv_indices"], **common)
        else:
            module.launch(kernel, full_to_swa=buffers.get("full_to_swa"), page_table=buffers["page_table"],
                          swa_page_table=buffers.get("swa_page_table"), **common)

    def config_key(self, case: PageTableCase) -> tuple:
        """What a backend fixes before the batch: page size, context, draft tokens, the optional inputs."""
        return (("page_size", case.page_size), ("ctx", case.ctx), ("draft_tokens", case.draft_tokens),
                ("kv_start", case.kv_start is not None), ("swa", case.swa))

    def compile_key(self, case: PageTableCase, width: int) -> tuple:
        """The kernels' constexprs: the page size and both row strides (the width and the pool row's length,
        each plus the guard), and which optional inputs are passed."""
        return case.page_size, width, case.pool_len, case.kv_start is not None, case.swa

    def structural_key(self, case: PageTableCase, width: int) -> tuple:
        """What changes where the kernel writes: page size, width, each row's page count and start, SWA;
        not the slot layout's seed nor which pool row is read."""
        return (case.page_size, width, tuple(pages_needed(case, b) for b in range(case.num_seqs)),
                case.kv_start, case.swa)


_MODULES: dict = {}


def _kernel_module(path: Path):
    """kvfence's own kernel file (for its launcher), imported once."""
    if path not in _MODULES:
        import importlib

        _MODULES[path] = importlib.import_module(f"kvfence.kernels.page_table.{path.stem}")
    return _MODULES[path]


def _mutants(kernel_file: str, *, swa: bool):
    """The planted bugs of one page-table kernel (docs/contract.md §9, "Bug classes")."""
    pages = "num_pages = tl.cdiv(length, PAGED_SIZE)" if kernel_file.startswith("flashmla") else \
        "num_pages = tl.cdiv(length, PAGE_SIZE)"
    size = "PAGED_SIZE" if kernel_file.startswith("flashmla") else "PAGE_SIZE"
    out = [
        ContractMutant("page_count_floor", "The page count rounds down: a partial last page gets no id.",
                       ("MISSING_WRITE",), ((pages, f"num_pages = length // {size}  # BUG: must round up"),)),
        ContractMutant("one_page_more", "One page more than the length needs is written (mask <= num_pages).",
                       ("STRAY_WRITE", "GUARD_OVERWRITE", "VALUE_MISMATCH"),
                       (("mask = page < num_pages", "mask = page <= num_pages  # BUG: one page too many"),)),
        ContractMutant("pool_row_from_request", "Reads pool row b instead of req_pool_indices[b].",
                       ("VALUE_MISMATCH",),
                       (("pool_row = tl.load(req_pool_indices + b).to(tl.int64)",
                         "pool_row = (b + 0 * tl.load(req_pool_indices + b)).to(tl.int64)  # BUG"),)),
        ContractMutant("sizing_context", "Graph-mode table sized ceil(context_len / P): no room for the draft "
                       "tokens target verify adds to a length at the context wall.",
                       ("SIZING_VIOLATION", "TABLE_TRUNCATED", "GUARD_OVERWRITE"), (), "context"),
        ContractMutant("sizing_context_floor", "Table sized context_len // P: a page short when the context is not "
                       "a multiple of the page size.",
                       ("SIZING_VIOLATION", "TABLE_TRUNCATED", "GUARD_OVERWRITE"), (), "context-floor"),
    ]
    if kernel_file.startswith("flashmla"):
        out.append(ContractMutant("start_ignored", "kv_start_idx is read but not added to the token position.",
                                  ("VALUE_MISMATCH",),
                                  (("first_token = start + page.to(tl.int64) * PAGED_SIZE",
                                    "first_token = 0 * start + page.to(tl.int64) * PAGED_SIZE  # BUG"),)))
    if swa:
        out.append(ContractMutant("swa_table_unmapped", "The SWA table gets the full table's page ids (the "
                                  "full_to_swa lookup is skipped).", ("VALUE_MISMATCH",),
                                  (("tl.store(swa_page_table + out, (swa_slot // PAGE_SIZE).to(tl.int32), mask=mask)",
                                    "tl.store(swa_page_table + out, ((slot + 0 * swa_slot) // PAGE_SIZE).to(tl.int32), "
                                    "mask=mask)  # BUG"),)))
    return out


#: Where releases define the kernels (the newest first), read from the wheels 0.4.4.post2 .. 0.5.23.
_KV_INDICES = ("sglang/kernels/ops/attention/kv_indices.py", "sglang/kernels/ops/kvcache/kv_indices.py",
               "sglang/srt/layers/attention/triton_ops/kv_indices.py", "sglang/srt/layers/attention/utils.py")
_TRTLLM_MHA = tuple(p.replace("kv_indices.py", "trtllm_mha_page_table.py") for p in _KV_INDICES[:3])

#: Where SGLang's backends size the tables these kernels write (docs/contract.md §9, "Shipped sizing of the
#: plug-in contracts"), as the backends spell it in 0.5.23; other releases are read the same way, and a text a
#: release lacks is reported as not found there.
_FLASHMLA_SITES = (
    ShippedSite("flashmla", "FlashMLABackend", "graph", "target_verify",
                "(self.max_context_len + PAGE_SIZE) // PAGE_SIZE", "self.num_draft_tokens", (64,),
                within="init_cuda_graph_state", evidence="seq_lens + self.num_draft_tokens"),
    ShippedSite("flashmla", "FlashMLABackend", "graph", "decode",
                "(self.max_context_len + PAGE_SIZE) // PAGE_SIZE", "0", (64,), within="init_cuda_graph_state"),
    ShippedSite("flashmla", "FlashMLABackend", "eager", "target_verify",
                "triton.cdiv(eager_max_k + self.num_draft_tokens, PAGE_SIZE)", "self.num_draft_tokens", (64,),
                within="init_forward_metadata", evidence="forward_batch.seq_lens + self.num_draft_tokens"),
    ShippedSite("aiter", "AiterAttnBackend", "eager", "decode", "max_kv_len", "0", (1,),
                within="init_forward_metadata", symbols=(("max_kv_len", "max_len"),),
                note="the page-table decode path (decode_uses_page_table): a table of page 1 (PAGED_SIZE 1 at the "
                     "launch) as wide as the batch's longest length, max_kv_len = "
                     "forward_batch.seq_lens_cpu.max().item() (aiter_backend.py:2057 in 0.5.23), built per batch"),
    ShippedSite("cutlass_mla", "CutlassMLABackend", "graph", "decode", "(self.max_context_len + PAGE_SIZE) // PAGE_SIZE",
                "0", (128,), within="init_cuda_graph_state",
                note="decode without speculation only: a speculative batch goes to its FlashInfer-MLA base class"),
    ShippedSite("cutlass_mla", "CutlassMLABackend", "eager", "decode",
                "triton.cdiv(forward_batch.seq_lens_cpu.max().item(), PAGE_SIZE)", "0", (128,),
                within="init_forward_metadata",
                note="decode without speculation only: a speculative batch goes to its FlashInfer-MLA base class"),
    ShippedSite("trtllm_mla", "TRTLLMMLABackend", "graph", "target_verify",
                "self._calc_padded_blocks(self.max_context_len)", "self.num_draft_tokens", (32, 64),
                within="init_cuda_graph_state", evidence="torch.add(seq_lens[:bs], self.num_draft_tokens, "
                                                         "out=metadata.global_seq_lens_k)"),
)
_TRTLLM_MHA_SITES = (
    ShippedSite("trtllm_mha", "TRTLLMHAAttnBackend", "eager", "target_verify", "self.max_num_pages",
                "tokens_per_req", (16, 32, 64), within="init_forward_metadata",
                evidence="forward_batch.seq_lens + tokens_per_req",
                symbols=(("forward_batch.input_ids.shape[0] // batch_size", "d"),),
                note="tokens per request in target verify are the draft tokens (topk 1); the CUDA-graph verify "
                     "builds its table with another kernel"),
)

FLASHMLA = PageTableContract(
    "flashmla-page-table", "flashmla", "flashmla_page_table.py", "create_flashmla_kv_indices_triton",
    Upstream("create_flashmla_kv_indices_triton", _KV_INDICES),
    _mutants("flashmla_page_table.py", swa=False), _FLASHMLA_SITES)

TRTLLM_MHA = PageTableContract(
    "trtllm-mha-page-table", "trtllm_mha", "trtllm_mha_page_table.py", "create_trtllm_mha_kv_indices_triton",
    Upstream("create_trtllm_mha_kv_indices_triton", _TRTLLM_MHA),
    _mutants("trtllm_mha_page_table.py", swa=True), _TRTLLM_MHA_SITES)
