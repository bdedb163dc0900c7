"""The naive baseline of ``benchmarks/throughput.py``: it checks what kvfence checks (values, missing
writes, the slack after the used length, every kv_indptr column), so the speed ratio compares equal
work; and its CPU smoke path (``--device cpu --quick``) runs."""

import importlib.util
from pathlib import Path

import pytest

from kvfence.cases.case import Batch, Config
from kvfence.workflow.compare import PLANTED_FILE

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
