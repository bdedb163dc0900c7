"""The fuzz loop hands a contract's record launches only (``kvfence.contract.Launch``), on every device.

The GPU suite once fuzzed the draft runner's own ``Case`` values (``kvfence.contracts.draft.strategies.cases``)
through ``kvfence.engine.loop.fuzz``: the draft record's ``keys`` then failed with ``AttributeError: 'Case' object
has no attribute 'case'``, on the CUDA path only because only ``tests/test_gpu.py`` took it. Nothing here needs a
GPU: the same loop, the same record and the same session run under the interpreter.
"""

import pytest

from kvfence.contracts.draft import strategies as runner_strategies
from kvfence.contracts.draft.session import Session
from kvfence.engine.findings import Kind
from kvfence.engine.loop import fuzz
from kvfence.engine.plan import RunPlan
from kvfence.strategies import cases, configs

#: The GPU test's prefix config, at interpreter size.
PINNED = dict(topk=4, num_steps=2, page_size=1, ctx=8, max_bs=2)


def test_a_runner_case_drawn_into_the_loop_is_refused_at_once_naming_the_launch_strategies(device):
    session = Session(device, "reference")
    with pytest.raises(TypeError, match=r"kvfence\.strategies\.cases\(\)") as raised:
        fuzz(session, runner_strategies.cases(configs(sizing="prefix", **PINNED)),
             RunPlan(max_examples=5, seed=0, shrink_seconds=0, targeting=False))
    assert "kvfence.contracts.draft.case.Case" in str(raised.value)
    assert session.stats["launches"] == 0  # refused before any launch, not after a failure deep in the record


def test_the_gpu_suites_prefix_search_finds_the_overflow_through_launches(device):
    """``tests/test_gpu.py::test_prefix_policy_is_caught_inside_a_captured_graph_within_seconds``'s path: the
    draft session fed the launches ``kvfence.strategies.cases`` draws, the prefix sizing caught by what the kernel
    wrote past its row; the safe sizing of the same config is clean."""
    found = fuzz(Session(device, "reference"), cases(configs(sizing="prefix", **PINNED)),
                 RunPlan(max_examples=60, seed=2, shrink_seconds=0, targeting=False))
    assert found.findings, "prefix sizing not caught"
    assert {f.kind for f in found.findings} & {Kind.GUARD_OVERWRITE, Kind.STRAY_WRITE}
    clean = fuzz(Session(device, "reference"), cases(configs(sizing="safe", **PINNED)),
                 RunPlan(max_examples=20, seed=2, shrink_seconds=0, targeting=False))
    assert clean.findings == [] and clean.examples == 20
