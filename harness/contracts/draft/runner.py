"""Runners: feed a batch to the kernel the way production does, inside guarded buffers.

Both runners share one interface, ``run(batch) -> Observation``:

* ``EagerRunner`` sizes fresh buffers per batch (``n = num_seqs``) and launches directly.
* ``GraphRunner`` follows docs/contract.md §4: static inputs and buffers sized once at ``max_bs``, kv_indptr zeroed
  once, each batch copied into the first ``raw_bs`` rows and padded to its bucket (seq_len 1,
  position 0, pool index 0). On CUDA each bucket is captured once into a ``torch.cuda.CUDAGraph``
  (after a warm-up launch) and replayed; on CPU the bucket's launch is run directly (emulation).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from kvfence.contract import Table
from kvfence.contracts.draft.case import Batch, Case, Config, LaunchBatch, launch_batch
from kvfence.contracts.draft.runner_buffers import buffer_geometry
from kvfence.contracts.draft.targets import KernelTarget, pool_row_owners
from kvfence.contracts.draft.tokens import INT32_LIMIT, PERMUTE, SLOT_BITS, V2P_FAR, V2P_NEGATIVE, V2P_SINK
from kvfence.engine.audit import Audit, resolve_audit
from kvfence.engine.audit import for_launch as audit_for_launch
from kvfence.engine.capture import collector_paused
from kvfence.engine.findings import Finding
from kvfence.engine.tables import GUARD, Guarded, allocate_laid_out


def _slot_ids(i: torch.Tensor, token_seed: int, bits: int) -> torch.Tensor:
    """``kvfence.contracts.draft.case.slot_id`` of every element of ``i`` (int64)."""
    mask = (1 << bits) - 1
    h = (i * 0x9E3779B1 + token_seed) & mask
    h = h ^ (h >> 13)
    h = (h * 0x5BD1E995) & mask
    return h + 1


def slot_table(token_seed: int, rows: int, cols: int, device, config: Optional[Config] = None) -> torch.Tensor:
    """``req_to_token`` with entry ``i`` (flattened) equal to
    ``kvfence.contracts.draft.case.table_entry(config, token_seed, i)`` (``slot_id(token_seed, i)`` for a §2 config
    or none)."""
    i = torch.arange(rows * cols, dtype=torch.int64, device=device)
    if config is not None and config.translate:
        n = rows * cols
        return ((i * (PERMUTE % n) + token_seed) % n).to(torch.int32).view(rows, cols)
    bits = config.entry_bits if config is not None else SLOT_BITS
    return _slot_ids(i, token_seed, bits).to(torch.int32).view(rows, cols)


def v2p_tensor(config: Config, seed: int, device) -> torch.Tensor:
    """TRANSLATE's page table: ``kvfence.contracts.draft.case.v2p_entry`` of every page, as an int32 tensor."""
    pages, ps = config.v2p_pages, config.page_size
    page = torch.arange(pages, dtype=torch.int64, device=device)
    if seed == 0:
        return page.to(torch.int32)
    perm = (page * (PERMUTE % pages) + seed) % pages
    h = _slot_ids(page, seed, SLOT_BITS)
    cls = h % 8
    out = perm.clone()
    out = torch.where(cls == V2P_NEGATIVE, -1 - torch.div(h, 8, rounding_mode="floor") % 3, out)
    out = torch.where(cls == V2P_SINK, torch.zeros_like(out), out)
    out = torch.where(cls == V2P_FAR, (INT32_LIMIT // ps) - 1 - perm, out)
    out = torch.where(page == 0, torch.zeros_like(out), out)
    return out.to(torch.int32)


@dataclass
class Observation:
    """What one launch left behind, as the engine's verdict reads it: the outputs, the req_to_token pool and the
    other inputs the launch changed (``kvfence.engine.tables.Guarded``), each table's flat contents before and after
    on the host (by table name), any launch error and the address audit's findings."""

    case: Case
    launch: LaunchBatch
    kv_indices: Guarded
    kv_indptr: Guarded
    before: Dict[str, torch.Tensor]
    after: Dict[str, torch.Tensor]
    #: The pool (whose guard poison the verdict decodes in an output: which input a read went past) and the other
    #: inputs the launch changed, as tables (a per-request vector it left alone has nothing to say).
    inputs: Dict[str, Guarded] = field(default_factory=dict)
    error: Optional[str] = None
    #: ``OOB_READ`` / ``OOB_WRITE`` from the interpreter address audit (``kvfence.engine.audit``), when it ran.
    audit_findings: List[Finding] = field(default_factory=list)
    #: The audit itself (who stored into a guard, the grid), for the engine's naming of programs.
    audit: Optional[Audit] = None

    @property
    def buffers(self) -> Dict[str, Guarded]:
        """Every table the verdict compares: the two outputs and the inputs."""
        return {self.kv_indices.table.name: self.kv_indices, self.kv_indptr.table.name: self.kv_indptr,
                **self.inputs}

    def reset(self) -> None:
        """Both outputs as before their first launch (canaries, poison)."""
        self.kv_indices.reset()
        self.kv_indptr.reset()


def _buffers(config: Config, n: int, device, canary_seed: int, absorb: bool = True) -> Tuple[Guarded, Guarded]:
    """kv_indices ``(num_steps, W)`` and kv_indptr ``(num_steps, n*topk + 1)``, engine tables
    (``kvfence.engine.tables.allocate_laid_out``) laid out by ``kvfence.contracts.draft.runner_buffers.buffer_geometry``
    (the same numbers the memory budget counts), with seeded canaries (the case's canary seed; kv_indptr's the next)
    and kv_indptr's column 0 holding its canary (the kernel never writes it)."""
    kvi, kvp = buffer_geometry(config, n, absorb)
    # On the CPU (the address audit's device) each buffer gets a never-read spacer after it: without one
    # a row stored past the end can land in the next registered tensor (an input), where the audit
    # performs the store and names that tensor instead of dropping it and naming this buffer. On CUDA
    # nothing is added: the device verifier computes what it expects and the oracle path keeps its
    # "before" snapshots in host memory, so a neighbour it overwrites cannot mislead either.
    spacer = absorb and torch.device(device).type == "cpu"
    # The window rail's outputs are named as the rail names them (docs/contract.md §6); same guards.
    prefix = "window_" if config.is_rail else ""
    kv_indices = allocate_laid_out(Table(prefix + "kv_indices", kvi.width, kvi.rows), device, guard=kvi.row_guard,
                                   front=kvi.front, tail=kvi.tail, canary_seed=canary_seed, spacer=spacer)
    kv_indptr = allocate_laid_out(Table(prefix + "kv_indptr", kvp.width, kvp.rows), device, guard=kvp.row_guard,
                                  front=kvp.front, tail=kvp.tail, canary_seed=canary_seed + 1, column0_canary=True,
                                  spacer=spacer)
    return kv_indices, kv_indptr


def input_table(name: str, tensor: torch.Tensor) -> Guarded:
    """One of the runner's per-request vectors as an engine table without guards (allocated as production does: a
    store past one lands in whatever lies next, which the address audit names on the CPU)."""
    rows, width = (tensor.shape[0], tensor.shape[1]) if tensor.dim() == 2 else (None, tensor.numel())
    table = Table(name, width, rows, "input", dtype=str(tensor.dtype).removeprefix("torch."))
    return Guarded(table, tensor.view(-1), tensor, 0, 0, 0)


class _Inputs:
    """Input tensors of one shape: the req_to_token pool and the per-request vectors."""

    def __init__(self, config: Config, rows: int, device):
        # The pool is laid out as production's (rows contiguous, the row stride its width) inside the engine's
        # input guards: a read before or past it returns poison, which the verdict names (POISON_READ).
        self.req_to_token_table = allocate_laid_out(Table("req_to_token", config.pool_cols, config.pool_rows, "input"),
                                                    device, guard=0, front=GUARD, tail=GUARD)
        self.req_to_token = self.req_to_token_table.view
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.req_pool_indices = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(rows * config.topk, dtype=torch.int64, device=device)
        # TRANSLATE's page table is an input like the others: read-only for the kernel, checked after it.
        self.v2p = torch.zeros(config.v2p_pages, dtype=torch.int32, device=device) if config.translate else None
        self.token_seed: Optional[int] = None
        self.v2p_seed: Optional[int] = None

    def load(self, config: Config, batch: Batch, lb: LaunchBatch) -> None:
        if self.token_seed != batch.token_seed:  # regenerating the pool is the costliest copy
            self.req_to_token.copy_(slot_table(batch.token_seed, config.pool_rows, config.pool_cols,
                                               self.seq_lens.device, config))
            self.req_to_token_table.reset()  # its guards too: a launch that stored into one left it changed
            self.token_seed = batch.token_seed
        if self.v2p is not None and self.v2p_seed != batch.v2p_seed:
            self.v2p.copy_(v2p_tensor(config, batch.v2p_seed, self.v2p.device))
            self.v2p_seed = batch.v2p_seed
        m = lb.num_seqs
        self.seq_lens[:m].copy_(torch.tensor(lb.seq_lens, dtype=torch.int32))
        self.req_pool_indices[:m].copy_(torch.tensor(lb.req_pool_indices, dtype=torch.int64))
        self.positions[: m * config.topk].copy_(torch.tensor(lb.positions, dtype=torch.int64))
        # Rows past the bucket get the padding values on every load, as the device verifier's staging
        # rows do: what a kernel wrote there in an earlier case must not make the same write invisible now.
        self.seq_lens[m:].fill_(1)
        self.req_pool_indices[m:].zero_()
        self.positions[m * config.topk:].zero_()

    def table(self, name: str) -> Guarded:
        """Input ``name`` as an engine table (its snapshots in ``named`` are of the same elements)."""
        return self.req_to_token_table if name == "req_to_token" else input_table(name, self.named()[name])

    def named(self) -> Dict[str, torch.Tensor]:
        """Every input by name; the pool with its guards (a store into them is a change to it)."""
        named = {"req_to_token": self.req_to_token_table.flat, "seq_lens": self.seq_lens,
                 "req_pool_indices": self.req_pool_indices, "positions": self.positions}
        if self.v2p is not None:
            named["v2p"] = self.v2p
        return named


def capture_graph(fn, device, stats: Optional[dict] = None) -> "torch.cuda.CUDAGraph":
    """Run ``fn`` once on a side stream (compiling what it launches), then capture it into a CUDA graph.

    ``stats`` (a ``Session.stats``) counts ``captures`` and adds the warm-up time to ``compile_s`` and
    the capture time to ``capture_s``, so a run reports them apart from checking time.
    """
    t0 = time.perf_counter()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    graph = torch.cuda.CUDAGraph()
    with collector_paused(), torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)
    if stats is not None:
        stats["captures"] = stats.get("captures", 0) + 1
        stats["compile_s"] = stats.get("compile_s", 0.0) + (t1 - t0)
        stats["capture_s"] = stats.get("capture_s", 0.0) + (time.perf_counter() - t1)
    return graph


class _RunnerBase:
    def __init__(self, config: Config, kernel: KernelTarget, device: str, canary_seed: int = 0, poison: bool = True,
                 audit: Optional[bool] = None, absorb: bool = True, stats: Optional[dict] = None):
        self.config = config
        #: The owning session's counters (captures, compile and capture seconds), or a private dict.
        self.stats = stats if stats is not None else {}
        self.absorb = absorb
        self.kernel = kernel
        self.device = torch.device(device)
        self.canary_seed = canary_seed
        # poison=False keeps whatever earlier launches left (the replay state machine checks that).
        self.poison = poison
        # The interpreter address audit (kvfence.engine.audit): on by default on the CPU, impossible on CUDA.
        self.audit = resolve_audit(audit, self.device.type)

    def _kernel_kwargs(self, inputs: _Inputs, kv_indices: Guarded, kv_indptr: Guarded, m: int) -> dict:
        c = self.config
        kw = dict(req_pool_indices=inputs.req_pool_indices[:m], req_to_token=inputs.req_to_token,
                  seq_lens=inputs.seq_lens[:m], kv_indices=kv_indices.view, kv_indptr=kv_indptr.view,
                  positions=inputs.positions[: m * c.topk], topk=c.topk, num_steps=c.num_steps, page_size=c.page_size)
        if c.is_family:
            # docs/contract.md §6: only kernels that declared these get them (KernelTarget.check_config).
            kw.update(contract=c.contract, window_size=c.window_size, sink_size=c.sink_size,
                      entry_page_size=c.entry_page_size, v2p=inputs.v2p)
        return kw

    def _observe(self, batch: Batch, lb: LaunchBatch, inputs: _Inputs, kv_indices, kv_indptr, launch) -> Observation:
        case = Case(self.config, batch, self.kernel.spec, self.canary_seed)
        if self.poison:
            # Fresh canaries too: damage an earlier case left in a guard would hide the same damage now.
            kv_indices.reset()
            kv_indptr.reset()
        # The "before" copies wait out the launch in host memory: on a GPU a store past the end of an
        # allocation lands in whatever the caching allocator put next to it, and a copy taken just before
        # the launch is a likely neighbour. A corrupted "before" would turn that store's damage into the
        # wrong kinds and regions (the device verifier computes what it expects, so it never had this gap).
        host = torch.device("cpu")
        inputs_before = {k: v.to(host, copy=True) for k, v in inputs.named().items()}
        before = {g.table.name: g.flat.to(host, copy=True) for g in (kv_indices, kv_indptr)}
        error = None
        audit = None
        if self.audit:
            own = pool_row_owners(self.kernel.request_axis, lb.req_pool_indices)
            owners = {} if own is None else {"req_to_token": own}
            audit = audit_for_launch(self._kernel_kwargs(inputs, kv_indices, kv_indptr, lb.num_seqs),
                                     (kv_indices, kv_indptr), row_owners=owners)
            launch = audit.wrap(launch)
        try:
            launch()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        except (Exception, SystemExit) as exc:  # the verdict reports it as LAUNCH_ERROR (a plug-in's sys.exit too)
            error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
        after = {g.table.name: g.flat.to(host, copy=True) for g in (kv_indices, kv_indptr)}
        tables = {}
        for name, tensor in inputs.named().items():
            now, was = tensor.to(host), inputs_before[name]
            changed = not torch.equal(now, was)
            if changed or name == "req_to_token":
                tables[name] = inputs.table(name)
                before[name], after[name] = was.view(-1), (now.clone() if changed else was).view(-1)
            if changed and name == "req_to_token":
                inputs.token_seed = None  # the next load regenerates the pool instead of keeping this damage
        audit_findings = audit.findings() if audit is not None else []
        return Observation(case, lb, kv_indices, kv_indptr, before, after, tables, error, audit_findings, audit)


class EagerRunner(_RunnerBase):
    """Fresh buffers per batch, sized with ``n = num_seqs``; launched directly."""

    def run(self, batch: Batch) -> Observation:
        lb = launch_batch(self.config, batch)
        m = lb.num_seqs
        kv_indices, kv_indptr = _buffers(self.config, m, self.device, self.canary_seed, self.absorb)
        inputs = _Inputs(self.config, m, self.device)
        inputs.load(self.config, batch, lb)
        kw = self._kernel_kwargs(inputs, kv_indices, kv_indptr, m)
        return self._observe(batch, lb, inputs, kv_indices, kv_indptr, lambda: self.kernel.launch(**kw))


class GraphRunner(_RunnerBase):
    """docs/contract.md §4: buffers sized once at ``max_bs``, batches padded to a bucket, one graph per bucket."""

    def __init__(self, config: Config, kernel: KernelTarget, device: str, canary_seed: int = 0, poison: bool = True,
                 audit: Optional[bool] = None, absorb: bool = True, stats: Optional[dict] = None):
        super().__init__(config, kernel, device, canary_seed, poison, audit, absorb, stats)
        self.kv_indices, self.kv_indptr = _buffers(config, config.max_bs, self.device, canary_seed, absorb)
        self.inputs = _Inputs(config, config.max_bs, self.device)
        self.graphs: Dict[int, "torch.cuda.CUDAGraph"] = {}

    def _bucket_launch(self, bucket: int):
        kw = self._kernel_kwargs(self.inputs, self.kv_indices, self.kv_indptr, bucket)
        if self.device.type != "cuda":
            return lambda: self.kernel.launch(**kw)
        graph = self.graphs.get(bucket)
        if graph is None:
            graph = self._capture(kw)
            self.graphs[bucket] = graph
        return graph.replay

    def capture_all(self) -> None:
        """Capture every bucket now (CUDA), as a production runner does at start-up, so no warm-up
        launch happens between later replays."""
        for bucket in self.config.capture_buckets:
            self._bucket_launch(bucket)

    def _capture(self, kw: dict) -> "torch.cuda.CUDAGraph":
        # Warm up (compiles the kernel, or loads it from Triton's on-disk cache) on a side stream, then
        # capture. The warm-up writes into the buffers; every replay is checked against a snapshot
        # taken just before it (or re-poisoned first), so that is harmless.
        return capture_graph(lambda: self.kernel.launch(**kw), self.device, self.stats)

    def run(self, batch: Batch) -> Observation:
        lb = launch_batch(self.config, batch)
        captured = len(self.graphs)
        try:
            launch = self._bucket_launch(lb.num_seqs)
        except Exception as exc:  # capture failed: report as a launch error of this case
            def launch(exc=exc):
                raise exc
        if len(self.graphs) != captured:
            # Capturing ran the kernel once (its warm-up): a write into an input then would already be in
            # the snapshot taken before the replay, and be invisible. Load the inputs afresh after it.
            self.inputs.token_seed = None
        self.inputs.load(self.config, batch, lb)
        return self._observe(batch, lb, self.inputs, self.kv_indices, self.kv_indptr, launch)


def make_runner(config: Config, kernel: KernelTarget, device: str, canary_seed: int = 0, poison: bool = True,
                audit: Optional[bool] = None, absorb: bool = True, stats: Optional[dict] = None):
    cls = GraphRunner if config.mode == "graph" else EagerRunner
    return cls(config, kernel, device, canary_seed=canary_seed, poison=poison, audit=audit, absorb=absorb, stats=stats)
