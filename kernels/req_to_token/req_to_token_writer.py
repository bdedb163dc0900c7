"""kvfence's request-row writer, written from docs/contract.md §10 (the ``req-to-token`` ABI).

One program per request ``b`` (grid ``(bs,)``). Program ``b`` writes the positions ``[start_b, end_b)`` of pool
row ``req_pool_indices[b]`` of ``req_to_token`` (a table whose rows are ``row_stride`` elements apart) with the KV
slots of ``out_cache_loc`` that belong to it: request ``b``'s slots follow those of requests ``0 .. b-1``, so
they start at ``sum_{i<b} (end_i - start_i)``. Position ``start_b + t`` gets slot ``t`` of the request.

The stores are bounded by ``end_b`` only: the kernel is not told the row's width (``row_stride`` is the
distance between rows, which in production is the width). That is the contract: the width every row needs is
``max_b end_b``, and keeping it is the caller's sizing (§10, "Sizing").
"""

import triton
import triton.language as tl

#: Positions one loop step covers.
CHUNK = 16
_CHUNK = tl.constexpr(CHUNK)


@triton.jit
def write_req_to_token(
    req_pool_indices,        # [bs] the pool row of each request
    req_to_token,            # [pool_rows, row_stride] output: position -> KV slot
    start_offset,            # [bs] first position request b writes
    end_offset,              # [bs] one past its last
    out_cache_loc,           # [sum(end - start)] the new slots, request after request
    row_stride: tl.constexpr,
    BATCH_POW2: tl.constexpr,  # a power of two >= bs
):
    b = tl.program_id(axis=0)
    pool_row = tl.load(req_pool_indices + b).to(tl.int64)
    first = tl.load(start_offset + b).to(tl.int32)
    stop = tl.load(end_offset + b).to(tl.int32)

    # Where request b's slots begin in out_cache_loc: the lengths of the requests before it.
    earlier = tl.arange(0, BATCH_POW2)
    is_earlier = earlier < b
    earlier_first = tl.load(start_offset + earlier, mask=is_earlier, other=0).to(tl.int64)
    earlier_stop = tl.load(end_offset + earlier, mask=is_earlier, other=0).to(tl.int64)
    source = tl.sum(earlier_stop - earlier_first, axis=0)

    row = req_to_token + pool_row * row_stride
    for chunk_first in range(first, stop, _CHUNK):
        position = chunk_first + tl.arange(0, _CHUNK)
        in_request = position < stop
        slot = tl.load(out_cache_loc + source + (position - first), mask=in_request)
        tl.store(row + position, slot, mask=in_request)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def launch(kernel, *, req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc):
    """The ``req-to-token`` ABI: grid ``(bs,)``, the table's row stride and a power of two >= bs, positional
    (a release names its parameters otherwise)."""
    bs = req_pool_indices.shape[0]
    kernel[(bs,)](req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                  req_to_token.stride(0), next_power_of_2(bs))
