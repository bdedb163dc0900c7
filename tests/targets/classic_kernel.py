"""A classic-ABI kernel (docs/contract.md §2) with none of §6's parameters: kvfence's reference at its
defaults behind the 13-argument signature. Used to check that §6 configs are refused for such a kernel
and that default fuzzing of it draws no §6 field."""

import triton
import triton.language as tl

from kvfence.kernels.draft.draft_kv_indices import generate_draft_decode_kv_indices as _reference


@triton.jit
def classic(req_pool_indices, req_to_token, paged_kernel_lens, kv_indices, kv_indptr, positions, pool_len,
            kv_indices_stride, kv_indptr_stride, bs_upper: tl.constexpr, iter_upper: tl.constexpr,
            num_tokens_upper: tl.constexpr, page_size: tl.constexpr):
    _reference(req_pool_indices, req_to_token, paged_kernel_lens, kv_indices, kv_indptr, positions, pool_len,
               kv_indices_stride, kv_indptr_stride, bs_upper, iter_upper, num_tokens_upper, page_size)
