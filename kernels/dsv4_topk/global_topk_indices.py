"""kvfence's DeepSeek-V4 top-k global-index kernel, written from docs/contract.md §12 (vLLM 0.34.0's ABI).

Grid ``(num_tokens,)``. Program ``t`` maps token ``t``'s local top-k indices (compressed-token positions of its
request, -1 where there is none) to KV-cache slots through the request's block-table row: the slot of index
``idx`` is ``block_table[req, idx // block_size] * block_size + idx % block_size`` with ``req =
token_to_req_indices[t]``, and -1 for a negative index. ``topk_lens[t]`` counts the token's mapped indices, 0 for a
token that is not valid (a padding token).

The load of a block id is masked by the contract's bound, which the released kernel lacks: the token is valid
(``is_valid_token[t]``: a padding token's indices are whatever the shared buffer last held) and the block index
``idx // block_size`` is inside the row, ``< block_table_stride`` (rows are contiguous, as vLLM lays them out, so
the stride is the row's width). An index that fails either maps to -1 and is not counted. The parameter names are
the release's (``kvfence.release.vllm_kernels`` checks them).
"""

import triton
import triton.language as tl


@triton.jit
def global_topk_indices_kernel(
    global_topk_indices_ptr,  # [num_tokens, topk] int32 output: slots, -1 where none
    global_topk_indices_stride: tl.constexpr,
    topk_lens_ptr,  # [num_tokens] int32 output: mapped indices per token, 0 for an invalid token
    topk_indices_ptr,  # [num_tokens, topk] int32: local compressed-token indices, < 0 for none
    topk_indices_stride: tl.constexpr,
    topk: tl.constexpr,
    token_to_req_indices_ptr,  # [num_tokens] each token's block-table row
    block_table_ptr,  # [num_rows, block_table_stride] int32 block ids, rows contiguous
    block_table_stride: tl.constexpr,  # the row stride, which is the row's width in blocks
    block_size: tl.constexpr,  # compressed tokens per block
    is_valid_token_ptr,  # [num_tokens] bool: False for a padding token
    TRITON_BLOCK_SIZE: tl.constexpr,
):
    token_idx = tl.program_id(0)
    # A comparison: a mask of int1 on every backend (the interpreter loads a bool tensor as int8).
    is_valid_token = tl.load(is_valid_token_ptr + token_idx) != 0
    req_idx = tl.load(token_to_req_indices_ptr + token_idx).to(tl.int64)
    row = block_table_ptr + req_idx * block_table_stride

    count = tl.zeros((), dtype=tl.int32)
    for i in range(0, topk, TRITON_BLOCK_SIZE):
        offset = i + tl.arange(0, TRITON_BLOCK_SIZE)
        in_topk = offset < topk
        local_idx = tl.load(topk_indices_ptr + token_idx * topk_indices_stride + offset, mask=in_topk, other=-1)
        block_indices = local_idx // block_size
        inside = (local_idx >= 0) & (block_indices < block_table_stride)
        # The bound: a valid token's index inside its row. tl.where joins the per-token scalar with the block.
        mapped = tl.where(is_valid_token, in_topk & inside, False)
        block_numbers = tl.load(row + block_indices, mask=mapped, other=0)
        slot_ids = tl.where(mapped, block_numbers * block_size + local_idx % block_size, -1)
        tl.store(global_topk_indices_ptr + token_idx * global_topk_indices_stride + offset, slot_ids, mask=in_topk)
        count += tl.sum(mapped.to(tl.int32), axis=0)

    tl.store(topk_lens_ptr + token_idx, count)


def launch(kernel, *, global_topk_indices, topk_lens, topk_indices, token_to_req_indices, block_table, block_size,
           is_valid_token, tile):
    """vLLM's launch: grid ``(num_tokens,)``, every stride from its view, ``topk`` the indices' last dimension."""
    kernel[(topk_indices.shape[0],)](
        global_topk_indices, global_topk_indices.stride(0), topk_lens, topk_indices, topk_indices.stride(0),
        topk_indices.shape[-1], token_to_req_indices, block_table, block_table.stride(0), block_size,
        is_valid_token, TRITON_BLOCK_SIZE=tile)
