"""Upstream releases: kernels and shipped sizing read from SGLang's wheels, the release matrices, ``affected``."""
