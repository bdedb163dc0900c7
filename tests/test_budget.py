"""One memory budget for every contract: a launch costs its tables in the engine's guarded buffers plus what the
contract's own checker holds (``Contract.checker_bytes``), one number from ``kvfence.engine.budget.launch_bytes``
that ``require_fits`` refuses a launch by and ``fit`` fits a draw to, for a plug-in as for the draft. Cheap: shapes
and CPU tensors, no kernel."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvfence.contract import Launch
from kvfence.contracts.draft.case import Config
from kvfence.contracts.draft.record import DRAFT
from kvfence.contracts.draft.runner_buffers import config_bytes, runner_bytes, widest_launch
from kvfence.engine import tables as guarded
from kvfence.engine.budget import fit, launch_bytes, table_bytes
from kvfence.engine.checking import require_fits
from kvfence.engine.launch import bind, spill
from kvfence.engine.record_check import RecordError
from kvfence.errors import BadInput

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def csr(monkeypatch):
    """The worked example's record (tests/fixtures/csr_contract), a contract written outside kvfence."""
    monkeypatch.syspath_prepend(str(FIXTURES / "csr_contract"))
    import csr_contract

    return csr_contract


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES / "toy_contract"))
    import toy_contract

    return toy_contract


def _allocated(record, launch: Launch) -> int:
    """Bytes the engine's guarded tables of ``launch`` really take (built on the CPU)."""
    buffers = guarded.allocate_all(record.tables(launch), "cpu", layout=launch.layout, spill=spill(record, launch))
    return sum(g.flat.numel() * g.flat.element_size() for g in buffers.values())


def _refused_at(record, launch: Launch) -> int:
    """The largest budget ``require_fits`` refuses ``launch`` under (one line), the smallest it takes being one more."""
    size = launch_bytes(record, launch)
    require_fits(record, launch, size)
    with pytest.raises(BadInput, match="nothing was allocated") as refused:
        require_fits(record, launch, size - 1)
    assert len(str(refused.value).splitlines()) == 1
    return size - 1


def test_a_plug_in_and_the_draft_are_held_to_one_number(csr):
    """The plug-in's launch costs exactly its tables as the engine allocates them (no checker of its own); the
    draft's costs its tables plus its checker's runner, pool copies and verdict temporaries, and a draw of the draft
    (``config_bytes``) is priced by that same function at its widest launch. ``require_fits`` refuses each one
    byte under it. (Before one budget, the draft's draws were priced by their own module while ``require_fits``
    counted its tables only, so a launch 1 byte over its draws' number passed.)"""
    plugin = bind(csr.CSR, csr.CsrCase((5, 0, 17), (2, 0, 1), 17), "safe")
    assert launch_bytes(csr.CSR, plugin) == table_bytes(csr.CSR, plugin) == _allocated(csr.CSR, plugin)
    assert _refused_at(csr.CSR, plugin) == _allocated(csr.CSR, plugin) - 1

    config = Config(topk=2, num_steps=3, page_size=4, ctx=21, max_bs=4)
    draft = widest_launch(config)
    assert DRAFT.checker_bytes(draft) == runner_bytes(config) > 0
    assert launch_bytes(DRAFT, draft) == _allocated(DRAFT, draft) + runner_bytes(config) == config_bytes(config)
    assert _refused_at(DRAFT, draft) == config_bytes(config) - 1


def test_a_plug_ins_own_checker_bytes_count_and_a_wrong_answer_is_one_line(csr):
    class WithChecker(csr.CsrKvIndices):
        own = 4096

        def checker_bytes(self, launch):
            return self.own

    record = WithChecker()
    launch = bind(record, csr.CsrCase((3, 9), (1, 0), 9), "safe")
    assert launch_bytes(record, launch) == table_bytes(record, launch) + 4096
    with pytest.raises(BadInput):
        require_fits(record, launch, table_bytes(record, launch) + 4095)
    for wrong in (-1, 1.5, "4K", True, None):
        record.own = wrong
        with pytest.raises(RecordError, match=r"checker_bytes\(launch\) must return a non-negative int"):
            launch_bytes(record, launch)


def test_a_plug_ins_draw_is_fitted_by_the_engines_fit_to_the_number_its_launch_is_held_to(toy):
    """``fit`` halves the plug-in's free field until its launch fits, as the draft's draws do (``fit_config``);
    the fitted case's launch then passes ``require_fits`` at that budget, the unfitted one does not."""
    record = toy.TOY

    def cost(case):
        return launch_bytes(record, bind(record, case, "safe"))

    big = toy.ToyCase((8, 8, 8), 4096)
    budget = cost(dataclasses.replace(big, width=512))
    fitted = fit(big, budget, ("width",), cost)
    assert fitted == dataclasses.replace(big, width=512)  # halved three times, the first that fits
    assert fit(big, budget - 1, ("width",), cost) == dataclasses.replace(big, width=256)
    assert cost(fitted) <= budget < cost(big)
    require_fits(record, bind(record, fitted, "safe"), budget)
    with pytest.raises(BadInput):
        require_fits(record, bind(record, big, "safe"), budget)
    assert fit(big, None, ("width",), cost) is big
    assert fit(big, 100, ("width",), cost) is None  # the smallest width still takes more: nothing left to halve


@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_every_launch_of_a_fitted_draw_costs_at_most_its_configs_bytes(mode):
    """A draft config's bytes are its widest launch's: every launch drawn of it (fewer or shorter requests) costs at
    most that, so a draw fitted to the budget is never refused by ``require_fits`` at that budget. On the GPU
    domain, where fitting shrinks most draws; no kernel runs."""
    from hypothesis import HealthCheck, Phase, given, settings

    from kvfence.contracts.draft.record import launch_of
    from kvfence.contracts.draft.strategies import cases, configs

    budget, seen = 8 * 2**20, []

    @settings(max_examples=60, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(cases(configs(domain="gpu", max_bytes=budget, mode=mode)))
    def check(case):
        launch = launch_of(case)
        assert launch_bytes(DRAFT, launch) <= config_bytes(case.config) <= budget
        require_fits(DRAFT, launch, budget)
        seen.append(case.batch.raw_bs < case.config.max_bs)

    check()
    assert any(seen) and not all(seen)  # launches below and at the widest were both checked
