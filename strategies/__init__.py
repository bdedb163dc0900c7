"""Hypothesis strategies for a project's own ``@given`` tests (docs/own-kernel.md): the draft kernel's
``configs()``, ``batches(config)``, ``cases()`` and ``case_runs()``. Each contract's strategies live in its own
folder (``kvfence.contracts.<name>.strategies``); this module is the public name for the draft's."""

from kvfence.contracts.draft.strategies import batches, case_runs, cases, configs

__all__ = ["batches", "case_runs", "cases", "configs"]
