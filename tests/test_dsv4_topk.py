"""The DeepSeek-V4 top-k global-index read contract (docs/contract.md §12), with vLLM 0.34.0's kernels.

The oracle is checked by a hand-worked example. A padding token whose row of the shared top-k buffer holds its
row's wall ``W * B`` makes the release's load (a planted patch of kvfence's own kernel, masked as the release masks
it: ``idx >= 0`` only) read the next request's row (``VALUE_MISMATCH``), the tail guard past the last row
(``POISON_READ``; on the CPU the address audit's ``OOB_READ``) and a spare row (``POISON_READ``); uninitialised
memory (``2**31 - 1``) reads far past the table (``OOB_READ``); kvfence's kernel, bounded and gated, is clean on the
same launches. The vLLM kernel source reads fake wheels built here from kvfence's own kernel text: DeepSeek-V4's
shape (the body a ``@staticmethod`` of a class, lifted out) and V4.1's (a plain jit function, ``:v41``), a buggy
one caught, a correct one clean, a method of another shape and an unknown variant refused in one line. The real
0.34.0 wheel (``$KVFENCE_TEST_WHEELS``) is read only by the tests marked ``long``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_slot_mapping import vllm_wheel  # one fake vLLM wheel for every test that needs one

from kvfence.contracts.dsv4_topk import case as model
from kvfence.contracts.dsv4_topk.case import SPARE_POISON, TopkCase
from kvfence.engine import registry
from kvfence.engine.launch import bind
from kvfence.errors import BadInput

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
NAME = "dsv4-topk-indices"
KERNEL = ROOT / "kernels" / "dsv4_topk" / "global_topk_indices.py"
RECORD = registry.get(NAME)
#: kvfence's kernel with the release's mask (idx >= 0 only): a planted copy-free mutant, no wheel needed.
UNBOUNDED = "mutant:release_unbounded_load"
WHEELS = Path(os.environ["KVFENCE_TEST_WHEELS"]) if os.environ.get("KVFENCE_TEST_WHEELS") else None
VLLM = sorted(WHEELS.glob("vllm-0.34.0-*.whl")) if WHEELS is not None and WHEELS.is_dir() else []
needs_vllm = pytest.mark.skipif(not VLLM, reason="no vllm-0.34.0 wheel in $KVFENCE_TEST_WHEELS "
                                                 "(pip download vllm==0.34.0 --no-deps)")


def _kvfence(*argv, cwd, env=None):
    full = dict(os.environ, TRITON_INTERPRET="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=600)


def _check(case: TopkCase, kernel: str = "reference", sizing: str = "safe"):
    from kvfence.engine import kernels
    from kvfence.engine.checking import check_launch

    launch = bind(RECORD, case, sizing, kernel, "eager")
    return check_launch(RECORD, kernels.resolve(RECORD, kernel), launch, "cpu", audit=True)


def _wall(rows: int, reqs, stale, table_rows=None) -> TopkCase:
    """Block size 4, a context of 8 (rows of W = 2 blocks: the wall is 8); a valid token in each of ``rows`` rows,
    then a padding token in row ``reqs`` whose indices are ``stale``."""
    valid = tuple((r, (r + 1, -1)) for r in range(rows))
    return TopkCase(block_size=4, ctx=8, topk=2, table_rows=table_rows or rows,
                    reqs=tuple(r for r, _ in valid) + (reqs,), valid=(True,) * rows + (False,),
                    indices=tuple(i for _, i in valid) + (stale,)).validate()


def test_oracle_hand_worked_example():
    """Block size 4, ctx 8: rows of 2 blocks. A valid token of row 1 with indices 5 and -1: block 1 offset 1, and
    -1. A padding token of row 0 with 3 (inside its row: -1 or its slot, either is right: its length is 0), 8 (the
    wall: -1) and 2**31 - 1 (uninitialised memory: -1); row 2 is no token's: poison."""
    case = TopkCase(block_size=4, ctx=8, topk=3, table_rows=3, reqs=(1, 0), valid=(True, False),
                    indices=((5, -1, 0), (3, 8, 2 ** 31 - 1))).validate()
    table = model.block_table(case, 2)
    want = model.oracle(case, 8)
    slots, lens = want["global_topk_indices"], want["topk_lens"]
    assert [slots[(0, k)] for k in range(3)] == [int(table[1][1]) * 4 + 1, -1, int(table[1][0]) * 4]
    assert slots[(1, 0)] == frozenset({-1, int(table[0][0]) * 4 + 3}) and slots[(1, 1)] == slots[(1, 2)] == -1
    assert lens == {(0, 0): 2, (0, 1): 0}
    assert list(table[2]) == [SPARE_POISON - 4, SPARE_POISON - 5]
    assert model.need(case) == 5 and RECORD.sizings["block-floor"](case, "graph") == 8  # 5: block 1 of 4
    assert model.reach(case, 8) == (-1, 2)  # the padding token's garbage index lies past the table


def test_the_release_load_reads_the_next_row_the_tail_guard_a_spare_row_and_past_the_table_the_bound_is_clean():
    """A padding token of row 0 holding the wall (8, block 2 of a 2-block row): with row 1 another request's, the
    unbounded load takes row 1's first block id (where -1 is expected); in the last row, the tail guard's poison
    and the audit's read outside the table; before a row no token names, that row's poison; holding ``2**31 - 1``,
    a read far past the table, which only the audit sees (its lane is masked off). kvfence's kernel (the bound
    and the valid-token gate) is clean on every one."""
    next_owned = _wall(2, 0, (8, -1))
    found = _check(next_owned, UNBOUNDED)
    table = model.block_table(next_owned, 2)
    mismatch = [f for f in found if f.kind.value == "VALUE_MISMATCH"]
    assert mismatch and mismatch[0].buffer == "global_topk_indices" and mismatch[0].region == "row 2"
    assert mismatch[0].samples[0][1:] == (-1, int(table[1][0]) * 4)  # row 1's first block, offset 0
    last = _wall(1, 0, (-1, 8))
    kinds = {(f.kind.value, f.buffer, f.region) for f in _check(last, UNBOUNDED)}
    assert {("POISON_READ", "global_topk_indices", "row 1"), ("OOB_READ", "block_table", "tail")} <= kinds
    spare = _wall(1, 0, (9, -1), table_rows=2)
    assert {f.kind.value for f in _check(spare, UNBOUNDED)} == {"POISON_READ"}
    wild = _wall(1, 0, (2 ** 31 - 1, -1))
    assert "OOB_READ" in {f.kind.value for f in _check(wild, UNBOUNDED)}
    for case in (next_owned, last, spare, wild):
        assert _check(case) == []


def test_a_row_sized_short_is_arithmetic_and_the_bounded_kernel_maps_what_it_cannot_hold_to_minus_one():
    """Under ``block-floor`` a context of 10 with blocks of 4 gets rows of 2 blocks: a valid token's index 9 needs a
    third, ``SIZING_VIOLATION`` (decided before the launch) and -1 from the kernel, no other finding."""
    case = TopkCase(block_size=4, ctx=10, topk=1, table_rows=1, reqs=(0,), valid=(True,), indices=((9,),))
    assert [f.kind.value for f in _check(case, sizing="block-floor")] == ["SIZING_VIOLATION"]
    assert model.oracle(case, 8)["global_topk_indices"][(0, 0)] == -1


def test_reference_clean_and_every_own_mutant_caught_by_a_declared_kind():
    """The self-test on one seed, a small budget: the paired buggy/correct check of every planted bug of kvfence's
    own text and sizing (the release's kernels and their patches need vLLM's wheel: the long test below)."""
    from kvfence.selftest.mutants import self_test

    own = [m for m in RECORD.mutants if not m.kernel]
    assert {"release_unbounded_load", "ungated_bound_one_past", "sizing_block_floor"} <= {m.name for m in own}
    report = self_test(RECORD, "cpu", seeds=[0], max_examples=40, names=[m.name for m in own])
    rows = {r["name"]: r for r in report["rows"]}
    assert rows[f"reference ({NAME})"]["passed"], rows[f"reference ({NAME})"]
    for mutant in own:
        row = rows[mutant.name]
        assert row["detections"] == 1, row
        assert set(row["runs"][0]["kinds"]) & set(mutant.detects), row
    assert report["passed"]


def test_case_json_round_trips_and_bad_cases_are_one_line():
    case = TopkCase(block_size=16, ctx=40, topk=2, table_rows=2, reqs=(1, 0), valid=(True, False),
                    indices=((39, -1), (-(2 ** 31), 2 ** 31 - 1)), tile=16, seed=7)
    data = json.loads(json.dumps(RECORD.to_json(case)))
    assert RECORD.from_json(data) == case
    for bad, why in ((dict(data, indices=[[40, -1], [0, 0]]), "below ctx"), (dict(data, reqs=[2, 0]), "below "
                     "table_rows"), (dict(data, valid=[1, 0]), "true/false"), (dict(data, nope=1), "unknown"),
                     (dict(data, tile=7), "tile"), (dict(data, block_size=128), "block_size"),
                     (dict(data, indices=[[2 ** 31, 0], [0, 0]]), "int32"), ([], "expected an object")):
        with pytest.raises(BadInput, match=why):
            RECORD.from_json(bad)


# -- vLLM as an upstream: fake wheels of kvfence's own kernel text ---------------------------------------------
V4_PATH = "vllm/models/deepseek_v4/common/ops/cache_utils.py"
V41_PATH = "vllm/models/deepseek_v41/common/ops/cache_utils.py"


def _as_release(text: str, decorators=("@staticmethod", "@triton.jit")) -> dict:
    """kvfence's kernel laid out as 0.34.0's modules are: V4's the body of a class's ``kernel`` method (indented,
    ``decorators`` above it), V4.1's a top-level function under the release's name."""
    body = text.split("import triton.language as tl\n", 1)[1].split("\ndef launch(")[0].strip()
    method = "\n".join(("    " + line) if line else "" for line in body.replace(
        "def global_topk_indices_kernel(", "def kernel(").splitlines()).replace("    @triton.jit\n", "")
    header = "import torch\n\nfrom vllm.triton_utils import tl, triton\n\n\n"
    v4 = (header + "class ComputeGlobalTopkIndicesAndLensKernel:\n    TRITON_BLOCK_SIZE = 1024\n\n"
          + "".join(f"    {d}\n" for d in decorators) + method.lstrip("\n") + "\n")
    v41 = header + body.replace("def global_topk_indices_kernel(", "def _compute_global_topk_indices_and_lens_kernel(")
    return {V4_PATH: v4, V41_PATH: v41 + "\n"}


def test_the_v4_method_and_the_v41_function_are_read_a_bug_caught_a_bound_clean_refusals_one_line(tmp_path,
                                                                                                  monkeypatch):
    from kvfence.engine import kernels
    from kvfence.release import vllm_kernels

    text = KERNEL.read_text()
    unbounded = text.replace("inside = (local_idx >= 0) & (block_indices < block_table_stride)",
                             "inside = local_idx >= 0").replace(
        "mapped = tl.where(is_valid_token, in_topk & inside, False)", "mapped = in_topk & inside").replace(
        "count += tl.sum(mapped.to(tl.int32), axis=0)",
        "count += tl.sum(tl.where(is_valid_token, mapped, False).to(tl.int32), axis=0)")
    assert unbounded.count("local_idx >= 0") == 1 and unbounded != text
    vllm_wheel(tmp_path, "9.9.1", _as_release(text))
    vllm_wheel(tmp_path, "9.9.2", _as_release(unbounded))
    vllm_wheel(tmp_path, "9.9.3", _as_release(text, ("@triton.jit", "@staticmethod")))
    monkeypatch.setenv("KVFENCE_WHEEL_DIR", str(tmp_path))
    monkeypatch.setenv("KVFENCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVFENCE_OFFLINE", "1")
    case = _wall(2, 0, (8, -1))
    for version, bad in (("9.9.1", False), ("9.9.2", True)):
        for variant in ("", ":v41"):
            spec = f"vllm=={version}{variant}"
            kernels.resolve(RECORD, spec)
            kinds = {f.kind.value for f in _check(case, spec)}
            assert (kinds == {"VALUE_MISMATCH"}) if bad else (kinds == set()), (spec, kinds)
    lifted = tmp_path / "cache" / "contracts" / "vllm-9.9.1" / f"{NAME}.py"
    assert "\ndef kernel(\n    global_topk_indices_ptr," in lifted.read_text()  # dedented, at the top level
    assert "class " not in lifted.read_text() and "staticmethod" not in lifted.read_text()
    meta = json.loads(lifted.with_suffix(".json").read_text())
    assert meta["kernel"] == "ComputeGlobalTopkIndicesAndLensKernel.kernel" and meta["functions"] == ["kernel"]
    assert (tmp_path / "cache" / "contracts" / "vllm-9.9.1" / f"{NAME}-v41.py").is_file()
    with pytest.raises(BadInput, match="not @staticmethod then @triton.jit") as shape:
        vllm_kernels.contract_kernel(RECORD, "vllm==9.9.3")
    with pytest.raises(BadInput, match=r"or a variant \(v41\), not v5") as variant:
        vllm_kernels.contract_kernel(RECORD, "vllm==9.9.1:v5")
    assert "\n" not in str(shape.value) + str(variant.value)


def test_affected_answers_only_deepseek_v4_models_and_says_when_the_architecture_is_unknown(tmp_path):
    """No kernel runs here: another model's deployment gets no line from this contract, a model whose config is
    not on this host and whose name is not DeepSeek-V4's is UNKNOWN, one named DeepSeek-V4.1 selects ``:v41``."""
    from kvfence.contracts.dsv4_topk.affected import _kernel_of, topk_verdicts
    from kvfence.release.affected_vllm import parse_vllm

    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert topk_verdicts(parse_vllm("0.34.0", ["vllm", "serve", str(llama)]), tmp_path, "cpu") == []
    unknown = topk_verdicts(parse_vllm("0.34.0", ["vllm", "serve", "org/some-model"]), tmp_path, "cpu")
    assert [v.status for v in unknown] == ["unknown"] and "architecture is not known" in unknown[0].condition
    assert _kernel_of(parse_vllm("0.34.0", ["vllm", "serve", "deepseek-ai/DeepSeek-V4.1-Pro"]))[0] == ":v41"
    assert _kernel_of(parse_vllm("0.34.0", ["vllm", "serve", "deepseek-ai/DeepSeek-V4-Flash"]))[0] == ""


# -- vLLM 0.34.0's own wheel -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_env(tmp_path_factory):
    return {"KVFENCE_WHEEL_DIR": str(WHEELS), "KVFENCE_CACHE": str(tmp_path_factory.mktemp("cache")),
            "KVFENCE_OFFLINE": "1", "HF_HOME": str(tmp_path_factory.mktemp("hf"))}


@pytest.mark.long  # vLLM's wheel stays out of CI
@needs_vllm
@pytest.mark.parametrize("variant", ["", ":v41"])
def test_the_plain_fuzz_finds_the_real_kernels_read_past_the_row_and_repro_replays_it(tmp_path, real_env, variant):
    """``kvfence fuzz --contract dsv4-topk-indices --kernel vllm==0.34.0[:v41] --device cpu`` (the default budget)
    finds a read past the row on vLLM 0.34.0's own kernel (read from its wheel, never imported), and ``kvfence
    repro`` replays the case file it wrote; the release's text is the one the issue cites."""
    kernel = f"vllm==0.34.0{variant}"
    run = _kvfence("fuzz", "--contract", NAME, "--kernel", kernel, "--device", "cpu", "--seed", "0", "--out",
                   str(tmp_path / "o"), cwd=tmp_path, env=real_env)
    assert run.returncode == 1, run.stderr + run.stdout
    assert {"POISON_READ", "VALUE_MISMATCH", "OOB_READ"} & set(run.stdout.split()), run.stdout
    line = next(x for x in run.stdout.splitlines() if " repro " in x and x.endswith(".json"))
    again = _kvfence("repro", line.split()[-1], "--kernel", kernel, "--device", "cpu", cwd=tmp_path, env=real_env)
    assert again.returncode == 1 and "FAIL:" in again.stdout, again.stderr + again.stdout
    entry = Path(real_env["KVFENCE_CACHE"]) / "contracts" / "vllm-0.34.0" / f"{NAME}{variant.replace(':', '-')}.py"
    assert "mask=mask & is_valid,\n" in entry.read_text() and "block_table_stride" in entry.read_text()


@pytest.mark.long
@needs_vllm
def test_the_real_kernels_with_the_fix_are_clean_and_each_release_mutant_is_caught(tmp_path, real_env, monkeypatch):
    """The release's text with the fix's bound and gate patched in (``release_mutants.FIX``) is clean where the
    release reads past the row; each release mutant (the kernels as shipped, the release's text with a planted
    mistake in the fix) is caught by a kind it declares on one seed of the self-test, the reference clean."""
    from kvfence.contracts.dsv4_topk.release_mutants import FIX
    from kvfence.engine import kernels
    from kvfence.release.vllm_kernels import contract_kernel
    from kvfence.selftest.mutants import self_test

    for key, value in real_env.items():
        monkeypatch.setenv(key, value)
    cases = (_wall(2, 0, (8, -1)), _wall(1, 0, (-1, 8)), _wall(1, 0, (2 ** 31 - 1, -1)))
    for variant in ("", ":v41"):
        spec = f"vllm==0.34.0{variant}"
        assert all(_check(case, spec) for case in cases), spec  # as shipped: a finding on each
        path, function = contract_kernel(RECORD, spec)
        fixed = kernels.patched_kernel("fix", [list(p) for p in FIX], path, f"fixed{variant.replace(':', '-')}.py")
        assert all(_check(case, f"{fixed}:{function}") == [] for case in cases), spec
    release = [m for m in RECORD.mutants if m.kernel]
    assert len(release) == 4
    report = self_test(RECORD, "cpu", seeds=[0], names=[m.name for m in release], isolate=False)
    rows = {r["name"]: r for r in report["rows"]}
    for mutant in release:
        assert rows[mutant.name]["detections"] == 1 and set(rows[mutant.name]["runs"][0]["kinds"]) & set(
            mutant.detects), rows[mutant.name]
    assert report["passed"]


@pytest.mark.long
@needs_vllm
def test_affected_runs_the_release_kernel_on_a_deepseek_v4_launch(tmp_path, real_env):
    """``kvfence affected 0.34.0 vllm serve deepseek-ai/DeepSeek-V4-Flash ...``: UNKNOWN (kvfence found no launch
    flag in 0.34.0 that leaves such an index), the release's kernel shown reading the next request's row at the
    wall, the case replayable, the open fix named; a config.json saying Llama gets no line from this contract."""
    cmd = ["affected", "--device", "cpu", "--out", str(tmp_path / "out"), "--json", "0.34.0", "vllm", "serve",
           "deepseek-ai/DeepSeek-V4-Flash", "--max-model-len", "65536", "--block-size", "256"]
    run = _kvfence(*cmd, cwd=tmp_path, env=real_env)
    doc = json.loads(run.stdout)
    rows = [v for v in doc["verdicts"] if v["contract"] == NAME]
    assert len(rows) == 1 and rows[0]["status"] == "unknown" and rows[0]["observed"] == ["VALUE_MISMATCH"], rows
    assert "W * B = 256 * 64 = 16384" in rows[0]["condition"] and "vllm#57388" in rows[0]["fixed"]
    again = _kvfence("repro", rows[0]["case_file"], "--device", "cpu", cwd=tmp_path, env=real_env)
    assert again.returncode == 1 and "VALUE_MISMATCH" in again.stdout, again.stderr + again.stdout


def test_gpu_domain_draws_are_valid_cases_with_rows_wider_than_hypothesis_draws_one_by_one():
    """The GPU domain's rows reach V4's index_topk (512): the first indices of a row are drawn, the rest filled by
    a seeded generator of the same kinds; every draw is a valid case and its oracle answers (no kernel runs)."""
    from hypothesis import HealthCheck, given, settings

    from kvfence.contracts.dsv4_topk.strategies import EXPLICIT, topk_cases

    seen = []

    @settings(max_examples=30, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(topk_cases("gpu"))
    def draw(fields):
        case = TopkCase(**fields).validate()
        assert len(model.oracle(case, case.ctx)["topk_lens"]) == case.num_tokens
        seen.append(case.topk)

    draw()
    assert len(seen) == 30 and max(seen) > EXPLICIT["gpu"]
