"""kvfence's own Triton kernels of the fa3_metadata contract(s)."""
