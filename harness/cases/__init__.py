"""Cases and the oracle: the case model, case files, the plain-Python oracle, finding kinds, the config domains and memory budget, and what is under test (kernel and sizing specs, SGLang wheels)."""
