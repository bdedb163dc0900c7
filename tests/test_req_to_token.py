"""The request-row writer contract (``req-to-token``, docs/contract.md §10): its oracle by a hand-worked example,
every planted bug caught by a kind it declares while the reference stays clean, and a release's row sizing read
from a wheel built here (kvfence's own kernel text, and release code written for this test in SGLang's shape,
never SGLang's): a release whose page-1 row lacks the DFlash reservation is found writing past its row, shrunk
to a minimal case that ``repro`` replays; the fixed headroom is clean. Real-wheel checks run only where
SGLang 0.5.23's wheel is already on disk (a folder named by ``KVFENCE_TEST_WHEELS``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvfence.contracts.req_to_token.case import ReqToTokenCase, need, slots, written
from kvfence.contracts.req_to_token.record import REQ_TO_TOKEN
from kvfence.engine.launch import bind
from kvfence.errors import BadInput

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
#: A folder of release wheels for the tests that read real releases (none: they skip).
WHEELS = Path(os.environ["KVFENCE_TEST_WHEELS"]) if os.environ.get("KVFENCE_TEST_WHEELS") else None
REAL = sorted(WHEELS.glob("sglang-0.5.23-*.whl")) if WHEELS is not None and WHEELS.is_dir() else []


def _kvfence(*argv, cwd, env=None):
    full = dict(os.environ, TRITON_INTERPRET="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=600)


def test_oracle_hand_worked_example():
    """Page 16, reserve 8: request 0 committed 20 with 24 allocated writes [24, 32) of pool row 2 with slots
    0..7 of out_cache_loc; request 1 committed 3, nothing allocated past it, writes [3, 16) of row 0 with slots
    8..20."""
    case = ReqToTokenCase(40, 16, 4, 1, 1, 8, (20, 3), (24, 3), (2, 0), 3, 7).validate()
    loc = slots(case)
    assert [case.start(b) for b in range(2)] == [24, 3] and [case.end(b) for b in range(2)] == [32, 16]
    assert case.total == 21 and sorted(loc.tolist()) == list(range(1, 22))
    got = written(case)
    assert got[(2, 24)] == loc[0] and got[(2, 31)] == loc[7] and got[(0, 3)] == loc[8] and got[(0, 15)] == loc[20]
    assert len(got) == 21 and need(case) == 32
    sizes = {name: REQ_TO_TOKEN.sizings[name](case, "graph") for name in REQ_TO_TOKEN.sizings}
    # safe ctx + reserve + P - 1; the PR's ctx + max(4 + D, 2 * max(steps * topk, D) + P - 1); page-1 rows; the
    # DCP axis's planted sizings equal safe and the PR's without DCP
    assert sizes == {"safe": 63, "pr33581": 63, "release-page1": 48, "context": 40, "scheduled-page": 63,
                     "safe-scheduled-page": 63}
    narrow = bind(REQ_TO_TOKEN, ReqToTokenCase(8, 1, 9, 1, 1, 18, (4,), (4,), (0,), 1).validate(), "release-page1")
    found = REQ_TO_TOKEN.findings_before_launch(narrow)
    assert narrow.width == 21 and [(f.start, f.stop) for f in found] == [(21, 22)]  # end 22, row 21


def test_bad_cases_are_one_line():
    good = REQ_TO_TOKEN.to_json(ReqToTokenCase(8, 1, 2, 1, 1, 4, (8,), (8,), (0,), 1).validate())
    assert REQ_TO_TOKEN.from_json(json.loads(json.dumps(good))) == REQ_TO_TOKEN.from_json(good)
    for change, said in (({"committed": [9]}, "every committed length must be in [0, ctx]"),
                         ({"allocated": [20]}, "every allocated length must be in"),
                         ({"req_pool_indices": [1]}, "each below pool_rows"),
                         ({"page_size": 3}, "page_size 3 is not one of"),
                         ({"extra": 1}, "unknown field(s) extra")):
        with pytest.raises(BadInput, match=said.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            REQ_TO_TOKEN.from_json(dict(good, **change))
    with pytest.raises(BadInput, match="kvfence reads the row sizing of"):
        REQ_TO_TOKEN.sizings["sglang==0.5.23:MEDUSA"]
    assert "sglang==0.5.23:DFLASH" in REQ_TO_TOKEN.sizings and list(REQ_TO_TOKEN.sizings)[0] == "safe"


def test_reference_clean_and_every_mutant_caught_by_a_declared_kind():
    """The self-test on one seed: every planted bug of kvfence's kernel and every buggy sizing is caught by a
    kind it declares; the scale bug (more than 8 requests) is not reached on the CPU domain; the reference is
    clean under ``safe``."""
    from kvfence.selftest.mutants import self_test

    report = self_test(REQ_TO_TOKEN, "cpu", seeds=[0], max_examples=60)
    rows = {r["name"]: r for r in report["rows"]}
    assert rows["reference (req-to-token)"]["passed"], rows["reference (req-to-token)"]
    for mutant in REQ_TO_TOKEN.mutants:
        row = rows[mutant.name]
        if mutant.domain == "gpu":
            assert row["passed"] and not row["expected"] and not row["runs"][0]["kinds"], row
            continue
        assert row["detections"] == 1 and set(row["runs"][0]["kinds"]) & set(mutant.detects), row
    assert report["passed"]


# -- a release built here ------------------------------------------------------------------------------------
# Release code written for these tests in the shape SGLang's wheels have (the functions kvfence reads, by name),
# with 0.5.23's arithmetic: rows ctx + 4 + D, widened to the reservation only at page > 1 (GATE); the DFlash
# family reserves 2 * D per step, EAGLE 2 * max(steps * topk, D).
_SIZING = '''
def get_alloc_page_size():
    return ALLOC_PAGE


def get_alloc_len_per_decode():
    spec = get_spec()
    if spec.speculative_algorithm is None:
        return 1
    steps = spec.speculative_num_steps or 1
    topk = spec.speculative_eagle_topk or 1
    return max(steps * topk, max_speculative_num_draft_tokens())


def get_alloc_reserve_per_decode():
    return 2 * get_alloc_len_per_decode()


def page_aligned_decode_alloc_lens(reqs, *, reserve, page_size):
    out = []
    for r in reqs:
        cur = r.kv.kv_allocated_len
        nxt = max(cur, (r.kv.kv_committed_len + reserve + page_size - 1) // page_size * page_size)
        out.append(nxt)
    return out


def get_req_to_token_extra_context_len():
    extra = 4 + (max_speculative_num_draft_tokens() or 0)
    page_size = get_alloc_page_size()
    if get_spec().speculative_algorithm is not None:
        if GATE:
            extra = max(extra, get_alloc_reserve_per_decode() + page_size - 1)
    return extra
'''
_ALGORITHM = '''
class SpeculativeAlgorithm(Enum):
    DFLASH = auto()
    DSPARK = auto()
    EAGLE = auto()
    UNO = auto()

    def is_dflash(self):
        return self == SpeculativeAlgorithm.DFLASH

    def is_dspark(self):
        return self == SpeculativeAlgorithm.DSPARK

    def is_dflash_family(self):
        return self.is_dflash() or self.is_dspark()

    def is_uno(self):
        return self == SpeculativeAlgorithm.UNO
'''
_DECODE = '''
def spec_prepare_for_decode(batch):
    if batch.spec_algorithm.is_dflash_family():
        batch.spec_info.prepare_for_decode(batch)
    elif batch.spec_algorithm.is_uno():
        UnoDraftInput.prepare_for_decode(batch.spec_info, batch)
    else:
        eagle_prepare_for_decode(batch)


def eagle_prepare_for_decode(batch):
    page_size = batch.page_size
    double_alloc = get_alloc_reserve_per_decode()
    lens = page_aligned_decode_alloc_lens(batch.reqs, reserve=double_alloc, page_size=page_size)
    return lens
'''
_DFLASH = '''
class DFlashDraftInputV2:
    def prepare_for_decode(self, batch):
        block_size = int(get_spec().speculative_num_draft_tokens)
        reserve = 2 * block_size
        page_size = batch.page_size
        lens = page_aligned_decode_alloc_lens(batch.reqs, reserve=reserve, page_size=page_size)
        return lens
'''
_POOL = '''
class KVCacheConfigurator:
    def _build_default_req_pool(self, *, max_num_reqs, extra_max_context_len):
        return ReqToTokenPool(size=max_num_reqs, max_context_len=self.model_config.context_len + extra_max_context_len)
'''
#: The KV allocator's builder, in the shape of SGLang's: under decode context parallelism it pages at
#: page_size * attn_dcp_size.
_ALLOCATOR = '''
    def _build_token_to_kv_pool_allocator(self, *, sizes):
        if get_schedule().page_size == 1 and not get_parallel().dcp_enabled:
            return TokenToKVPoolAllocator(sizes.max_total_num_tokens)
        return PagedTokenToKVPoolAllocator(sizes.max_total_num_tokens * get_parallel().attn_dcp_size,
                                           page_size=get_schedule().page_size * get_parallel().attn_dcp_size)
'''
_ADMISSION = {"sglang/srt/managers/tp_worker.py": "def get_worker_info(self):\n    max_req_len = min(\n"
              "        self.model_config.context_len - 1, kv_capacity - 1)\n",
              "sglang/srt/managers/scheduler.py": "def f(self):\n    return min(n, self.max_req_len - input_len - 1)\n"}


def _release(folder: Path, version: str, gate: str, alloc_page: str = "get_schedule().page_size",
             allocator: bool = False) -> None:
    """A wheel holding kvfence's kernel (as ``assign_req_to_token_pool``) and the row sizing, gated by ``gate``,
    its headroom's page ``alloc_page``, and (``allocator``) a KV allocator that pages by the DCP size."""
    kernel = (ROOT / "kernels" / "req_to_token" / "req_to_token_writer.py").read_text()
    files = dict(_ADMISSION, **{
        "sglang/srt/mem_cache/allocation.py": kernel.replace("def write_req_to_token(", "def assign_req_to_token_pool(")
        + "\n\ndef alloc_for_spec_decode(tree_cache, pool):\n    return None\n",
        "sglang/srt/mem_cache/allocation_sizing.py": _SIZING.replace("GATE", gate).replace("ALLOC_PAGE", alloc_page),
        "sglang/srt/mem_cache/kv_cache_configurator.py": _POOL + (_ALLOCATOR if allocator else ""),
        "sglang/srt/speculative/spec_info.py": _ALGORITHM,
        "sglang/srt/speculative/spec_utils.py": _DECODE,
        "sglang/srt/speculative/dflash_info_v2.py": _DFLASH})
    with zipfile.ZipFile(folder / f"sglang-{version}-py3-none-any.whl", "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)


@pytest.fixture
def release_env(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _release(wheels, "9.9.1", "page_size > 1")  # 0.5.23's gate: page-1 rows lack the reservation
    _release(wheels, "9.9.2", "True")  # the headroom the fix describes: every page size
    return {"KVFENCE_WHEEL_DIR": str(wheels), "KVFENCE_CACHE": str(tmp_path / "cache"), "KVFENCE_OFFLINE": "1"}


@pytest.mark.long  # about 20-40 s of CPU; CI's 20 minutes (tox -e long runs it)
def test_a_release_whose_page1_row_lacks_the_dflash_reserve_spills_and_the_minimal_case_replays(tmp_path,
                                                                                                 release_env):
    run = _kvfence("fuzz", "--contract", "req-to-token", "--kernel", "sglang==9.9.1", "--sizing",
                   "sglang==9.9.1:DFLASH", "--device", "cpu", "--seed", "0", "--out", str(tmp_path / "out"),
                   cwd=tmp_path, env=release_env)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "GUARD_OVERWRITE" in run.stdout and "ROW_RESERVED_PAST_WIDTH" in run.stdout
    line = next(x for x in run.stdout.splitlines() if " repro " in x and x.endswith(".json"))
    doc = json.loads(Path(line.split()[-1]).read_text())
    case = doc["case"]["case"]
    # minimal: page 1, the smallest block whose 2 * D passes 4 + D + 4, one request at the admitted wall ctx - 4
    assert (case["page_size"], case["draft_tokens"], case["reserve"]) == (1, 9, 18)
    assert case["committed"] == [case["ctx"] - 4] and len(case["allocated"]) == 1
    assert doc["case"]["width"] == case["ctx"] + 13 and doc["case"]["sizing"] == "sglang==9.9.1:DFLASH"
    again = _kvfence("repro", line.split()[-1], "--device", "cpu", cwd=tmp_path, env=release_env)
    assert again.returncode == 1 and "GUARD_OVERWRITE" in again.stdout and "need > width by 1" in again.stdout
    fixed = _kvfence("repro", line.split()[-1], "--device", "cpu", "--sizing", "sglang==9.9.2:DFLASH", cwd=tmp_path,
                     env=release_env)
    assert fixed.returncode == 0 and "PASS: no findings" in fixed.stdout, fixed.stdout + fixed.stderr
    clean = _kvfence("fuzz", "--contract", "req-to-token", "--kernel", "sglang==9.9.1", "--sizing",
                     "sglang==9.9.2:DFLASH", "--device", "cpu", "--max-examples", "80", "--seed", "0", "--out",
                     str(tmp_path / "clean"), cwd=tmp_path, env=release_env)
    assert clean.returncode == 0 and "no findings" in clean.stdout, clean.stdout + clean.stderr
    pr = _kvfence("fuzz", "--contract", "req-to-token", "--kernel", "sglang==9.9.1", "--sizing", "pr33581",
                  "--device", "cpu", "--max-examples", "80", "--seed", "0", "--out", str(tmp_path / "pr"),
                  cwd=tmp_path, env=release_env)
    assert pr.returncode == 0 and "no findings" in pr.stdout, pr.stdout + pr.stderr


def test_the_release_reading_names_its_lines_and_an_unread_release_is_one_line(tmp_path, release_env):
    sizing = _kvfence("upstream", "sizing", "9.9.1", "--contract", "req-to-token", cwd=tmp_path, env=release_env)
    assert sizing.returncode == 0, sizing.stderr
    out = sizing.stdout
    assert "DFLASH page 1   D 16 (default): row ctx + 20, reserve 32 past committed -> 8 position(s)" in out
    assert "(spills from D 9)" in out and "DFLASH page 16  D 16 (default): row ctx + 47" in out
    assert "dflash_info_v2.py:4,5" in out and "allocation_sizing.py:" in out and "committed <= ctx - 4" in out
    assert "UNO    page 1   D 8: not read: no UnoDraftInput.prepare_for_decode in this release" in out
    for spec, said in (("sglang==9.9.7:DFLASH", "no sglang-9.9.7-*.whl in KVFENCE_WHEEL_DIR"),
                       ("sglang==9.9.1:UNO", "no UnoDraftInput.prepare_for_decode in this release")):
        bad = _kvfence("fuzz", "--contract", "req-to-token", "--sizing", spec, "--device", "cpu", "--out",
                       str(tmp_path / "bad"), cwd=tmp_path, env=release_env)
        assert bad.returncode == 2 and said in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_an_eagle_deployment_whose_step_passes_its_row_gets_the_line_the_kernel_shows(tmp_path, monkeypatch,
                                                                                     release_env):
    """``affected``'s request-row line is not the DFlash family's alone: EAGLE at page 1 with topk 4 reserves
    2 * max(3 * 4, 8) = 24 positions against a row of ctx + 12, and the release's kernel shows the spill; topk 1
    (8 against ctx + 8) fits; the release whose rows hold the reservation at every page size fixes it."""
    from kvfence.contracts.req_to_token.affected import rows_verdicts
    from kvfence.release.affected import parse_deployment
    from kvfence.release.affected_verdict import BASIS_ARITHMETIC, BASIS_OBSERVED

    for key, value in release_env.items():
        monkeypatch.setenv(key, value)
    eagle = ["--attention-backend", "fa3", "--speculative-eagle-topk", "4", "--speculative-num-steps", "3",
             "--speculative-num-draft-tokens", "8", "--context-length", "64"]
    [v] = rows_verdicts(parse_deployment("9.9.1", eagle), ["9.9.1", "9.9.2"], tmp_path / "out", "cpu")
    assert (v.status, v.site, v.seen, v.basis) == ("affected", "EAGLE decode step, page 1", ["STRAY_WRITE"],
                                                   BASIS_OBSERVED), v
    assert "reserves 24 positions (2 * max(steps * topk, D))" in v.condition and "ctx + 12 = 76" in v.condition
    assert "8 position(s) past the row" in v.condition and "steps 3, topk 4" in v.condition
    assert v.fixed_in == "9.9.2" and "--speculative-num-steps 2" in v.avoid and Path(v.case_file).is_file()
    [fits] = rows_verdicts(parse_deployment("9.9.1", eagle[:3] + ["1"] + eagle[4:]), [], tmp_path / "o", "cpu")
    assert (fits.status, fits.basis, fits.seen, fits.case_file) == ("not affected", BASIS_ARITHMETIC, [], "")
    assert "reserves 8 positions" in fits.condition and "ctx + 8 = 72" in fits.condition
    [fixed] = rows_verdicts(parse_deployment("9.9.2", eagle), [], tmp_path / "o", "cpu")
    assert fixed.status == "not affected" and "its row holds ctx + 24 = 88" in fixed.condition, fixed


def test_a_release_mutant_is_a_patch_of_the_releases_own_text_made_at_run_time(tmp_path, monkeypatch, release_env):
    """The release mutants patch the release's kernel as kvfence extracted it: here the release built above
    (kvfence's text), with the patch anchored on that text; the patched kernel is caught, the release clean."""
    from kvfence.contracts.req_to_token import record, release_mutants
    from kvfence.engine import kernels
    from kvfence.selftest.mutants import self_test

    for key, value in release_env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(record, "RELEASE", "9.9.1")
    # Listed before anything is extracted (never hidden): each names the release text it will patch.
    assert {m.kernel for m in REQ_TO_TOKEN.mutants if m.kernel} \
        == {f"sglang-patched==9.9.1:{name}" for name in release_mutants.PATCHES}
    monkeypatch.setattr(release_mutants, "PATCHES", {"release_inclusive_mask": (
        "one position too many", ("STRAY_WRITE", "GUARD_OVERWRITE", "POISON_READ"),
        (("in_request = position < stop", "in_request = position <= stop  # BUG"),))})
    kernels.resolve(REQ_TO_TOKEN, "sglang==9.9.1")  # extracts it into the cache
    mutant = next(m for m in REQ_TO_TOKEN.mutants if m.kernel)
    assert mutant.kernel == "sglang-patched==9.9.1:release_inclusive_mask"
    report = self_test(REQ_TO_TOKEN, "cpu", seeds=[0], max_examples=40, names=["release_inclusive_mask"],
                       isolate=False)
    assert report["passed"], report["rows"]
    text = Path(kernels.release_kernel_file(REQ_TO_TOKEN, mutant.kernel)[0]).read_text()
    assert "in_request = position <= stop  # BUG" in text and "def assign_req_to_token_pool(" in text


# -- SGLang 0.5.23 itself, where its wheel is on disk -------------------------------------------------------------
@pytest.mark.long  # three commands on the real wheel
@pytest.mark.skipif(not REAL, reason="no sglang-0.5.23 wheel in $KVFENCE_TEST_WHEELS "
                                     "(pip download sglang==0.5.23 --no-deps)")
def test_sglang_0_5_23_rows_and_its_kernel_spills_under_dflash(tmp_path):
    env = {"KVFENCE_WHEEL_DIR": str(WHEELS), "KVFENCE_CACHE": str(tmp_path / "cache"), "KVFENCE_OFFLINE": "1"}
    sizing = _kvfence("upstream", "sizing", "0.5.23", "--contract", "req-to-token", cwd=tmp_path, env=env)
    assert sizing.returncode == 0, sizing.stderr
    assert "DFLASH page 1   D 16 (default): row ctx + 20, reserve 32 past committed -> 8 position(s)" in sizing.stdout
    assert "DSPARK page 1   gamma 16, D 17: row ctx + 21, reserve 34 past committed -> 9 position(s)" in sizing.stdout
    assert "dflash_info_v2.py:142,147,150" in sizing.stdout and "allocation_sizing.py:25,105," in sizing.stdout
    run = _kvfence("fuzz", "--contract", "req-to-token", "--kernel", "sglang==0.5.23", "--sizing",
                   "sglang==0.5.23:DFLASH", "--device", "cpu", "--seed", "0", "--out", str(tmp_path / "out"),
                   cwd=tmp_path, env=env)
    assert run.returncode == 1 and "GUARD_OVERWRITE" in run.stdout, run.stdout + run.stderr
    fixed = _kvfence("fuzz", "--contract", "req-to-token", "--kernel", "sglang==0.5.23", "--sizing", "pr33581",
                     "--device", "cpu", "--max-examples", "100", "--seed", "0", "--out", str(tmp_path / "pr"),
                     cwd=tmp_path, env=env)
    assert fixed.returncode == 0 and "no findings" in fixed.stdout, fixed.stdout + fixed.stderr
