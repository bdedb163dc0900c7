"""The slot-mapping read contract (docs/contract.md §11) and vLLM as a second upstream (``--kernel vllm==V``).

The oracle is checked by a hand-worked example; the release's unguarded load (a planted patch of kvfence's own
kernel, as the release spells its mask) reads the next request's row (``VALUE_MISMATCH``), the tail guard past the
last row (``POISON_READ`` and, on the CPU, the address audit's ``OOB_READ``) and a spare row (``POISON_READ``),
while the kernel with the row guard is clean; the self-test catches every planted bug by a kind it declares. The
vLLM kernel source reads fake wheels built here from kvfence's own kernel text (no network): a kernel reached
through an imported jit helper, a buggy one caught, a correct one clean, a release without the kernel and one of
another signature refused in one line. The real 0.34.0 wheel is checked only where it is already on disk.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvfence.contracts.slot_mapping import case as model
from kvfence.contracts.slot_mapping.case import PAD, SPARE_POISON, Group, SlotCase
from kvfence.engine import registry
from kvfence.engine.launch import bind

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
NAME = "slot-mapping"
KERNEL = ROOT / "kernels" / "slot_mapping" / "compute_slot_mappings.py"
RECORD = registry.get(NAME)
#: What the release's load reads for: kvfence's kernel with the row bound dropped, as the release masks it.
UNGUARDED = "mutant:release_unguarded_load"


def _kvfence(*argv, cwd, env=None):
    full = dict(os.environ, TRITON_INTERPRET="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=600)


def _check(case: SlotCase, kernel: str = "reference", sizing: str = "safe"):
    from kvfence.engine import kernels
    from kvfence.engine.checking import check_launch

    launch = bind(RECORD, case, sizing, kernel, "eager")
    return check_launch(RECORD, kernels.resolve(RECORD, kernel), launch, "cpu", audit=True)


def test_oracle_hand_worked_example():
    """Block size 4, a group whose row is 2 blocks (8 positions) and one sized by the context (16 tokens: 4
    blocks); request 0 in row 1 at positions 6..9, a dummy request of one token, 2 padded columns. Position 6 is
    block 1 offset 2; positions 8 and 9 pass the narrow row (PAD there) and stay inside the sized one."""
    case = SlotCase(ctx=16, groups=(Group(4, 2), Group(4)), req_rows=(1, -1), starts=(6, 0), query_lens=(4, 1),
                    table_rows=2, pad=2).validate()
    narrow, sized = model.block_table(case, 0, 2), model.block_table(case, 1, 4)
    want = model.oracle(case, 16)
    assert [want[(0, t)] for t in range(7)] == [narrow[1][1] * 4 + 2, narrow[1][1] * 4 + 3, PAD, PAD, PAD, PAD, PAD]
    assert [want[(1, t)] for t in range(4)] == [sized[1][1] * 4 + 2, sized[1][1] * 4 + 3, sized[1][2] * 4,
                                                sized[1][2] * 4 + 1]
    assert list(narrow[0]) == [SPARE_POISON, SPARE_POISON - 1]  # row 0 is no request's: poison
    assert model.need(case) == 9 and RECORD.sizings["block-floor"](case, "graph") == 16  # 9: block 2 of 4 tokens
    assert RECORD.need(bind(RECORD, case, "safe")) <= case.ctx
    cp = SlotCase(ctx=64, groups=(Group(4),), req_rows=(0,), starts=(0,), query_lens=(16,), table_rows=1,
                  cp_size=2, cp_rank=1, cp_interleave=2).validate()
    # rank 1 of 2, interleave 2: of each 8 positions it holds 2, 3, 6, 7, at local offsets 0, 1, 2, 3 of a block
    assert [model.local_position(cp, 0, p) for p in range(10)] == [None, None, 0, 1, None, None, 2, 3, None, None]


def test_the_release_load_reads_the_next_row_the_tail_guard_and_a_spare_row_and_the_guard_is_clean():
    """One group of block size 4 whose row is 1 block; the request at positions 3..4 passes it at position 4.
    In row 0 with row 1 another request's: the unguarded load takes row 1's first block id (vllm#54296's own
    regression shape, the next row's block where PAD is expected); in the last row: the tail guard (poison, and
    the audit's read outside the table's rows); followed by a row no request owns: that row's poison."""
    group = (Group(4, 1),)
    next_owned = SlotCase(ctx=8, groups=group, req_rows=(0, 1), starts=(3, 0), query_lens=(2, 1), table_rows=2)
    found = _check(next_owned, UNGUARDED)
    table = model.block_table(next_owned, 0, 1)
    mismatch = [f for f in found if f.kind.value == "VALUE_MISMATCH"]
    assert mismatch and mismatch[0].region == "row 0" and mismatch[0].start == 1
    assert mismatch[0].samples[0][1:] == (PAD, int(table[1][0]) * 4 + 0)  # row 1's block, offset 0
    last = SlotCase(ctx=8, groups=group, req_rows=(0,), starts=(3,), query_lens=(2,), table_rows=1)
    kinds = {(f.kind.value, f.buffer, f.region) for f in _check(last, UNGUARDED)}
    assert {("POISON_READ", "slot_mappings", "row 0"), ("OOB_READ", "block_table_0", "tail")} <= kinds
    spare = SlotCase(ctx=8, groups=group, req_rows=(0,), starts=(3,), query_lens=(2,), table_rows=2)
    assert {f.kind.value for f in _check(spare, UNGUARDED)} == {"POISON_READ"}
    for case in (next_owned, last, spare):
        assert _check(case) == []


def test_a_row_sized_short_is_arithmetic_and_the_guarded_kernel_pads_what_it_cannot_hold():
    """Under ``block-floor`` a context of 10 with blocks of 4 gets rows of 2 blocks: the last position needs a
    third, ``SIZING_VIOLATION`` (decided before the launch) and PAD from the kernel, no other finding."""
    case = SlotCase(ctx=10, groups=(Group(4),), req_rows=(0,), starts=(7,), query_lens=(3,), table_rows=1)
    found = _check(case, sizing="block-floor")
    assert [f.kind.value for f in found] == ["SIZING_VIOLATION"]
    assert model.oracle(case, 8)[(0, 1)] == PAD


def test_reference_clean_and_every_mutant_caught_by_a_declared_kind():
    """The self-test on one seed, a small budget: the paired buggy/correct check of every mutant."""
    from kvfence.selftest.mutants import self_test

    report = self_test(RECORD, "cpu", seeds=[0], max_examples=60)
    rows = {r["name"]: r for r in report["rows"]}
    assert rows[f"reference ({NAME})"]["passed"], rows[f"reference ({NAME})"]
    for mutant in RECORD.mutants:
        row = rows[mutant.name]
        assert row["detections"] == 1, row
        assert set(row["runs"][0]["kinds"]) & set(mutant.detects), row
    assert report["passed"]


def test_case_json_round_trips_and_bad_cases_are_one_line():
    from kvfence.errors import BadInput

    case = SlotCase(ctx=64, groups=(Group(16, 2, True, False), Group(8)), req_rows=(2, -1), starts=(40, 0),
                    query_lens=(5, 0), table_rows=3, pad=4, cp_size=2, cp_rank=1, cp_interleave=8, tile=32, seed=9)
    data = json.loads(json.dumps(RECORD.to_json(case)))
    assert RECORD.from_json(data) == case
    for bad, why in ((dict(data, starts=[62, 0]), "below ctx"), (dict(data, req_rows=[5, -1]), "distinct rows"),
                     (dict(data, groups=[{"block_size": 12}]), "must divide"), (dict(data, nope=1), "unknown"),
                     (dict(data, tile=7), "tile"), ([], "expected an object")):
        with pytest.raises(BadInput, match=why):
            RECORD.from_json(bad)


# -- vLLM as an upstream: fake wheels of kvfence's own kernel text ---------------------------------------------
def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def vllm_wheel(folder: Path, version: str, files: dict) -> Path:
    """A wheel named and described as vllm ``version`` holding ``files`` (path -> text), with its RECORD."""
    files = dict(files, **{f"vllm-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm\n"
                                                                  f"Version: {version}\n"})
    record = "".join(f"{p},{_digest(t.encode())},{len(t.encode())}\n" for p, t in files.items())
    path = folder / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, text in files.items():
            zf.writestr(p, text)
        zf.writestr(f"vllm-{version}.dist-info/RECORD", record + f"vllm-{version}.dist-info/RECORD,,\n")
    return path


def as_release(text: str) -> dict:
    """kvfence's kernel laid out as model runner V2's module is: the kernel under the release's name, its
    table-of-addresses load in a helper the module imports from ``buffer_utils`` (as ``_load_ptr`` is)."""
    ours = text.replace("def compute_slot_mappings_kernel(", "def _compute_slot_mappings_kernel(").replace(
        "table = tl.load(block_table_ptrs + group).to(tl.pointer_type(tl.int32))",
        "table = _load_ptr(block_table_ptrs + group, tl.int32)")
    module = ("import torch\n\nfrom vllm.triton_utils import tl, triton\n"
              "from vllm.v1.worker.gpu.buffer_utils import (\n    StagedWriteTensor,\n    _load_ptr,\n)\n\n\n"
              "class BlockTables:\n    pass\n\n\n"
              + ours.split("import triton.language as tl\n", 1)[1].split("\ndef launch(")[0])
    helper = ("from vllm.triton_utils import tl, triton\n\n\nclass StagedWriteTensor:\n    pass\n\n\n@triton.jit\n"
              "def _load_ptr(ptr_to_ptr, elem_dtype):\n    ptr = tl.load(ptr_to_ptr)\n"
              "    return tl.cast(ptr, tl.pointer_type(elem_dtype))\n")
    return {"vllm/v1/worker/gpu/block_table.py": module, "vllm/v1/worker/gpu/buffer_utils.py": helper}


@pytest.mark.long  # about 20-40 s of CPU; CI's 20 minutes (tox -e long runs it)
def test_a_vllm_kernel_is_extracted_with_its_imported_helper_a_bug_caught_a_guard_clean_refusals_one_line(tmp_path):
    wheels, cache = tmp_path / "wheels", tmp_path / "cache"
    wheels.mkdir()
    text = KERNEL.read_text()
    vllm_wheel(wheels, "9.9.1", as_release(text))  # the row guard
    vllm_wheel(wheels, "9.9.2", as_release(text.replace("inside = j < row_width", "inside = j >= 0")))
    vllm_wheel(wheels, "9.9.3", {"vllm/v1/worker/block_table.py": "x = 1\n"})  # no V2 runner
    vllm_wheel(wheels, "9.9.4", as_release(text.replace("    cp_rank,\n", "    cp_rank,\n    extra,\n", 1)))
    env = {"KVFENCE_WHEEL_DIR": str(wheels), "KVFENCE_CACHE": str(cache), "KVFENCE_OFFLINE": "1"}

    def fuzz(version, out, *more):
        return _kvfence("fuzz", "--contract", NAME, "--kernel", f"vllm=={version}", "--device", "cpu", "--seed",
                        "0", "--out", str(tmp_path / out), *more, cwd=tmp_path, env=env)

    ok = fuzz("9.9.1", "ok", "--max-examples", "40")
    assert ok.returncode == 0 and "no findings" in ok.stdout, ok.stderr + ok.stdout
    entry = cache / "contracts" / "vllm-9.9.1" / f"{NAME}.py"
    extracted = entry.read_text()
    assert "def _load_ptr(" in extracted and "import torch" not in extracted and "class " not in extracted
    assert json.loads(entry.with_suffix(".json").read_text())["helpers"] == ["_load_ptr"]
    bad = fuzz("9.9.2", "bad", "--max-examples", "100")
    assert bad.returncode == 1 and ("POISON_READ" in bad.stdout or "VALUE_MISMATCH" in bad.stdout), bad.stderr
    line = next(x for x in bad.stdout.splitlines() if " repro " in x and x.endswith(".json"))
    again = _kvfence("repro", line.split()[-1], "--device", "cpu", cwd=tmp_path, env=env)
    assert again.returncode == 1 and "FAIL:" in again.stdout, again.stderr
    absent = fuzz("9.9.3", "absent")
    assert absent.returncode == 2 and "vllm==9.9.3 has no _compute_slot_mappings_kernel" in absent.stderr
    assert len(absent.stderr.strip().splitlines()) == 1
    other = fuzz("9.9.4", "other")
    assert other.returncode == 2 and "kvfence does not know this signature" in other.stderr, other.stderr
    offline = fuzz("9.9.5", "offline")
    assert offline.returncode == 2 and "no vllm-9.9.5-*.whl in KVFENCE_WHEEL_DIR" in offline.stderr
    no_net = _kvfence("fuzz", "--contract", NAME, "--kernel", "vllm==9.9.6", "--device", "cpu", "--out",
                      str(tmp_path / "nonet"), cwd=tmp_path,
                      env={"KVFENCE_CACHE": str(cache), "KVFENCE_OFFLINE": "1", "KVFENCE_WHEEL_DIR": ""})
    assert no_net.returncode == 2 and "the network is off" in no_net.stderr, no_net.stderr
    sglang = _kvfence("fuzz", "--contract", NAME, "--kernel", "vllm==nope", "--device", "cpu", "--out",
                      str(tmp_path / "v"), cwd=tmp_path, env=env)
    assert sglang.returncode == 2 and "is not a vllm release version" in sglang.stderr


def test_a_helper_that_reads_outside_triton_is_one_line(tmp_path, monkeypatch):
    from kvfence.errors import BadInput
    from kvfence.release import vllm_kernels

    files = as_release(KERNEL.read_text())
    files["vllm/v1/worker/gpu/buffer_utils.py"] = files["vllm/v1/worker/gpu/buffer_utils.py"].replace(
        "    ptr = tl.load(ptr_to_ptr)\n", "    ptr = tl.load(ptr_to_ptr) + torch.zeros(1)\n")
    vllm_wheel(tmp_path, "9.9.7", files)
    monkeypatch.setenv("KVFENCE_WHEEL_DIR", str(tmp_path))
    monkeypatch.setenv("KVFENCE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(BadInput, match="buffer_utils.py:10: 'torch' is not a parameter, a local, a jit function"):
        vllm_kernels.contract_kernel(RECORD, "vllm==9.9.7")
    assert not (tmp_path / "cache" / "contracts" / "vllm-9.9.7" / f"{NAME}.py").exists()


def _real_release(version: str):
    """Where vLLM ``version``'s kernel is already on disk: ``{"KVFENCE_WHEEL_DIR": folder}``, the test wheels'
    folder (``$KVFENCE_TEST_WHEELS``) holding its wheel, or ``{"entry": file}``, a cache entry of this contract
    (``$KVFENCE_CACHE``); None: the test skips."""
    from kvfence.release.vllm_kernels import contract_entry

    folder = os.environ.get("KVFENCE_TEST_WHEELS")
    if folder and sorted(Path(folder).glob(f"vllm-{version}-*.whl")):
        return {"KVFENCE_WHEEL_DIR": folder}
    entry = contract_entry(version, NAME)[0]
    return {"entry": entry} if entry.is_file() else None


@pytest.mark.long  # vLLM's wheel (228 MB) is not fetched by .ci/run: tox -e long with KVFENCE_TEST_WHEELS holding it
@pytest.mark.skipif(_real_release("0.34.0") is None, reason="no vllm 0.34.0 wheel (KVFENCE_TEST_WHEELS) or cache entry")
def test_the_real_0_34_0_kernel_reads_past_the_row(tmp_path):
    """vLLM 0.34.0's own kernel (read from its wheel, never imported) on the CPU: the read past a row is found."""
    import shutil

    found, cache = _real_release("0.34.0"), tmp_path / "cache"
    env = {"KVFENCE_CACHE": str(cache), "KVFENCE_OFFLINE": "1"}
    if "entry" in found:
        folder = cache / "contracts" / "vllm-0.34.0"
        folder.mkdir(parents=True)
        for path in (found["entry"], found["entry"].with_suffix(".json")):
            shutil.copy(path, folder / path.name)
    else:
        env.update(found)
    run = _kvfence("fuzz", "--contract", NAME, "--kernel", "vllm==0.34.0", "--device", "cpu", "--max-examples",
                   "100", "--seed", "0", "--out", str(tmp_path / "o"), cwd=tmp_path, env=env)
    assert run.returncode == 1 and "POISON_READ" in run.stdout, run.stderr + run.stdout
    text = (cache / "contracts" / "vllm-0.34.0" / f"{NAME}.py").read_text()
    assert "mask=is_local & is_real_req," in text and "def _load_ptr(" in text
