"""On the GPU: compiled kernels inside real captured CUDA graphs (``pytest -m gpu --kvfence-device cuda``).

The CPU suite already runs the state machine, the fast checkers and every detection test under the
interpreter; with ``--device cuda`` those same tests run compiled. The tests here are about what only
a GPU has: graph capture and replay, the device verifier at speed, and worker pinning.
"""

import time

import pytest
import torch

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.runner import GraphRunner
from kvfence.contracts.draft.session import Session
from kvfence.contracts.draft.strategies import configs
from kvfence.engine.findings import Kind
from kvfence.engine.loop import fuzz
from kvfence.engine.plan import RunPlan
from kvfence.strategies import cases

pytestmark = pytest.mark.gpu


def test_graph_runner_captures_one_graph_per_bucket_and_replays_them(device):
    config = Config(topk=3, num_steps=4, page_size=16, ctx=200, max_bs=8, sizing="safe")
    session = Session(device, "reference", verifier="oracle")
    for raw_bs, L in ((8, 200), (3, 17), (1, 1), (5, 64), (8, 33), (2, 199)):
        case = Case(config, Batch(tuple([L] * raw_bs), tuple(range(raw_bs)), raw_bs))
        assert session.check(case) == []
    runner = session.runner(config)
    assert isinstance(runner, GraphRunner)
    assert sorted(runner.graphs) == [1, 2, 4, 8]
    assert all(isinstance(g, torch.cuda.CUDAGraph) for g in runner.graphs.values())


def test_device_verifier_agrees_with_the_oracle_verdict_on_graph_replays(device):
    config = Config(topk=4, num_steps=3, page_size=4, ctx=300, max_bs=16, sizing="prefix")
    fast, plain = Session(device, "reference", verifier="device"), Session(device, "reference", verifier="oracle")
    for raw_bs, L in ((16, 300), (2, 5), (9, 150), (16, 70), (1, 300)):
        case = Case(config, Batch(tuple([L] * raw_bs), tuple(range(raw_bs)), 7))
        a, b = fast.check(case), plain.check(case)
        assert [(f.kind, f.buffer, f.region, f.start, f.stop) for f in a] == \
               [(f.kind, f.buffer, f.region, f.start, f.stop) for f in b]
    assert fast.stats["fast_clean"] >= 1 and fast.stats["full"] >= 1


def test_prefix_policy_is_caught_inside_a_captured_graph_within_seconds(device):
    """The pre-fix sizing (max_bs*ctx, no topk factor), found by fuzzing compiled graph replays. Kernels are compiled
    and graphs captured by a clean warm-up first: the time counts fuzzing, not Triton's compiler."""
    pinned = dict(topk=4, num_steps=3, page_size=1, ctx=256, max_bs=8)
    session = Session(device, "reference")
    for m in (1, 2, 4, 8):  # compile and capture every bucket of the prefix config
        session.check(Case(Config(sizing="prefix", **pinned), Batch(tuple([1] * m), tuple(range(m)))))
    t0 = time.perf_counter()
    result = fuzz(session, cases(configs(sizing="prefix", **pinned)), RunPlan(max_examples=1000, seed=2))
    assert result.findings, "prefix sizing not caught"
    # Alone it is well under a second; under `pytest -n auto` every core's worker shares the one GPU.
    assert result.first_failure_s < 5.0, result.first_failure_s
    assert {f.kind for f in result.findings} & {Kind.GUARD_OVERWRITE, Kind.STRAY_WRITE}
    assert time.perf_counter() - t0 < 120


def test_worker_pinning_maps_workers_onto_gpus(device):
    from kvfence.device import pin_worker_gpu

    count = torch.cuda.device_count()
    assert pin_worker_gpu("gw0") == 0
    assert pin_worker_gpu(f"gw{count}") == 0
    assert torch.cuda.current_device() == 0


def test_each_xdist_worker_runs_on_its_own_gpu(device):
    """Under ``pytest -n N`` with several GPUs, the kvfence pytest plugin pins worker gwI to GPU I mod count, and the
    tensors kvfence allocates land there."""
    import os

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    count = torch.cuda.device_count()
    if worker is None or count < 2:
        pytest.skip("needs pytest-xdist workers and at least 2 GPUs")
    expected = int(worker[2:]) % count
    assert torch.cuda.current_device() == expected
    session = Session(device, "reference")
    config = Config(topk=2, num_steps=2, ctx=16, max_bs=2, sizing="safe")
    assert session.check(Case(config, Batch((16, 3), (0, 1)))) == []
    assert session.runner(config).kv_indices.flat.device.index == expected
