"""kvfence's kernels of the dsv4-topk-indices contract (docs/contract.md §12)."""
