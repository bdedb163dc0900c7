"""Plug-in kernels and sizing policies (kvfence.contracts.draft.targets): ``--kernel`` / ``--sizing`` end to end.

A kernel file outside the project runs through ``python -m kvfence fuzz``; a plug-in that cannot be
imported, has the wrong signature or lacks the attribute is exit 2 with one line on stderr. The same
choices reach pytest through ``--kvfence-kernel`` / ``--kvfence-sizing`` (or KVFENCE_KERNEL / KVFENCE_SIZING): the
property test at the end runs whatever kernel and sizing the session was started with.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytestmark = pytest.mark.cpu_only

ROOT = Path(__file__).resolve().parents[1]
ATTR = "generate_draft_decode_kv_indices"

LAUNCHER = '''
import sys
sys.path.insert(0, {root!r})
from kvfence.kernels.draft.draft_kv_indices import generate_draft_decode_kv_indices, launch as classic_launch


def launch(*, req_pool_indices, req_to_token, seq_lens, kv_indices, kv_indptr, positions, topk, num_steps,
           page_size):
    # A launcher with scratch: the kernel reads a copy of seq_lens that kvfence never registered.
    classic_launch(generate_draft_decode_kv_indices, req_pool_indices=req_pool_indices, req_to_token=req_to_token,
                   seq_lens=seq_lens.clone(), kv_indices=kv_indices, kv_indptr=kv_indptr, positions=positions,
                   topk=topk, num_steps=num_steps, page_size=page_size)
'''


def kvfence(*args, cwd=ROOT):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "kvfence", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def fuzz_args(tmp_path, *extra):
    return ("fuzz", "--device", "cpu", "--max-examples", "15", "--seed", "1", "--quiet", "--shrink-seconds", "5",
            "--out", str(tmp_path / "out"), *extra)


@pytest.fixture
def outside_kernel(tmp_path) -> Path:
    """The reference kernel copied into its own file in a folder outside the project."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    path = folder / "my_kernel.py"
    shutil.copy(ROOT / "kernels" / "draft" / "draft_kv_indices.py", path)
    return path


def test_kernel_file_outside_the_project_runs_clean(tmp_path, outside_kernel):
    proc = kvfence(*fuzz_args(tmp_path, "--kernel", f"{outside_kernel}:{ATTR}"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no findings" in proc.stdout


def test_buggy_kernel_file_outside_the_project_is_caught(tmp_path, outside_kernel):
    """The pair of the test above: the same file with the prefix sum made inclusive must fail."""
    src = outside_kernel.read_text()
    bad = src.replace("mask=offs_b < b, other=0", "mask=offs_b <= b, other=0")
    assert bad != src
    outside_kernel.write_text(bad)
    proc = kvfence(*fuzz_args(tmp_path, "--kernel", f"{outside_kernel}:{ATTR}"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr


def one_line_exit_2(proc, *needles):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert all(n in lines[0] for n in needles), lines[0]


def test_broken_kernel_file_is_one_line_exit_2(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import triton\n\ndef oops(:\n")
    one_line_exit_2(kvfence(*fuzz_args(tmp_path, "--kernel", f"{broken}:{ATTR}")), "cannot import", "SyntaxError")


@pytest.mark.parametrize("source,needles", [
    ("raise RuntimeError('no GPU here')\n", ("cannot import", "RuntimeError", "no GPU here")),
    ("import sys\nsys.exit(3)\n", ("cannot import", "SystemExit")),
    ("import no_such_module_kvfence\n", ("cannot import", "ModuleNotFoundError")),
    ("import triton\nimport triton.language as tl\n\n@triton.jit\n"
     "def generate_draft_decode_kv_indices(a, b, c, d, e, f, g, h, i, j, k, l):\n    pass\n",
     ("takes 12 required arguments", "classic ABI has 13")),
    ("generate_draft_decode_kv_indices = 42\n", ("neither a @triton.jit function nor a launcher",)),
    ("def generate_draft_decode_kv_indices(*, kv_indices, kv_indptr):\n    pass\n", ("must accept keyword arguments",)),
    ("x = 1\n", ("has no attribute", ATTR)),
])
def test_bad_kernel_plugins_are_one_line_exit_2(tmp_path, source, needles):
    from kvfence.cli import main

    path = tmp_path / "plugin.py"
    path.write_text(source)
    args = list(fuzz_args(tmp_path, "--kernel", f"{path}:{ATTR}"))
    proc = kvfence(*args) if "SyntaxError" in needles else None
    if proc is None:  # in-process is enough for these: main() returns the exit code, stderr holds the line
        import io
        from contextlib import redirect_stderr

        err = io.StringIO()
        with redirect_stderr(err):
            code = main(args)
        proc = subprocess.CompletedProcess(args, code, "", err.getvalue())
    one_line_exit_2(proc, *needles)


def test_missing_file_and_unknown_module_are_one_line_exit_2(tmp_path):
    one_line_exit_2(kvfence(*fuzz_args(tmp_path, "--kernel", f"{tmp_path / 'nope.py'}:{ATTR}")), "does not exist")
    one_line_exit_2(kvfence(*fuzz_args(tmp_path, "--kernel", f"sglang.srt.speculative.spec_utils:{ATTR}")),
                    "cannot import", "sglang")


def test_launcher_plugin_with_scratch_runs_clean(tmp_path):
    path = tmp_path / "launcher.py"
    path.write_text(LAUNCHER.format(root=str(ROOT)))
    proc = kvfence(*fuzz_args(tmp_path, "--kernel", f"{path}:launch"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_module_attr_spec_resolves(device):
    from kvfence.contracts.draft.targets import resolve_kernel

    target = resolve_kernel(f"kvfence.kernels.draft.draft_kv_indices:{ATTR}", device)
    assert target.request_axis == 1


@pytest.mark.parametrize("body,code", [("return n * topk * (ctx + num_steps)", 0), ("return n * ctx", 1)])
def test_sizing_file_plugin(tmp_path, body, code):
    path = tmp_path / "my_sizing.py"
    path.write_text(f"def width(n, topk, ctx, num_steps):\n    {body}\n")
    proc = kvfence(*fuzz_args(tmp_path, "--sizing", f"{path}:width", "--topk", "2", "--max-examples", "40"))
    assert proc.returncode == code, proc.stdout + proc.stderr


@pytest.mark.parametrize("source,needles", [
    ("def width(n, topk):\n    return 1\n", ("must take (n, topk, ctx, num_steps)",)),
    ("def width(n, topk, ctx, num_steps):\n    raise ValueError('boom')\n", ("failed for", "boom")),
    ("def width(n, topk, ctx, num_steps):\n    return 2.5\n", ("failed for", "TypeError")),
])
def test_bad_sizing_plugins_are_one_line_exit_2(tmp_path, source, needles):
    """A command that names a sizing plug-in runs behind the boundary (its line comes from the child)."""
    path = tmp_path / "bad_sizing.py"
    path.write_text(source)
    one_line_exit_2(kvfence(*fuzz_args(tmp_path, "--sizing", f"{path}:width")), *needles)


def test_same_file_loaded_once_for_kernel_and_sizing(tmp_path, outside_kernel, device):
    from kvfence.engine.kernels import load_attr

    first = load_attr(f"{outside_kernel}:{ATTR}", "kernel")
    assert load_attr(f"{outside_kernel}:{ATTR}", "kernel") is first


def test_the_drafts_kernel_specs_resolve_through_the_engines_resolver():
    """One resolver: a draft or rail ``mutant:NAME`` is the file the engine's ``mutant_kernel_spec`` patches (the
    runner and the engine launch the same file), and a release of a project with no draft kernel is one line."""
    from kvfence.contracts.draft.record import DRAFT, WINDOW_RAIL
    from kvfence.contracts.draft.targets import check_kernel_spec, mutant_spec
    from kvfence.engine.kernels import mutant_kernel_spec, reference_spec
    from kvfence.errors import BadInput

    for record in (DRAFT, WINDOW_RAIL):
        mutant = next(m for m in record.mutants if m.patch)
        spec = mutant_spec(f"mutant:{mutant.name}")
        assert spec == mutant_kernel_spec(record.name, mutant, reference_spec(record))
        assert f"-{record.name}-{mutant.name}.py:" in spec
    with pytest.raises(BadInput, match="the draft kernel's releases are SGLang's"):
        check_kernel_spec("vllm==0.9.0")


# -- the kernel / sizing under test in pytest ----------------------------------------------------------
@given(data=st.data())
def test_kernel_under_test_matches_the_oracle(kernel_spec, sizing_spec, make_session, data):
    """Runs ``--kvfence-kernel`` / ``--kvfence-sizing`` (env KVFENCE_KERNEL / KVFENCE_SIZING; reference and safe by
    default)."""
    from kvfence.contracts.draft.record import launch_of
    from kvfence.contracts.draft.strategies import cases, configs
    from kvfence.engine.casefile import format_failure

    launch = launch_of(data.draw(cases(configs(sizing=sizing_spec, max_ctx=24, max_max_bs=3), kernel=kernel_spec)))
    findings = make_session(kernel_spec).check(launch)
    assert not findings, format_failure(launch, findings)


def test_pytest_kernel_option_tests_a_users_kernel(tmp_path, outside_kernel):
    """``pytest --kvfence-kernel file.py:attr`` (here via KVFENCE_KERNEL) runs the property test above on that kernel: a
    buggy one fails."""
    src = outside_kernel.read_text()
    outside_kernel.write_text(src.replace("z = tl.where(z == 0, num_seqs * topk, z)", "z = z"))
    # triage: the failure as drawn (a clean checkout has no example database, and shrinking takes a minute)
    env = dict(os.environ, KVFENCE_KERNEL=f"{outside_kernel}:{ATTR}", HYPOTHESIS_PROFILE="triage")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--kvfence-device", "cpu", f"{Path(__file__)}::test_kernel_under_test_matches_the_oracle"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "MISSING_WRITE" in proc.stdout
