"""kvfence's own Triton kernels of the req_to_token contract(s)."""
