"""The request-row writer contract (docs/contract.md §10): ``req-to-token``.

SGLang's ``assign_req_to_token_pool`` (``srt/mem_cache/allocation.py`` in 0.5.23) is launched once per decode
step under speculative decoding (``alloc_for_spec_decode``): program ``b`` writes positions ``[start_b, end_b)``
of pool row ``req_pool_indices[b]`` of ``req_to_token`` with request ``b``'s new KV slots, taken from
``out_cache_loc`` after the earlier requests' ``end - start``. Its stores are bounded by ``end_b`` only, never
by the row width: a row narrower than ``end_b`` is written past, into the next request's row in production's
contiguous table (into kvfence's guard here). ``end_b`` is the committed length plus the step's reservation,
rounded up to a page, while SGLang sizes the row ``context_len + get_req_to_token_extra_context_len()``: at page
size 1 ``ctx + 4 + D``, which holds a request committed at ``c`` only while ``c + reserve <= ctx + 4 + D``; the
DFlash family reserves ``2 * D``.

This module is the contract's record (``kvfence.contract.Contract``): the oracle and case model are
``case``, the policies ``sizing``, the draws ``strategies``; the kernel ``kvfence.kernels.req_to_token``; what
releases ship ``shipped`` (read by ``release_read``), their kernels' planted bugs ``release_mutants``.
"""

from __future__ import annotations

import importlib
from typing import List

from kvfence.contract import Contract, FindingKind, Keys, Mutant, Option, Table
from kvfence.contracts.req_to_token import case as model
from kvfence.contracts.req_to_token.sizing import Sizings
from kvfence.engine.findings import ContractKind, Finding

#: The kernel's module, imported when a launch needs it: triton may only be imported once the device is chosen.
KERNEL_MODULE = "kvfence.kernels.req_to_token.req_to_token_writer"
ROW_RESERVED_PAST_WIDTH = "ROW_RESERVED_PAST_WIDTH"
#: The release whose own kernel text the release mutants patch (when its kernel is in kvfence's cache).
RELEASE = "0.5.23"

_STRAY = ("STRAY_WRITE", "GUARD_OVERWRITE", "VALUE_MISMATCH", "MISSING_WRITE", "POISON_READ")
_SPILL = ("SIZING_VIOLATION", ROW_RESERVED_PAST_WIDTH, "GUARD_OVERWRITE", "STRAY_WRITE")


def _mutants() -> tuple:
    """The planted bugs of kvfence's own kernel (docs/contract.md §10, "Bug classes")."""
    return (
        Mutant("inclusive_end", "One position past end_b is written too (mask position <= stop).",
               ("STRAY_WRITE", "GUARD_OVERWRITE", "POISON_READ", "VALUE_MISMATCH"),
               (("in_request = position < stop", "in_request = position <= stop  # BUG: one position too many"),)),
        Mutant("prefix_includes_self", "Request b's slots are looked up after its own length too (an inclusive "
               "prefix sum).", ("VALUE_MISMATCH", "POISON_READ"),
               (("is_earlier = earlier < b", "is_earlier = earlier <= b  # BUG: inclusive prefix"),)),
        Mutant("row_of_request", "Request b writes pool row b instead of req_pool_indices[b].", _STRAY,
               (("pool_row = tl.load(req_pool_indices + b).to(tl.int64)",
                 "pool_row = (b + 0 * tl.load(req_pool_indices + b)).to(tl.int64)  # BUG"),)),
        Mutant("slots_not_rebased", "A position's slot is read at its position, not its offset in the request.",
               ("VALUE_MISMATCH", "POISON_READ"),
               (("slot = tl.load(out_cache_loc + source + (position - first), mask=in_request)",
                 "slot = tl.load(out_cache_loc + source + position, mask=in_request)  # BUG"),)),
        Mutant("positions_from_zero", "Slots are stored from position 0 of the row, not from start_b.", _STRAY,
               (("tl.store(row + position, slot, mask=in_request)",
                 "tl.store(row + (position - first), slot, mask=in_request)  # BUG"),)),
        Mutant("prefix_of_eight", "The prefix sum sees the first 8 requests only: a batch of more reads the "
               "wrong slots (a scale bug: the CPU domain draws at most 4 requests).", ("VALUE_MISMATCH",),
               (("earlier = tl.arange(0, BATCH_POW2)", "earlier = tl.arange(0, 8)  # BUG: 8 requests at most"),),
               domain="gpu"),
        Mutant("sizing_release_page1", "Rows of ctx + 4 + D at every page size (0.5.23's page-1 headroom): a "
               "request committed at the wall reserves past them.", _SPILL, sizing="release-page1"),
        Mutant("sizing_context", "Rows as wide as the context: no room for the step's reservation.", _SPILL,
               sizing="context"),
        Mutant("sizing_scheduled_page", "The headroom max(4 + D, 2 * alloc_len + P - 1) taken at the scheduled page "
               "P where the allocator pages at P * dcp_size (SGLang 0.5.18 under decode context parallelism, "
               "sglang#35424): a request at the wall aligned to the allocator's page passes the row.", _SPILL,
               sizing="scheduled-page"),
        Mutant("sizing_safe_scheduled_page", "ctx + reserve + P - 1: the safe row rounded to the scheduled page, not "
               "the allocator's P * dcp_size.", _SPILL, sizing="safe-scheduled-page"),
    )


class ReqToTokenContract(Contract[model.ReqToTokenCase]):
    name = "req-to-token"
    doc = "docs/contract.md §10"
    reference = f"{KERNEL_MODULE}:write_req_to_token"
    sizings = Sizings()
    kinds = (FindingKind(ROW_RESERVED_PAST_WIDTH, observed=False,
                         doc="a request's write reaches past its row's width: the row cannot hold what the step "
                             "reserved (a reader of the row up to end_b reads past it)"),)
    options = (
        Option("page_size", int, None, "pin the page size (default: drawn by Hypothesis)", bounds=(1, None),
               shard=lambda domain: model.PAGE_SIZES),
        Option("ctx", int, None, "pin the context length (default: drawn by Hypothesis)", bounds=(1, None)),
        Option("topk", int, None, "pin the speculative topk (default: drawn by Hypothesis)", bounds=(1, None)),
        Option("num_steps", int, None, "pin the speculative steps (default: drawn by Hypothesis)", bounds=(1, None)),
        Option("dcp_size", int, None, "pin the decode-context-parallel size (SGLang's --dcp-size: the allocator "
                                      "pages at page size x DCP size) (default: drawn by Hypothesis)",
               bounds=(1, None)),
    )

    # A property for the data member: read when asked, since the release's planted bugs import release tooling.
    @property
    def mutants(self) -> tuple:  # type: ignore[override]
        from kvfence.contracts.req_to_token.release_mutants import release_mutants

        return _mutants() + release_mutants(self.name, RELEASE)

    def cases(self, domain):
        from kvfence.contracts.req_to_token.strategies import req_to_token_cases

        pins = {k: v for k, v in domain.pins.items() if v is not None}
        return req_to_token_cases(domain.name, domain.sizing, pins).map(
            lambda fields: model.ReqToTokenCase(**fields).validate())

    def to_json(self, case) -> dict:
        return model.to_json(case)

    def from_json(self, data):
        return model.from_json(data)

    def tables(self, launch) -> List[Table]:
        case = launch.case
        return [Table("req_to_token", launch.width, case.pool_rows, "output"),
                Table("req_pool_indices", case.bs, None, "input", list(case.req_pool_indices)),
                Table("start_offset", case.bs, None, "input", [case.start(b) for b in range(case.bs)]),
                Table("end_offset", case.bs, None, "input", [case.end(b) for b in range(case.bs)]),
                Table("out_cache_loc", case.total, None, "input", lambda: model.slots(case), dtype="int64")]

    def expected(self, launch):
        return {"req_to_token": model.written(launch.case)}

    def need(self, launch) -> int:
        return model.need(launch.case)

    def launch(self, kernel, buffers, launch) -> None:
        importlib.import_module(KERNEL_MODULE).launch(kernel, req_pool_indices=buffers["req_pool_indices"],
                             req_to_token=buffers["req_to_token"], start_offset=buffers["start_offset"],
                             end_offset=buffers["end_offset"], out_cache_loc=buffers["out_cache_loc"])

    def keys(self, launch) -> Keys:
        """Config: what a deployment fixes (page size first: the coverage plot's panels); structure: each
        request's [start, end) (where the kernel writes, not which pool row nor which slots); compile: the
        constexprs (the row stride, from the width and layout, and the batch's power of two)."""
        case, width = launch.case, launch.width
        kernel_module = importlib.import_module(KERNEL_MODULE)
        spans = tuple((case.start(b), case.end(b)) for b in range(case.bs))
        edges = []
        if model.need(case) > width:
            edges.append("past the row")
        elif model.need(case) == width:
            edges.append("at the row's end")
        if any(e > case.ctx for _, e in spans):
            edges.append("reserved past the context")
        if any(e - s > kernel_module.CHUNK for s, e in spans):
            edges.append("several chunks")
        if any(e == s for s, e in spans):
            edges.append("nothing to write")
        return Keys(config=(("page_size", case.page_size), ("ctx", case.ctx), ("draft_tokens", case.draft_tokens),
                            ("steps", case.steps), ("topk", case.topk), ("reserve", case.reserve),
                            ("dcp_size", case.dcp_size)),
                    structure=(case.page_size, case.dcp_size, spans), compile=(width, launch.layout,
                                                                kernel_module.next_power_of_2(case.bs)),
                    edges=tuple(edges), requests=case.bs)

    def owner(self, launch, table, row, column):
        return model.owner_of(launch.case, row, column) if table == "req_to_token" else None

    def findings_before_launch(self, launch) -> list:
        """``ROW_RESERVED_PAST_WIDTH`` per request whose write reaches past the row: the case's arithmetic."""
        case, width = launch.case, launch.width
        return [Finding(ContractKind(ROW_RESERVED_PAST_WIDTH), "req_to_token", f"row {case.req_pool_indices[b]}",
                        first, end, [], [model.Program(b)],
                        f"request {b} (committed {case.committed[b]}, reserve {case.reserve}, page "
                        f"{case.page_size}{_dcp_text(case)}) writes positions [{case.start(b)}, {end}); the row holds "
                        f"{width}: "
                        f"{end - first} of them lie past it")
                for b, first, end in model.past_row(case, width)]


def _dcp_text(case) -> str:
    return f" x DCP {case.dcp_size}: allocator page {case.alloc_page}" if case.dcp_size > 1 else ""


REQ_TO_TOKEN = ReqToTokenContract()
