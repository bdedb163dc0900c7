"""compute-sanitizer: runs folded into findings, the nightly sweep and its detection matrix."""
