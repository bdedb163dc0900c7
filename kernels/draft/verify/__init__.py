"""kvfence's own verification kernels: they recompute the contract on the device and count
mismatches, so a clean case never copies its buffers to the host (see harness/contracts/draft/device_verify.py)."""
