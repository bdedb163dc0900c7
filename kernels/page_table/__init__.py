"""kvfence's own Triton kernels of the page_table contract(s)."""
