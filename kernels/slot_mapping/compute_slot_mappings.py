"""kvfence's slot-mapping kernel, written from docs/contract.md §11 (vLLM's model runner V2 ABI).

Grid ``(num_groups, num_reqs + 1)``. Program ``(g, b)`` with ``b < num_reqs`` writes the slots of request ``b``'s
tokens ``query_start_loc[b] .. query_start_loc[b + 1] - 1`` in row ``g`` of ``slot_mappings``: the slot of a
token at position ``p`` is ``block_table_g[idx_mapping[b], j] * block_size_g + o`` with ``(j, o) = divmod(p,
block_size_g)`` (under context parallelism, of the rank-local position), and ``PAD_ID`` where the group takes no
slot mapping, the request is a dummy (``idx_mapping[b] < 0``), the token belongs to another rank, or ``j`` passes
the row: ``j >= block_table_strides[g]``, the row's width (rows are contiguous, as vLLM lays them out). The last
program ``(g, num_reqs)`` pads every column from ``query_start_loc[num_reqs]`` to ``max_num_tokens``.

Each group's table is reached through a table of addresses (``block_table_ptrs``, uint64), as vLLM passes it.
Every load and store is masked; the load of a block id is masked by the row bound too: that is the contract.
A per-request condition joins a per-token mask through ``tl.where``, not ``&``: Triton's interpreter (3.9) turns
``block & scalar_bool`` into integers, which a masked load refuses.
"""

import triton
import triton.language as tl


@triton.jit
def compute_slot_mappings_kernel(
    max_num_tokens,  # columns of each slot-mapping row
    idx_mapping,  # [num_reqs] block-table row of each request; < 0: a dummy request
    query_start_loc,  # [num_reqs + 1] first token of each request, then the batch's token count
    pos,  # [num_tokens] position of each token
    block_table_ptrs,  # [num_groups] uint64: the address of each group's block table
    block_table_strides,  # [num_groups] each group's row stride, which is its row width
    block_sizes,  # [num_groups] tokens per block
    slot_mapping_enabled,  # [num_groups] bool: the group takes a slot mapping
    dcp_sharded,  # [num_groups] bool: the group's KV is split across the context-parallel ranks
    slot_mappings_ptr,  # [num_groups, max_num_tokens] int64 output
    slot_mappings_stride,
    cp_rank,
    CP_SIZE: tl.constexpr,
    CP_INTERLEAVE: tl.constexpr,
    PAD_ID: tl.constexpr,
    TRITON_BLOCK_SIZE: tl.constexpr,
):
    group = tl.program_id(0)
    b = tl.program_id(1)
    out_row = slot_mappings_ptr + group * slot_mappings_stride

    if b == tl.num_programs(1) - 1:
        # The last program: PAD from the batch's last token to the end of the row.
        first = tl.load(query_start_loc + b)
        for t0 in range(first, max_num_tokens, TRITON_BLOCK_SIZE):
            cols = t0 + tl.arange(0, TRITON_BLOCK_SIZE)
            tl.store(out_row + cols, PAD_ID, mask=cols < max_num_tokens)
        return

    table = tl.load(block_table_ptrs + group).to(tl.pointer_type(tl.int32))
    row_width = tl.load(block_table_strides + group)
    block_size = tl.load(block_sizes + group)
    enabled = tl.load(slot_mapping_enabled + group) != 0  # a comparison: a mask of int1 on every backend
    row = tl.load(idx_mapping + b)
    real = row >= 0
    start = tl.load(query_start_loc + b)
    end = tl.load(query_start_loc + b + 1)
    for t0 in range(start, end, TRITON_BLOCK_SIZE):
        cols = t0 + tl.arange(0, TRITON_BLOCK_SIZE)
        in_req = cols < end
        p = tl.load(pos + cols, mask=in_req, other=0)
        if CP_SIZE == 1:
            local = p
            mine = in_req
        else:
            sharded = tl.load(dcp_sharded + group) != 0
            span = block_size * CP_SIZE  # one block of every rank
            vblock = p // span
            voff = p % span
            owner = (voff // CP_INTERLEAVE) % CP_SIZE
            rounds = voff // (CP_INTERLEAVE * CP_SIZE)
            local_sharded = vblock * block_size + rounds * CP_INTERLEAVE + voff % CP_INTERLEAVE
            local = tl.where(sharded, local_sharded, p)
            mine = tl.where(sharded, owner == cp_rank, True)
        j = local // block_size
        inside = j < row_width
        read = tl.where(real & enabled, mine & inside & in_req, False)
        block = tl.load(table + row.to(tl.int64) * row_width + j, mask=read, other=0)
        slot = block.to(tl.int64) * block_size + local % block_size
        slot = tl.where(read, slot, PAD_ID)
        tl.store(out_row + cols, slot, mask=in_req)


def launch(kernel, *, slot_mappings, idx_mapping, query_start_loc, positions, block_table_ptrs,
           block_table_strides, block_sizes, slot_mapping_enabled, dcp_sharded, cp_rank, cp_size, cp_interleave,
           pad_id, tile):
    """The V2 ABI: grid ``(num_groups, num_reqs + 1)``, the slot-mapping row width and stride from its view."""
    grid = (slot_mappings.shape[0], idx_mapping.shape[0] + 1)
    kernel[grid](slot_mappings.shape[1], idx_mapping, query_start_loc, positions, block_table_ptrs,
                 block_table_strides, block_sizes, slot_mapping_enabled, dcp_sharded, slot_mappings,
                 slot_mappings.stride(0), cp_rank, CP_SIZE=cp_size, CP_INTERLEAVE=cp_interleave, PAD_ID=pad_id,
                 TRITON_BLOCK_SIZE=tile)
