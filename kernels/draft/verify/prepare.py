"""Prepare one case on the device: unpack its staging row into the runner's inputs and regenerate the
req_to_token pool from its token seed (harness/contracts/draft/device_verify.py).

The staging row is row ``cursor`` of ``rows`` (``[token seed | seq_lens | pool rows | positions | sum(seq_lens)]``, each
part ``max_bs`` or ``max_bs*topk`` long, the runner's padding already applied), so one captured graph
serves every case of a batch. Entry ``i`` of the flattened pool is ``kvfence.contracts.draft.case.slot_id(seed, i)``
(``kernels/verify/slots.py``).

Grid ``(cdiv(pool_numel, BLOCK) + 1,)``: the first programs write the pool, the last one the per-request
inputs. The rows themselves are not poisoned here: the previous case's verification poisoned back what
it checked (``segments.py``), and anything else that changed makes the case dirty and the full path
resets the buffers.
"""

import triton
import triton.language as tl

from kvfence.kernels.draft.verify.slots import slot_ids

BLOCK_ELEMENTS = 1024


@triton.jit(do_not_specialize=['width', 'max_bs', 'topk', 'pool_numel'])
def prepare_case_kernel(rows, cursor, width, seq_lens, req_pool_indices, positions, max_bs, topk, req_to_token,
                        pool_numel, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    row = rows + tl.load(cursor) * width
    pool_blocks = tl.cdiv(pool_numel, BLOCK)
    if pid < pool_blocks:
        i = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        seed = tl.load(row)
        tl.store(req_to_token + i, slot_ids(i, seed), mask=i < pool_numel)
    else:
        for start in range(0, max_bs, BLOCK):
            j = start + tl.arange(0, BLOCK)
            live = j < max_bs
            tl.store(seq_lens + j, tl.load(row + 1 + j, mask=live).to(tl.int32), mask=live)
            tl.store(req_pool_indices + j, tl.load(row + 1 + max_bs + j, mask=live), mask=live)
        for start in range(0, max_bs * topk, BLOCK):
            j = start + tl.arange(0, BLOCK)
            live = j < max_bs * topk
            tl.store(positions + j, tl.load(row + 1 + 2 * max_bs + j, mask=live), mask=live)


def prepare_case(*, rows, cursor, seq_lens, req_pool_indices, positions, req_to_token, max_bs: int, topk: int):
    pool_numel = req_to_token.numel()
    grid = (triton.cdiv(pool_numel, BLOCK_ELEMENTS) + 1,)
    prepare_case_kernel[grid](rows, cursor, rows.shape[1], seq_lens, req_pool_indices, positions, max_bs, topk,
                              req_to_token, pool_numel, BLOCK=BLOCK_ELEMENTS)
