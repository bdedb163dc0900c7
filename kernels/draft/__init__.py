"""kvfence's own Triton kernels of the draft contract(s)."""
