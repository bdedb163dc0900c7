"""Planted bugs in the release kernels' own text (issue 56, item 3; ``kvfence.contracts.page_table.release_mutants``).

A release mutant is made at run time from the wheel: the contract's kernel extracted as data into the cache,
then the mutant's ``(release text, mutated text)`` pairs applied; nothing of the release is kept in the repository.
Offline, with a fake wheel holding kvfence's own kernel text where the release keeps its kernel: the mechanism
(extraction, cache, patch, the contract's ABI, one line for a text the release spells otherwise or a wheel that is
not there), and the planted bug found by the engine while the release's own kernel is clean. With SGLang's wheels
(``KVFENCE_WHEEL_DIR`` holding 0.5.23 and 0.5.3.post3, or a cache that has them): every shipped release mutant
of every table contract resolves against the real text, and the self-test catches it on one seed.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from kvfence.contracts.page_table import release_mutants
from kvfence.contracts.page_table.record import TRTLLM_MHA, PageTableCase
from kvfence.engine import registry
from kvfence.engine.checking import TableChecker
from kvfence.engine.launch import bind
from kvfence.errors import BadInput

pytestmark = [pytest.mark.interpreter, pytest.mark.cpu_only]

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("flashmla-page-table", "trtllm-mha-page-table", "fa3-decode-metadata")
GUARD = ("    if blk * PAGES_PER_BLOCK >= num_pages:\n", "    if blk >= tl.cdiv(num_pages, _BLOCK_TOKENS):\n")


@pytest.fixture
def fake_release(tmp_path, monkeypatch):
    """sglang 9.9.3: a wheel holding kvfence's own TRTLLM-MHA kernel where 0.5.23 keeps its kernel; the cache and
    the wheel folder in ``tmp_path``, the network off."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "sglang-9.9.3-py3-none-any.whl", "w") as zf:
        zf.writestr("sglang/kernels/ops/attention/trtllm_mha_page_table.py",
                    (ROOT / "kernels" / "page_table" / "trtllm_mha_page_table.py").read_text())
    monkeypatch.setenv("KVFENCE_WHEEL_DIR", str(wheels))
    monkeypatch.setenv("KVFENCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVFENCE_OFFLINE", "1")
    return tmp_path


def test_a_release_mutant_is_made_from_the_wheel_and_found_where_the_release_is_clean(fake_release):
    """The mutant's kernel spec names this module's attribute; resolving it extracts the release's kernel from the
    wheel into the cache (with its sha256), applies the patch in a scratch file and loads it. On a launch past 4096
    tokens at page 16 the planted guard drops the second block (``MISSING_WRITE``); the release's own kernel is
    clean; the repository gained no file."""
    from kvfence.engine import kernels

    mutant = release_mutants.release_mutant("trtllm-mha-page-table", "test_guard_pages", "the guard counts pages",
                                            ("MISSING_WRITE",), (GUARD,), version="9.9.3")
    assert mutant.kernel.startswith("kvfence.contracts.page_table.release_mutants:") and not mutant.patch
    assert mutant.doc.startswith("Mutant (release text, sglang==9.9.3)")
    case = PageTableCase(16, 5000, 0, (4500, 100), (1, 0), 2, None, False, 3)
    checker = TableChecker(TRTLLM_MHA, "cpu")
    assert checker.check(bind(TRTLLM_MHA, case, "safe", "sglang==9.9.3")) == []
    found = checker.check(bind(TRTLLM_MHA, case, "safe", mutant.kernel))
    assert {f.kind.value for f in found} == {"MISSING_WRITE"} and {f.region for f in found} == {"row 0"}, found
    cached = fake_release / "cache" / "contracts" / "sglang-9.9.3"
    assert (cached / "trtllm-mha-page-table.release-text.py").is_file()
    assert (cached / "trtllm-mha-page-table.release-text.json").is_file()
    assert "BLOCK_TOKENS" in (cached / "trtllm-mha-page-table.release-text.py").read_text()
    assert kernels._SCRATCH and ROOT not in kernels._SCRATCH[0].parents  # the planted file: a scratch folder


def test_a_release_that_spells_the_text_otherwise_or_is_not_there_is_one_line(fake_release):
    """A patch whose text the release's kernel lacks names that text and the release; a release whose wheel cannot
    be had (the network off) says so; both are BadInput, one line, never a mutant that differs silently."""
    absent = release_mutants.release_mutant("trtllm-mha-page-table", "test_absent_text", "no such text",
                                            ("MISSING_WRITE",), (("if not_in_the_kernel:", "if True:"),),
                                            version="9.9.3")
    with pytest.raises(BadInput) as exc:
        TableChecker(TRTLLM_MHA, "cpu").check(
            bind(TRTLLM_MHA, PageTableCase(1, 4, 0, (4,), (0,), 1), "safe", absent.kernel))
    assert "'if not_in_the_kernel:' matches 0 places" in str(exc.value) and "sglang==9.9.3" in str(exc.value)
    missing = release_mutants.release_mutant("trtllm-mha-page-table", "test_no_wheel", "no wheel",
                                             ("MISSING_WRITE",), (GUARD,), version="9.9.77")
    with pytest.raises(BadInput) as exc:
        TableChecker(TRTLLM_MHA, "cpu").check(
            bind(TRTLLM_MHA, PageTableCase(1, 4, 0, (4,), (0,), 1), "safe", missing.kernel))
    assert "sglang==9.9.77" in str(exc.value) and "\n" not in str(exc.value)


def test_the_shipped_release_mutants_cover_the_block_structure_and_declare_their_domain():
    """Each table contract ships release mutants beside its own: the block guard, block offsets, load masks and
    strides, FlashMLA's kernel of PR #11985's era (from 0.5.3.post3's wheel), and one scale mutant only the GPU
    domain reaches, declared ``domain="gpu"``; the first mutant of each stays one of kvfence's own text (offline)."""
    names = {c: {m.name for m in registry.get(c).mutants if m.kernel} for c in TABLES}
    assert {"release_block_guard_pages", "release_block_offset_64", "release_blocks_capped_2",
            "release_load_mask_floor", "release_pr11985_kernel"} <= names["flashmla-page-table"]
    assert {"release_block_guard_pages", "release_block_offset_64", "release_blocks_capped_2",
            "release_load_mask_floor", "release_pool_stride_from_output"} <= names["trtllm-mha-page-table"]
    assert {"release_block_offset_128", "release_block_guard_no_delta", "release_load_mask_table",
            "release_row_stride_contiguous", "release_pool_stride_from_table"} <= names["fa3-decode-metadata"]
    for contract in TABLES:
        record = registry.get(contract)
        assert record.mutants[0].patch and not record.mutants[0].kernel
        scale = [m.name for m in record.mutants if m.domain == "gpu"]
        assert len(scale) == 1 and scale[0] in names[contract], (contract, scale)
        planted = release_mutants.planted(contract)
        assert names[contract] <= set(planted)
    assert release_mutants.versions("flashmla-page-table") == ("0.5.23", "0.5.3.post3")


def _available(contract: str) -> bool:
    """Whether every release ``contract``'s mutants are made from is at hand without the network."""
    import os

    if os.environ.get("KVFENCE_OFFLINE", "") != "1" and not os.environ.get("KVFENCE_WHEEL_DIR"):
        os.environ["KVFENCE_OFFLINE"] = "1"  # this check never downloads
        try:
            return _available(contract)
        finally:
            del os.environ["KVFENCE_OFFLINE"]
    try:
        for version in release_mutants.versions(contract):
            release_mutants.release_text(contract, version)
    except BadInput:
        return False
    return True


@pytest.mark.long  # the release mutants of each contract fuzzed from the real wheels
@pytest.mark.parametrize("contract", TABLES)
def test_every_shipped_release_mutant_resolves_against_the_real_wheel_and_is_caught(contract):
    """With SGLang's wheels at hand: each release mutant's patch matches the release's text exactly once, the
    planted kernel takes the contract's ABI, and the self-test (one seed, its CPU budget) catches each CPU-domain
    one by a kind it declares while the reference stays clean; the scale mutant is not found on the CPU domain."""
    from kvfence.selftest.mutants import self_test

    if not _available(contract):
        pytest.skip("SGLang 0.5.23 / 0.5.3.post3 wheels not at hand (set KVFENCE_WHEEL_DIR or fill the cache)")
    record = registry.get(contract)
    release = [m.name for m in record.mutants if m.kernel]
    report = self_test(record, "cpu", seeds=[0], names=release, isolate=False)
    assert report["passed"], [(r["name"], r["runs"]) for r in report["rows"] if not r["passed"]]
