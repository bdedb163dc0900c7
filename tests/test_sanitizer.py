"""compute-sanitizer wrapper: parsing real H200 reports (tests/fixtures/sanitizer_*, made with
tests/fixtures/make_sanitizer_fixtures.py, command in its docstring and BENCHMARKS.md), command lines,
and the missing-tool path."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import sanitizer
from harness.errors import BadInput
from harness.findings import Kind

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[1]


def fixture(name):
    return (FIXTURES / name).read_text()


def test_memcheck_xml_of_a_real_overflow_parses_into_findings():
    # Trimmed from 1307 records (1305 out-of-bounds writes + 2 API errors) to 4 + 2.
    records = sanitizer.parse_xml(fixture("sanitizer_memcheck_overflow_nocache.xml"))
    writes = [r for r in records if r.kind == "Precise"]
    assert len(writes) == 4 and len(records) == 6
    first = writes[0]
    assert (first.kernel, first.access, first.size, first.error) == \
           ("generate_draft_decode_kv_indices", "write", 4, "out of bounds")
    assert first.location == "draft_kv_indices.py:75" and first.block == (2, 2, 0) and first.thread == (0, 0, 0)
    assert first.address == 0x7fb306801060
    findings = sanitizer.to_findings("memcheck", records)
    assert {f.kind for f in findings} == {Kind.SANITIZER_MEMCHECK}
    oob = next(f for f in findings if f.extra["record_kind"] == "Precise")
    assert oob.count == 4 and oob.extra["access"] == "write" and oob.buffer == "generate_draft_decode_kv_indices"
    api = [f for f in findings if f.extra["record_kind"] == "Api"]
    assert {f.extra["error"] for f in api} == {"cudaErrorLaunchFailure"}  # the context died


def test_memcheck_text_log_is_the_fallback_and_knows_the_nearest_allocation():
    text = fixture("sanitizer_memcheck_overflow_nocache.txt")
    records = sanitizer.parse_text(text)
    writes = [r for r in records if r.kind == "Precise"]
    assert len(writes) == 4
    assert writes[0].nearest == "65 bytes after the nearest allocation at 0x7f8d58801000 of size 32 bytes"
    assert writes[0].address == 0x7f8d58801060 and writes[0].location == "draft_kv_indices.py:75"
    assert [r.error for r in records if r.kind == "Api"] == ["cudaErrorLaunchFailure", "cudaErrorLaunchFailure"]
    assert sanitizer.error_summary(text) == 1307  # the untrimmed run's count, from its summary line


def test_xml_records_take_the_distance_from_the_text_log_of_the_same_address():
    xml = sanitizer.parse_xml(fixture("sanitizer_memcheck_overflow_nocache.xml"))
    text = sanitizer.parse_text(fixture("sanitizer_memcheck_overflow_nocache.txt"))
    # The two fixture runs were separate processes (different addresses): nothing may be copied.
    sanitizer.merge_nearest(xml, text)
    assert all(r.nearest == "" for r in xml)
    # Same addresses (as in one run that writes both): the distance is copied.
    for r, t in zip([r for r in xml if r.kind == "Precise"], [t for t in text if t.kind == "Precise"]):
        t.address = r.address
    sanitizer.merge_nearest(xml, text)
    assert xml[0].nearest.startswith("65 bytes after the nearest allocation")


def test_caching_allocator_hides_the_same_overflow_from_memcheck():
    # Same launch, caching allocator on: the write lands in memory PyTorch owns.
    assert sanitizer.parse_xml(fixture("sanitizer_memcheck_overflow_cached.xml")) == []
    text = fixture("sanitizer_memcheck_overflow_cached.txt")
    assert sanitizer.parse_text(text) == [] and sanitizer.error_summary(text) == 0
    assert "overflow 816 elements per row" in text


def test_initcheck_racecheck_synccheck_reports():
    init = sanitizer.parse_xml(fixture("sanitizer_initcheck_reference.xml"))
    assert len(init) == 3 and all(r.kind == "Initcheck" and r.access == "" for r in init)
    assert init[0].text == "Uninitialized __global__ memory read of size 4 bytes"
    text_init = sanitizer.parse_text(fixture("sanitizer_initcheck_reference.txt"))
    assert len(text_init) == 3 and text_init[0].access == "read" and text_init[0].location == "draft_kv_indices.py:74"
    assert [f.kind for f in sanitizer.to_findings("initcheck", init)] == [Kind.SANITIZER_INITCHECK]
    for name in ("racecheck", "synccheck"):
        assert sanitizer.parse_xml(fixture(f"sanitizer_{name}_reference.xml")) == []
        assert sanitizer.parse_text(fixture(f"sanitizer_{name}_reference.txt")) == []


@pytest.mark.parametrize("text, message", [
    ("<html/>", "not a compute-sanitizer report"),
    ("<ComputeSanitizerOutput><record>", "does not parse"),
])
def test_broken_xml_is_bad_input(text, message):
    with pytest.raises(BadInput, match=message):
        sanitizer.parse_xml(text)


def test_command_lines_per_tool(tmp_path):
    target = sanitizer.repro_target(tmp_path / "c.json", python="python")
    assert target == ["python", "-m", "harness", "repro", str(tmp_path / "c.json"), "--device", "cuda",
                      "--layout", "production", "--no-absorb", "--in-process", "--trust-case"]
    mem = sanitizer.tool_command("cs", "memcheck", target, xml_path=tmp_path / "x.xml")
    assert mem[:9] == ["cs", "--tool", "memcheck", "--error-exitcode", "86", "--print-limit", "0", "--xml", "--save"]
    assert "--padding" in mem and "kns=generate_draft_decode_kv_indices" in mem and mem[-len(target):] == target
    race = sanitizer.tool_command("cs", "racecheck", target, xml_path=tmp_path / "x.xml", kernel_filter=None)
    assert "--padding" not in race and "--kernel-name" not in race
    with pytest.raises(BadInput, match="unknown sanitizer tool"):
        sanitizer.tool_command("cs", "leakcheck", target, xml_path=tmp_path / "x.xml")


def test_caching_allocator_is_off_for_eager_and_on_for_graph():
    base = {"PATH": "/usr/bin", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "TRITON_INTERPRET": "1"}
    assert sanitizer.case_env("eager", base)["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    graph = sanitizer.case_env("graph", base)
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in graph and "TRITON_INTERPRET" not in graph


def test_locate_finds_the_tool_on_path_or_in_cuda_home(tmp_path):
    tool = tmp_path / "bin" / "compute-sanitizer"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert sanitizer.locate({"PATH": str(tool.parent)}) == str(tool)
    assert sanitizer.locate({"PATH": "/nonexistent", "CUDA_HOME": str(tmp_path)}) == str(tool)
    assert sanitizer.locate({"PATH": "/nonexistent"}, default_root=str(tmp_path)) == str(tool)
    with pytest.raises(BadInput, match="compute-sanitizer not found"):
        sanitizer.locate({"PATH": "/nonexistent", "CUDA_HOME": "/nonexistent"}, default_root="/nonexistent")


def test_sweep_without_compute_sanitizer_exits_2_with_one_line(tmp_path):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable), CUDA_HOME="/nonexistent", CUDA_PATH="/nonexistent",
               PYTHONPATH=str(ROOT))
    if Path("/usr/local/cuda/bin/compute-sanitizer").exists():
        pytest.skip("compute-sanitizer is installed at /usr/local/cuda on this machine")
    proc = subprocess.run([sys.executable, "-m", "harness", "sweep", "--max-examples", "3", "--out", str(tmp_path / "o")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "compute-sanitizer not found" in lines[0]
    assert not (tmp_path / "o").exists()
