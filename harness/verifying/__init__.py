"""Verifying a launch: the verdict against the oracle, the torch write-set builder, the on-device verifier, and the session that runs and judges cases."""
