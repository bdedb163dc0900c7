"""External tools: compute-sanitizer runs, the nightly sweep and its detection matrix."""
