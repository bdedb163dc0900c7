"""On-device verification for the graph runner: a clean case never copies its buffers to the host.

Per case the host packs the batch into one staging vector (one host-to-device copy), then three steps
run on the device — on CUDA each is a CUDA graph captured once per bucket:

1. **prepare**: poison the rows (kv_indptr column 0 back to 0), unpack the staging
   vector into the runner's static inputs (with the runner's padding already applied on the host), and
   regenerate req_to_token from the case's token seed;
2. **kernel**: the runner's own captured graph of the kernel under test (exactly what production replays);
3. **verify**: ``kernels/verify/segments.py`` counts write-set elements with a wrong value,
   ``kernels/verify/outside.py`` counts changed elements outside the write set (guards, slack,
   kv_indptr column 0), and torch ops count changed inputs.

Only four counters come back. A non-zero counter (or ``need > width``, known on the host) sends the case
to the full path (``harness.verdict.check`` with ``harness.fastcheck.expected_writes_torch``), which
names regions, ranges and programs. Guards are not rewritten per case: a clean verdict proves they are
intact, and the full path restores them after a dirty one.
"""

from __future__ import annotations

from typing import Dict, List

import torch

from harness.case import Case, LaunchBatch
from harness.guarded import POISON
from harness.runner import GraphRunner, capture_graph, slot_table

#: counters: [kv_indices write set, kv_indptr write set, outside the write sets, inputs changed]
COUNTERS = ("kv_indices", "kv_indptr", "outside", "inputs")


class DeviceVerifier:
    def __init__(self, runner: GraphRunner):
        from kernels.verify.outside import verify_outside
        from kernels.verify.segments import verify_segments

        self.runner = runner
        self._segments, self._outside = verify_segments, verify_outside
        c = runner.config
        self.device = runner.device
        self.counts = torch.zeros(len(COUNTERS), dtype=torch.int32, device=self.device)
        self.width = 1 + 2 * c.max_bs + c.max_bs * c.topk  # [seed | seq_lens | pool rows | positions]
        cuda = self.device.type == "cuda"
        self.host = torch.zeros(self.width, dtype=torch.int64, pin_memory=cuda)
        self.staging = torch.zeros(self.width, dtype=torch.int64, device=self.device)
        self.table = torch.empty_like(runner.inputs.req_to_token)
        self.graphs: Dict[int, tuple] = {}
        # Staging rows of a whole batch of cases (total_counters), grown on demand.
        self._batch_host = None
        self._batch_dev = None

    # -- the three steps, for bucket m ---------------------------------------------------------------
    def _slices(self, m: int):
        c = self.runner.config
        mb = c.max_bs
        return (self.staging[1:1 + m], self.staging[1 + mb:1 + mb + m],
                self.staging[1 + 2 * mb:1 + 2 * mb + m * c.topk])

    def _prepare(self, m: int) -> None:
        r, c = self.runner, self.runner.config
        r.kv_indices.view.fill_(POISON)
        r.kv_indptr.view.fill_(POISON)
        r.kv_indptr.view[:, 0] = 0
        lens, rows, pos = self._slices(m)
        r.inputs.seq_lens[:m].copy_(lens)
        r.inputs.req_pool_indices[:m].copy_(rows)
        r.inputs.positions[: m * c.topk].copy_(pos)
        r.inputs.req_to_token.copy_(slot_table(self.staging[0], c.pool_rows, c.pool_len, self.device))
        self.table.copy_(r.inputs.req_to_token)  # what the kernel must leave unchanged

    def _verify(self, m: int) -> None:
        r, c = self.runner, self.runner.config
        inputs = r.inputs
        lens, rows, pos = self._slices(m)
        seq_lens = inputs.seq_lens[:m]
        self._segments(kv_indices=r.kv_indices.view, kv_indptr=r.kv_indptr.view, req_to_token=inputs.req_to_token,
                       seq_lens=seq_lens, req_pool_indices=inputs.req_pool_indices[:m],
                       positions=inputs.positions[: m * c.topk], counts=self.counts, topk=c.topk,
                       num_steps=c.num_steps, page_size=c.page_size)
        for buf, is_indptr in ((r.kv_indices, False), (r.kv_indptr, True)):
            self._outside(buf, counts=self.counts, slot=2, seq_lens=seq_lens, topk=c.topk,
                          is_indptr=is_indptr, poison=POISON)
        changed = (inputs.req_to_token != self.table).sum()
        changed = changed + (seq_lens != lens).sum() + (inputs.req_pool_indices[:m] != rows).sum()
        changed = changed + (inputs.positions[: m * c.topk] != pos).sum()
        self.counts[3:4].add_(changed.to(torch.int32))

    def _steps(self, m: int):
        """(prepare, kernel, verify) callables for bucket m: graph replays on CUDA, plain calls on CPU."""
        steps = self.graphs.get(m)
        if steps is not None:
            return steps
        kernel = self.runner._bucket_launch(m)  # captures the kernel graph on CUDA
        if self.device.type != "cuda":
            steps = (lambda: self._prepare(m), kernel, lambda: self._verify(m))
        else:
            steps = (self._capture(lambda: self._prepare(m)), kernel, self._capture(lambda: self._verify(m)))
        self.graphs[m] = steps
        return steps

    def _capture(self, fn):
        # The warm-up inside capture_graph compiles the verification kernels outside capture.
        return capture_graph(fn, self.device, self.runner.stats).replay

    # -- cases ---------------------------------------------------------------------------------------
    def _staged(self, case: Case, lb: LaunchBatch) -> List[int]:
        """The staging vector of one case: ``[token seed | seq_lens | pool rows | positions]``."""
        c = case.config
        mb, m = c.max_bs, lb.num_seqs
        values = [0] * self.width
        values[0] = case.batch.token_seed
        values[1:1 + m] = lb.seq_lens
        values[1 + mb:1 + mb + m] = lb.req_pool_indices
        values[1 + 2 * mb:1 + 2 * mb + m * c.topk] = lb.positions
        return values

    def stage(self, case: Case, lb: LaunchBatch) -> None:
        self.host.copy_(torch.tensor(self._staged(case, lb), dtype=torch.int64))
        self.staging.copy_(self.host, non_blocking=True)

    def counters(self, case: Case) -> List[int]:
        """Run the case and return the four mismatch counters (all zero: clean)."""
        lb = case.launch()
        prepare, kernel, verify = self._steps(lb.num_seqs)
        self.stage(case, lb)
        self.counts.zero_()
        prepare()
        kernel()
        verify()
        # The runner's static inputs no longer describe its last full-path load.
        self.runner.inputs.token_seed = None
        return self.counts.tolist()

    def total_counters(self, cases: List[Case]) -> List[int]:
        """Run every case (one config) and return the four counters summed over all of them.

        All staging vectors go to the device in one copy; then, per case, one device-to-device copy
        and the three graph replays are queued without waiting, and the counters come back once at
        the end. Counters only grow, so an all-zero total proves every case clean; a non-zero total
        says only that some case is dirty (the caller re-checks them one by one).
        """
        launches = [case.launch() for case in cases]
        steps = [self._steps(lb.num_seqs) for lb in launches]
        rows = len(cases)
        if self._batch_host is None or self._batch_host.shape[0] < rows:
            cuda = self.device.type == "cuda"
            capacity = max(rows, 2 * (self._batch_host.shape[0] if self._batch_host is not None else 16))
            self._batch_host = torch.zeros(capacity, self.width, dtype=torch.int64, pin_memory=cuda)
            self._batch_dev = torch.zeros(capacity, self.width, dtype=torch.int64, device=self.device)
        self._batch_host[:rows].copy_(torch.tensor([self._staged(c, lb) for c, lb in zip(cases, launches)],
                                                   dtype=torch.int64))
        self._batch_dev[:rows].copy_(self._batch_host[:rows], non_blocking=True)
        self.counts.zero_()
        for i, (prepare, kernel, verify) in enumerate(steps):
            self.staging.copy_(self._batch_dev[i], non_blocking=True)
            prepare()
            kernel()
            verify()
        self.runner.inputs.token_seed = None
        # One read-back for the batch; it also waits for the pinned rows' copy, so they can be reused.
        return self.counts.tolist()
