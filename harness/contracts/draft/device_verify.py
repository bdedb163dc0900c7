"""On-device verification for the graph runner: a clean case never copies its buffers to the host.

Cases of one config go to the device as a batch: the host packs each case's batch into one staging row
(``[token seed | seq_lens | pool rows | positions | sum(seq_lens)]``, all ``max_bs`` rows: live
requests, the runner's padding, and padding values past the bucket) and all rows travel in one host-to-device
copy. Then, per case, **one** CUDA graph (captured once per bucket) reads staging row ``cursor`` (a device
scalar, so the same graph serves every row) and runs:

1. **prepare** (``kernels/verify/prepare.py``): unpack the row into the runner's static inputs and
   regenerate req_to_token from the case's token seed;
2. **kernel**: the kernel under test, launched on the runner's static buffers exactly as its own
   captured graph launches it;
3. **verify**: ``kernels/verify/segments.py`` counts kv_indices write-set elements with a wrong value
   (the expected slot id computed on the fly from the case's token seed) and writes the poison back
   into each element it checked (verification and re-poisoning in one pass),
   ``kernels/verify/indptr.py`` does the same for the whole kv_indptr allocation (column-0 canary,
   written columns, slack, guards), ``kernels/verify/outside.py`` counts changed kv_indices elements
   outside the write set (guards, slack), ``kernels/verify/inputs.py`` changed input elements (whole
   tensors, and the pool's guards); then the cursor moves to the next row. On CUDA the last three run on a
   second stream, parallel branches of the graph beside the write-set pass (``PARALLEL_BRANCHES``).

Counters only grow, so after the whole batch four numbers come back in one read: all zero proves every
case clean, and leaves the rows poisoned for the next batch. Otherwise (or when ``need > width``, known
on the host) cases go to the full path (``kvfence.contracts.draft.session.host_verdict``: the engine's verdict),
one by one, which names regions, ranges and programs and resets the buffers. Guards are not rewritten per case: a
clean verdict proves they are intact.

``_steps(m)`` keeps prepare, the runner's own kernel graph and verify as separate graphs, for
benchmarks that time them one by one.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Dict, List

import torch

from kvfence.contracts.draft.case import Case, LaunchBatch
from kvfence.contracts.draft.runner import GraphRunner, capture_graph
from kvfence.engine.tables import INPUT_POISON, POISON

#: counters: [kv_indices write set, kv_indptr write set, outside the write sets, inputs changed]
COUNTERS = ("kv_indices", "kv_indptr", "outside", "inputs")
#: Cases whose staging rows go to the device in one copy (a longer batch is sent in chunks).
BATCH_ROWS = 64
#: Run the independent verification passes as parallel graph branches (``DeviceVerifier._verify``).
PARALLEL_BRANCHES = True


class DeviceVerifier:
    def __init__(self, runner: GraphRunner):
        from kvfence.kernels.draft.verify.indptr import verify_indptr
        from kvfence.kernels.draft.verify.inputs import verify_inputs
        from kvfence.kernels.draft.verify.outside import verify_outside
        from kvfence.kernels.draft.verify.prepare import prepare_case
        from kvfence.kernels.draft.verify.segments import verify_segments

        self.runner = runner
        self._prepare_case, self._inputs = prepare_case, verify_inputs
        self._segments, self._indptr, self._outside = verify_segments, verify_indptr, verify_outside
        c = runner.config
        self.device = runner.device
        self.counts = torch.zeros(len(COUNTERS), dtype=torch.int32, device=self.device)
        # [seed | seq_lens | pool rows | positions | sum of the launch's lengths]
        self.width = 1 + 2 * c.max_bs + c.max_bs * c.topk + 1
        cuda = self.device.type == "cuda"
        self.graphs: Dict[int, tuple] = {}
        self.fused: Dict[int, Callable[[], None]] = {}
        # Staging rows of a batch of cases, and the device cursor the graphs read them by.
        self.rows = torch.zeros(BATCH_ROWS, self.width, dtype=torch.int64, device=self.device)
        self.rows_host = torch.zeros(BATCH_ROWS, self.width, dtype=torch.int64, pin_memory=cuda)
        # rows are written here from Python lists (3x faster than torch.tensor)
        self._rows_host_np = self.rows_host.numpy()
        self.cursor = torch.zeros(1, dtype=torch.int64, device=self.device)
        #: A second stream for the verification passes that do not depend on each other (see ``_verify``).
        self.fork = torch.cuda.Stream(self.device) if cuda and PARALLEL_BRANCHES else None

    # -- the steps, for bucket m ---------------------------------------------------------------------
    def _prepare(self, m: int) -> None:
        """Unpack staging row ``cursor`` into the static inputs (all ``max_bs`` rows) and regenerate the pool."""
        r, c = self.runner, self.runner.config
        self._prepare_case(rows=self.rows, cursor=self.cursor, seq_lens=r.inputs.seq_lens,
                           req_pool_indices=r.inputs.req_pool_indices, positions=r.inputs.positions,
                           req_to_token=r.inputs.req_to_token, max_bs=c.max_bs, topk=c.topk)

    def _verify(self, m: int, advance: bool = True) -> None:
        """Count mismatches (poisoning back what it checks), then advance the cursor to the next row."""
        r, c = self.runner, self.runner.config
        inputs = r.inputs
        seq_lens = inputs.seq_lens[:m]
        # The passes touch disjoint elements (the write set; kv_indptr; kv_indices outside the write set;
        # the inputs, read only) and only add to the counters, so on CUDA the three small ones run on a
        # second stream beside the write-set pass: in a captured graph they become parallel branches,
        # and a case costs the longest pass instead of the sum of four.
        fork = self.fork
        main = torch.cuda.current_stream(self.device) if fork is not None else None
        if fork is not None and main is not None:
            fork.wait_stream(main)
        self._segments(r.kv_indices, seq_lens=seq_lens, req_pool_indices=inputs.req_pool_indices[:m],
                       rows=self.rows, cursor=self.cursor, counts=self.counts, pool_len=inputs.req_to_token.shape[1],
                       topk=c.topk, num_steps=c.num_steps, page_size=c.page_size, poison_back=True, poison=POISON)
        with torch.cuda.stream(fork) if main is not None else contextlib.nullcontext():
            self._indptr(r.kv_indptr, positions=inputs.positions, counts=self.counts, num_seqs=m, topk=c.topk,
                         poison=POISON, poison_back=True)
            self._outside(r.kv_indices, counts=self.counts, slot=2, rows=self.rows, cursor=self.cursor, num_seqs=m,
                          topk=c.topk, poison=POISON)
            pool = inputs.req_to_token_table
            self._inputs(rows=self.rows, cursor=self.cursor, seq_lens=inputs.seq_lens,
                         req_pool_indices=inputs.req_pool_indices, positions=inputs.positions,
                         req_to_token=inputs.req_to_token, counts=self.counts, max_bs=c.max_bs, topk=c.topk,
                         front=pool.front, tail=pool.tail, poison_base=INPUT_POISON)
        if fork is not None and main is not None:
            main.wait_stream(fork)  # the join: the cursor moves (and the next case starts) after all four
        if advance:
            self.cursor.add_(1)

    def _kernel(self, m: int):
        r = self.runner
        kw = r._kernel_kwargs(r.inputs, r.kv_indices, r.kv_indptr, m)
        return lambda: r.kernel.launch(**kw)

    def _case_graph(self, m: int):
        """One replayable step per case of bucket m: prepare, kernel, verify (one CUDA graph)."""
        step = self.fused.get(m)
        if step is None:
            kernel = self._kernel(m)

            def case():
                self._prepare(m)
                kernel()
                self._verify(m)

            step = capture_graph(case, self.device, self.runner.stats).replay if self.device.type == "cuda" else case
            self.fused[m] = step
        return step

    def _steps(self, m: int):
        """(prepare, kernel, verify) for bucket m as separate graphs (benchmarks time each step)."""
        steps = self.graphs.get(m)
        if steps is not None:
            return steps
        kernel = self.runner._bucket_launch(m)  # the runner's own captured graph of the kernel

        def prepare():
            self.cursor.zero_()
            self._prepare(m)

        if self.device.type != "cuda":
            steps = (prepare, kernel, lambda: self._verify(m, advance=False))
        else:
            # Verify keeps the cursor on row 0, so it can be replayed any number of times.
            steps = (self._capture(prepare), kernel, self._capture(lambda: self._verify(m, advance=False)))
        self.graphs[m] = steps
        return steps

    def _capture(self, fn):
        # The warm-up inside capture_graph compiles the verification kernels outside capture.
        return capture_graph(fn, self.device, self.runner.stats).replay

    # -- cases ---------------------------------------------------------------------------------------
    def _staged(self, case: Case, lb: LaunchBatch) -> List[int]:
        """The staging row of one case: ``[token seed | seq_lens | pool rows | positions | sum(seq_lens)]``."""
        c = case.config
        mb, m = c.max_bs, lb.num_seqs
        values = [0] * self.width
        values[0] = case.batch.token_seed
        values[1:1 + mb] = lb.seq_lens + (1,) * (mb - m)  # rows past the bucket hold padding values too
        values[1 + mb:1 + mb + m] = lb.req_pool_indices
        values[1 + 2 * mb:1 + 2 * mb + m * c.topk] = lb.positions
        values[-1] = sum(lb.seq_lens)
        return values

    def counters(self, case: Case) -> List[int]:
        """Run one case and return the four mismatch counters (all zero: clean)."""
        return self.total_counters([case])

    def total_counters(self, cases: List[Case]) -> List[int]:
        """Run every case (one config) and return the four counters summed over all of them.

        Staging rows go to the device in one copy per ``BATCH_ROWS`` cases; each case is one graph
        replay queued without waiting; the counters come back once. An all-zero total proves every case
        clean; a non-zero one says only that some case is dirty (the caller re-checks them one by one),
        and the buffers are then reset (``_reset_buffers``), so each re-check starts from known-clean
        guards and slack instead of meeting a later case's stray write.

        Every bucket the batch needs is captured before the first replay is queued: a capture runs its
        graph once (a warm-up) and the counters are zeroed after it, which must never wipe what queued
        replays of earlier cases counted.
        """
        launches = [case.launch() for case in cases]
        for first in range(0, len(cases), BATCH_ROWS):
            chunk, chunk_launches = cases[first:first + BATCH_ROWS], launches[first:first + BATCH_ROWS]
            if first and self.device.type == "cuda":
                # The pinned rows are about to be rewritten: the previous chunk's copy must have left them.
                torch.cuda.current_stream(self.device).synchronize()
            self._rows_host_np[:len(chunk)] = [self._staged(c, lb) for c, lb in zip(chunk, chunk_launches)]
            self.rows[:len(chunk)].copy_(self.rows_host[:len(chunk)], non_blocking=True)
            if not first:
                self._capture_buckets({lb.num_seqs for lb in launches})
                self.counts.zero_()
            self.cursor.zero_()
            for lb in chunk_launches:
                self.fused[lb.num_seqs]()
        # The runner's static inputs no longer describe its last full-path load.
        self.runner.inputs.token_seed = None
        # One read-back for the batch; it also waits for the pinned rows' copy, so they can be reused.
        totals = self.counts.tolist()
        if any(totals):
            self._reset_buffers()
        return totals

    def _capture_buckets(self, buckets) -> None:
        """Capture the graph of every bucket in ``buckets`` not captured yet (before any replay is queued).

        Each capture's warm-up runs the case of staging row 0 on its bucket; what a buggy kernel breaks
        then is not any case's damage, so the buffers are reset after it.
        """
        new = sorted(m for m in buckets if m not in self.fused)
        for m in new:
            self.cursor.zero_()  # every warm-up reads row 0: the staging rows hold BATCH_ROWS rows only
            self._case_graph(m)
        if new and self.device.type == "cuda":  # (on the CPU a "capture" runs nothing)
            self._reset_buffers()

    def _reset_buffers(self) -> None:
        """Canaries in every guard and poison in every row of both outputs: a known-clean start."""
        self.runner.kv_indices.reset()
        self.runner.kv_indptr.reset()
