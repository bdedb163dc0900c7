"""The naive baseline of ``benchmarks/throughput.py``: it checks what kvfence checks (values, missing
writes, the slack after the used length, every kv_indptr column), so the speed ratio compares equal
work; and its CPU smoke path (``--device cpu --quick``) runs."""

import importlib.util
from pathlib import Path

import pytest

from kvfence.contracts.draft.case import Batch, Config
from kvfence.contracts.draft.compare import PLANTED_FILE

pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def throughput():
    spec = importlib.util.spec_from_file_location("kvfence_throughput", ROOT / "benchmarks" / "throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIG = Config(topk=2, num_steps=2, ctx=8, max_bs=4, sizing="safe")
BATCH = Batch((5, 3), (2, 0), 11)


@pytest.mark.parametrize("plant", ["kvi_value", "kvi_missing", "kvi_slack", "indptr_column0", "indptr_past_bs"])
def test_the_naive_harness_sees_what_kvfence_sees(throughput, plant):
    """Each planted bad write (a wrong value, a missing write, a write into the slack, kv_indptr column 0
    and a column past bs) is counted by the naive check; the reference on the same case is clean."""
    assert throughput.naive_errors(CONFIG, BATCH, "reference", device="cpu") == 0
    assert throughput.naive_errors(CONFIG, BATCH, f"{PLANTED_FILE}:{plant}", device="cpu") == 1


def test_the_cpu_smoke_path_reports_both_ratios(throughput):
    out = throughput.naive_vs_kvfence("cpu", quick=True)
    for size in ("large", "small"):
        naive, ours = out[f"naive_us_{size}"], out[f"kvfence_us_{size}"]
        assert naive > 0 and ours > 0
        assert out[f"naive_over_kvfence_{size}"] == round(naive / ours, 1)
    assert out["naive_cases_small"] == 4 and out["naive_large_config"] == throughput.LARGE_CPU_QUICK


def test_a_fuzz_command_run_gives_structural_rates_from_its_own_summary(throughput):
    """The fuzz-command stage on the CPU (a short default run): the headline rate counts structurally
    distinct cases from the run's own summary, never more than the verified ones, with the fraction of
    structurally new cases and the token-table variants beside it."""
    run = throughput._fuzz_cli(["--device", "cpu", "--max-examples", "8", "--seed", "1", "--jobs", "1"], timeout=240)
    rates = throughput.run_rates("default", run)
    assert run["verified_cases"] >= run["structural_cases"] >= 1
    assert rates["default_run"] is run and rates["default_distinct_configs"] == run["distinct_configs"] >= 1
    assert rates["default_structural_cases_per_s"] == round(run["structural_cases"] / run["wall_s"], 1)
    assert rates["default_structural_cases_per_s"] <= rates["default_verified_cases_per_s"]
    assert rates["default_structurally_new_fraction"] == round(run["structural_cases"] / run["verified_cases"], 3)
    assert (rates["default_token_variant_cases"] == run["token_variant_cases"]
            <= run["verified_cases"] - run["structural_cases"])


def test_the_h200_command_names_only_stages_that_exist(throughput):
    stages = throughput.H200_COMMAND.split("--only ")[1].split()[0].split(",")
    assert set(stages) <= set(throughput.STAGES) and "runs" in stages and "scale" not in stages
    assert "--json benchmarks/results/h200.json" in throughput.H200_COMMAND
