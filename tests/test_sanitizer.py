"""compute-sanitizer wrapper: parsing real H200 reports (tests/fixtures/sanitizer_*, made with
tests/fixtures/make_sanitizer_fixtures.py, command in its docstring and BENCHMARKS.md), command lines,
and the missing-tool path."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvfence.engine.findings import Kind
from kvfence.errors import BadInput
from kvfence.sanitizer import tool as sanitizer
from tests.fake_sanitizer import install_fake_tool

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
    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.record import launch_of
    from kvfence.engine import registry
    from kvfence.engine.casefile import write_case
    from kvfence.engine.launch import bind, replace
    from kvfence.release.knowledge import wall_case

    status = tmp_path / "c.status.json"
    case_file = write_case(launch_of(Case(Config(topk=1, num_steps=1, ctx=4, max_bs=1), Batch((2,), (0,)))), [],
                           out_dir=tmp_path)
    target = sanitizer.repro_target(case_file, status_path=status, python="python")
    assert target == ["python", "-m", "kvfence.sanitizer_child", str(status), "repro", str(case_file),
                      "--device", "cuda", "--layout", "production", "--no-absorb", "--in-process", "--trust-case"]
    assert sanitizer.repro_target(case_file, status_path=status, kernel="k.py:f", mode="graph")[-4:] == \
        ["--kernel", "k.py:f", "--mode", "graph"]
    # A table contract's case: the layout is the engine's now (a Launch field of every contract), so its child
    # gets the same production-layout flags, which its launch takes; its kernel filtered by its name.
    flashmla = registry.get("flashmla-page-table")
    table_launch = bind(flashmla, wall_case(flashmla, 4, 1, 1, 3), "safe")
    table_file = write_case(table_launch, [], out_dir=tmp_path / "t")
    assert sanitizer.repro_target(table_file, status_path=status, python="python")[6:] == \
        ["--device", "cuda", "--layout", "production", "--no-absorb", "--in-process", "--trust-case"]
    assert replace(flashmla, table_launch, layout="production").layout == "production"
    assert sanitizer.kernel_filter_for("reference", "flashmla-page-table") == "create_flashmla_kv_indices_triton"
    assert sanitizer.kernel_filter_for("sglang==0.5.23", "fa3-decode-metadata") == "_fused_decode_metadata_kernel"
    assert sanitizer.kernel_filter_for("reference-blocked", "draft") == sanitizer.DEFAULT_KERNEL_FILTER
    assert sanitizer.kernel_filter_for("k.py:f", "flashmla-page-table") is None
    mem = sanitizer.tool_command("cs", "memcheck", target, xml_path=tmp_path / "x.xml", padding=256)
    assert mem[:9] == ["cs", "--tool", "memcheck", "--error-exitcode", "86", "--print-limit", "0", "--xml", "--save"]
    assert mem[mem.index("--padding") + 1] == "256" and "kns=generate_draft_decode_kv_indices" in mem
    assert mem[-len(target):] == target
    assert "--padding" not in sanitizer.tool_command("cs", "memcheck", target, xml_path=tmp_path / "x.xml")
    race = sanitizer.tool_command("cs", "racecheck", target, xml_path=tmp_path / "x.xml", kernel_filter=None)
    assert "--padding" not in race and "--kernel-name" not in race
    with pytest.raises(BadInput, match="unknown sanitizer tool"):
        sanitizer.tool_command("cs", "leakcheck", target, xml_path=tmp_path / "x.xml")
    with pytest.raises(BadInput, match="memcheck option"):
        sanitizer.tool_command("cs", "racecheck", target, xml_path=tmp_path / "x.xml", padding=64)


def test_initcheck_never_gets_a_kernel_filter(tmp_path):
    # With a filter, initcheck does not see the stores of PyTorch's kernels, so everything they fill
    # reads as uninitialised: the noise of the fixture and of every sweep case (kvfence.sanitizer.tool).
    target = ["python", "child"]
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert "--kernel-name" in sanitizer.tool_command("cs", tool, target, xml_path=tmp_path / "x.xml")
    assert "--kernel-name" not in sanitizer.tool_command("cs", "initcheck", target, xml_path=tmp_path / "x.xml")


def test_the_fixture_noise_is_reads_of_a_buffer_torch_filled():
    # The clean reference run under initcheck (filtered to the kernel) reports reads, in the kernel, of
    # req_to_token, the one input the fixture script builds with torch ops (slot_table), not with a copy
    # from the host. Every record is at the prefix-token load.
    init = sanitizer.parse_xml(fixture("sanitizer_initcheck_reference.xml"))
    text = fixture("sanitizer_initcheck_reference.txt")
    lines = {int(r.location.split(":")[1]) for r in init}
    assert len(lines) == 1 and all(r.kernel == "generate_draft_decode_kv_indices" and r.size == 4 for r in init)
    # The same kernel's prefix store (memcheck fixture, same run) is the next line: the read is the
    # prefix-token load that feeds it, ``tl.load(src + offs_t)`` with src = req_to_token's row.
    store = {r.location for r in sanitizer.parse_xml(fixture("sanitizer_memcheck_overflow_nocache.xml"))
             if r.kind == "Precise"}
    assert store == {f"draft_kv_indices.py:{lines.pop() + 1}"}
    assert "req_to_token=slot_table(" in fixture("make_sanitizer_fixtures.py")
    assert sanitizer.error_summary(text) == 6144


def test_summary_lines_of_every_tool():
    assert sanitizer.error_summary(fixture("sanitizer_racecheck_reference.txt")) == 0
    assert sanitizer.error_summary(fixture("sanitizer_synccheck_reference.txt")) == 0
    assert sanitizer.error_summary("========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warnings)") == 3
    assert sanitizer.error_summary("launched: need 4, width 4") is None


def test_caching_allocator_is_off_for_eager_and_on_for_graph():
    base = {"PATH": "/usr/bin", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "TRITON_INTERPRET": "1"}
    assert sanitizer.case_env("eager", base)["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    graph = sanitizer.case_env("graph", base)
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in graph and "TRITON_INTERPRET" not in graph
    assert "PYTORCH_NO_CUDA_MEMORY_CACHING" not in sanitizer.case_env(True, base)
    assert sanitizer.case_env(False, {})["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"


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
    proc = subprocess.run([sys.executable, "-m", "kvfence", "sweep", "--max-examples", "3",
                           "--out", str(tmp_path / "o")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "compute-sanitizer not found" in lines[0]
    assert not (tmp_path / "o").exists()


# -- every signal counted: a fake compute-sanitizer first on PATH -------------------------------------------
@pytest.fixture
def fake_tool(tmp_path, monkeypatch):
    """A fake compute-sanitizer first on PATH, found by ``locate`` like the real one; returns
    ``run(scenario, timeout)`` -> ToolVerdict for a real case file."""
    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.record import launch_of
    from kvfence.engine.casefile import write_case

    tool = install_fake_tool(tmp_path, monkeypatch)
    exe = sanitizer.locate()
    assert exe == str(tool)
    case = launch_of(Case(Config(topk=2, num_steps=2, ctx=8, max_bs=2, mode="eager"), Batch((3, 4), (0, 1), 1)))
    path = write_case(case, [], out_dir=tmp_path / "out", device="cuda", source="test")
    work = tmp_path / "work"
    work.mkdir()

    def run(scenario, timeout=60.0):
        monkeypatch.setenv("FAKE_SCENARIO", scenario)
        return sanitizer.run_tool(exe, "memcheck", path, "eager", work, timeout=timeout)

    return run


@pytest.mark.parametrize("scenario, child_exit", [("clean", 0), ("reproduces", 1)])
def test_a_consistent_run_has_no_tool_error(fake_tool, scenario, child_exit):
    v = fake_tool(scenario)
    assert (v.tool_errors, v.findings, v.errors, v.child_exit, v.exit_code) == ([], [], 0, child_exit, child_exit)
    assert Path(v.log).is_file()


def test_records_with_the_error_exit_code_are_findings_not_tool_errors(fake_tool):
    v = fake_tool("errors")
    assert v.exit_code == 86 and v.errors == 6 and v.source == "xml" and v.tool_errors == []
    assert {f.kind for f in v.findings} == {Kind.SANITIZER_MEMCHECK}


@pytest.mark.parametrize("scenario, problem", [
    ("errors_exit_ignored", "errors reported but exit code 0"),
    ("exit86_no_errors", "exit code 86 (--error-exitcode) but no error reported"),
    ("summary_only", "the summary counts 5 error(s) but no record was parsed"),
    ("no_summary", "no summary line"),
    ("bad_xml", "XML report"),
    ("dead_child", "the child left no status"),
    ("child_bad_input", "the child rejected its input (exit 2): kvfence: error: case file c.json: not JSON"),
    ("exit_mismatch", "compute-sanitizer exited 1 but its child exited 0"),
])
def test_every_inconsistent_signal_is_a_tool_error_with_the_log(fake_tool, scenario, problem):
    v = fake_tool(scenario)
    assert v.tool_errors, f"{scenario}: no SANITIZER_TOOL_ERROR"
    assert all(f.kind == Kind.SANITIZER_TOOL_ERROR for f in v.tool_errors)
    assert any(problem in f.extra["problem"] for f in v.tool_errors), [f.extra["problem"] for f in v.tool_errors]
    assert all(f.extra["log"] == v.log and Path(v.log).is_file() for f in v.tool_errors)


def test_a_broken_xml_falls_back_to_the_text_log_and_is_still_reported(fake_tool):
    v = fake_tool("bad_xml")
    assert v.source == "text" and sum(f.count for f in v.findings if f.extra["record_kind"] == "Precise") == 4
    assert any("unusable" in f.extra["problem"] for f in v.tool_errors)


def test_a_timeout_kills_the_tool_and_its_children_and_is_a_tool_error(fake_tool):
    t0 = time.perf_counter()
    v = fake_tool("hang", timeout=2.0)
    assert time.perf_counter() - t0 < 20  # the grandchild holding the pipe was killed too
    assert v.timed_out and v.exit_code is None
    assert [f.extra["problem"] for f in v.tool_errors] == ["timed out after 2 s; its process group was killed"]


def test_the_child_wrapper_records_its_own_exit_code(tmp_path):
    # The real child: a case file that does not exist is bad input (2), recorded in the status file.
    status = tmp_path / "s.json"
    proc = subprocess.run([sys.executable, "-m", "kvfence.sanitizer_child", str(status), "repro",
                           str(tmp_path / "missing.json"), "--device", "cpu"],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and sanitizer.read_status(status) == {"exit": 2}
    assert "kvfence: error:" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--kernel", "no/such/file.py:k"], "kernel file no/such/file.py does not exist"),
    (["--kernel", "tests/targets/bad_writes.py:BAD_VALUE"], "neither a @triton.jit function nor a launcher"),
    (["--kernel", "tests/targets/bad_writes.py:nothing"], "has no attribute 'nothing'"),
    (["--sizing", "bogus"], "unknown sizing 'bogus'"),
    (["--timeout", "0"], "--timeout 0"),
])
def test_sweep_rejects_a_bad_kernel_or_flag_in_one_line(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "kvfence", "sweep", "--out", str(tmp_path / "o"), *args],
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                          timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "o").exists()


def test_sweep_accepts_a_good_kernel_plugin_and_gets_to_the_tool_check(tmp_path):
    # The same command with a valid launcher passes validation: it stops at the missing tool instead.
    env = dict(os.environ, PATH=os.path.dirname(sys.executable), CUDA_HOME="/nonexistent", CUDA_PATH="/nonexistent",
               PYTHONPATH=str(ROOT))
    if Path("/usr/local/cuda/bin/compute-sanitizer").exists():
        pytest.skip("compute-sanitizer is installed at /usr/local/cuda on this machine")
    proc = subprocess.run([sys.executable, "-m", "kvfence", "sweep", "--out", str(tmp_path / "o"),
                           "--kernel", "tests/targets/bad_writes.py:row_value"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "compute-sanitizer not found" in proc.stderr, proc.stderr


def test_nightly_profile_is_red_when_its_sweeps_cannot_run(tmp_path):
    # No compute-sanitizer here: both sweeps exit 2, so the profile must not report success.
    env = dict(os.environ, PATH=os.path.dirname(sys.executable), CUDA_HOME="/nonexistent", CUDA_PATH="/nonexistent",
               PYTHONPATH=str(ROOT))
    if Path("/usr/local/cuda/bin/compute-sanitizer").exists():
        pytest.skip("compute-sanitizer is installed at /usr/local/cuda on this machine")
    out = tmp_path / "nightly.json"
    proc = subprocess.run([sys.executable, "benchmarks/nightly.py", "--out", str(tmp_path / "n"), "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    doc = json.loads(out.read_text())
    assert proc.returncode == 1 and (doc["safe_exit"], doc["prefix_exit"]) == (2, 2)
    assert not any(doc["checks"].values()) and doc["detection_matrix"] is None
    assert "compute-sanitizer not found" in doc["safe"]["stderr_tail"][-1]


def test_baseline_runs_the_same_child_and_reports_when_it_cannot_run(fake_tool, tmp_path):
    # The real child, asked for CUDA on a machine without it, rejects its input: a baseline tool error.
    if subprocess.run([sys.executable, "-c", "import torch,sys; sys.exit(torch.cuda.is_available())"]).returncode:
        pytest.skip("this machine has CUDA")
    case = next((tmp_path / "out" / "cases").glob("*.json"))
    seconds, child_exit, errors = sanitizer.baseline(case, "eager", tmp_path / "work", timeout=120)
    assert child_exit == 2 and seconds > 0 and len(errors) == 1
    assert errors[0].kind == Kind.SANITIZER_TOOL_ERROR and errors[0].buffer == "baseline"
    assert "the child rejected its input (exit 2): kvfence: error:" in errors[0].extra["problem"]
    assert "CUDA" in errors[0].extra["problem"] and Path(errors[0].extra["log"]).is_file()


def test_sweep_exit_counts_tool_errors_and_baselines_not_only_findings():
    from kvfence.sanitizer.sweep import sweep_exit

    clean = {"canary_cases_with_findings": 0, "baseline_errors": 0,
             "per_tool": {"memcheck": {"cases_with_findings": 0, "cases_with_tool_errors": 0}},
             "detection_matrix": {"classes": ["the matrix runs buggy targets on purpose: never counted"]}}
    assert sweep_exit(clean) == 0
    for key, value in (("canary_cases_with_findings", 1), ("baseline_errors", 1), ("child_cases_with_findings", 1)):
        assert sweep_exit(dict(clean, **{key: value})) == 1
    for field_ in ("cases_with_findings", "cases_with_tool_errors"):
        dirty = dict(clean, per_tool={"memcheck": dict(clean["per_tool"]["memcheck"], **{field_: 1})})
        assert sweep_exit(dirty) == 1


FAKE_PYTHON = """#!{python}
import json, os, sys
status = sys.argv[sys.argv.index("kvfence.sanitizer_child") + 1]
code = int(os.environ["FAKE_CHILD_EXIT"])
open(status, "w").write(json.dumps({{"exit": code}}))
sys.exit(code)
"""


@pytest.mark.parametrize("baseline_exit", [0, 1])
def test_a_case_row_checks_the_child_verdict_with_and_without_the_tool(fake_tool, tmp_path, monkeypatch, baseline_exit):
    # The baseline child (a fake python) says `baseline_exit`; under the (fake) tools the child says 0.
    from kvfence.engine.casefile import load_case
    from kvfence.sanitizer.sweep import sanitize_case

    python = tmp_path / "fake-python"
    python.write_text(FAKE_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_CHILD_EXIT", str(baseline_exit))
    path = next((tmp_path / "out" / "cases").glob("*.json"))
    loaded = load_case(path)
    row = sanitize_case(sanitizer.locate(), loaded.case, loaded.findings, path, ["memcheck", "racecheck"],
                        tmp_path / "work", timeout=60, python=str(python))
    assert row["baseline_exit"] == baseline_exit and row["baseline_errors"] == []
    for tool in ("memcheck", "racecheck"):
        verdict = row["tools"][tool]
        assert verdict["child_exit"] == 0 and verdict["slowdown"] > 0
        problems = [f["extra"]["problem"] for f in verdict["tool_errors"]]
        if baseline_exit == 0:
            assert problems == []
        else:
            assert problems == [f"the child's verdict under {tool} (exit 0) differs from the same child without a "
                                f"tool (exit 1)"]


def test_sweep_cases_never_runs_a_plugin_a_case_file_names(tmp_path):
    # A case file is data: a plug-in kernel it names runs only when --kernel names it too.
    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.record import launch_of
    from kvfence.engine.casefile import write_case
    from kvfence.sanitizer.sweep import load_cases

    case = launch_of(Case(Config(topk=1, num_steps=1, ctx=4, max_bs=1, mode="eager"), Batch((2,), (0,), 1),
                          kernel="evil.py:payload"))
    write_case(case, [], out_dir=tmp_path, device="cuda", source="test")
    with pytest.raises(BadInput, match="names the plug-in kernel 'evil.py:payload'; pass --kernel"):
        load_cases(str(tmp_path / "cases"), None)
    # Named on the command line, the same file is accepted (its kernel is replaced).
    assert [c.kernel for c, _, _ in load_cases(str(tmp_path / "cases"), "reference")] == ["evil.py:payload"]


def test_a_host_api_report_in_the_text_log_is_a_record():
    # initcheck's host-side report as the text log prints it (format seen in public initcheck output).
    log = ("========= Host API memory access error at host access to 0x7f7fcdc01200 of size 400 bytes\n"
           "=========     Uninitialized access at 0x7f7fcdc01300 on access by cudaMemcpy source\n"
           "========= ERROR SUMMARY: 1 error\n")
    records = sanitizer.parse_text(log)
    assert [(r.kind, r.text) for r in records] == \
        [("HostApi", "Host API memory access error at host access to 0x7f7fcdc01200 of size 400 bytes")]
    assert sanitizer.signal_findings("initcheck", exit_code=86, timed_out=False, timeout=1, summary=1,
                                     records=len(records), xml_problem=None, child={"exit": 0}, log="x") == []
