"""kvfence's own kernels (``kvfence.kernels``): the reference kernels, their mutants and the verification
kernels. Importing this package imports no kernel (and no triton): the device choice comes first."""

from pathlib import Path

#: Where the kernel files are, in a checkout and in an installed wheel alike (mutants load them by path).
KERNELS_DIR = Path(__file__).resolve().parent
