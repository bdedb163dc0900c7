"""Hypothesis strategies for a project's own ``@given`` tests (docs/own-kernel.md), over the draft kernel's
contract: ``configs()`` (a config), ``batches(config)`` (a batch for it), ``cases()`` (a launch: a config, a batch,
the kernel, bound to its sizing) and ``case_runs()`` (several launches of one config). A launch is what a checker
takes: ``kvfence_session(launch.kernel).check(launch)``. Each contract's strategies live in its own folder
(``kvfence.contracts.<name>.strategies``); this module is the public name for the draft's.
"""

from kvfence.contracts.draft import strategies as _draft
from kvfence.contracts.draft.record import launch_of
from kvfence.contracts.draft.strategies import batches, configs

__all__ = ["batches", "case_runs", "cases", "configs"]


def cases(config_strategy=None, **kw):
    """A launch of the draft kernel: a config (from ``config_strategy``, default ``configs()``), then a batch for
    it (``kernel``, ``seq_len_limit``, ``canary_seed`` as ``kvfence.contracts.draft.strategies.cases``)."""
    return _draft.cases(config_strategy, **kw).map(launch_of)


def case_runs(config_strategy=None, **kw):
    """A list of launches of one config: successive replays of one captured config, as a server does
    (``kvfence.contracts.draft.strategies.case_runs``)."""
    return _draft.case_runs(config_strategy, **kw).map(lambda run: [launch_of(case) for case in run])
