"""kvfence inside another project: one import name, the pytest plugin and ``kvfence.check_kernel`` from a
project of its own, repro lines that replay as printed, and ``module:attr`` resolved from the current folder.

A wheel built from this checkout holds exactly the top-level name ``kvfence`` and installs next to a
package called ``kernels``. A small project in a temp folder (its own kernel file and
``tests/test_kernel.py``, written with only the API of docs/own-kernel.md) runs pytest in a subprocess: the
correct kernel passes, a planted bug fails with a shrunk case and a repro line, and that line, run as
printed, exits 1. Every repro line a plug-in fuzz run prints (terminal, report.md, report.html,
summary.json) does the same.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ATTR = "generate_draft_decode_kv_indices"
#: The planted bug: the empty-prefix fix-up of kv_indptr dropped (its column bs a MISSING_WRITE), from the reference
#: kernel.
CORRECT_LINE = "z = tl.where(z == 0, num_seqs * topk, z)"
#: What docs/own-kernel.md shows a user's test to be (the kernel file sits next to tests/).
USER_TEST = '''
import kvfence


def test_my_kernel_against_kvfence_oracle():
    kvfence.check_kernel("my_kernel.py:generate_draft_decode_kv_indices", sizing="safe", max_examples=6)
'''
#: Folders and files a wheel is built from (never reports/out, never the venv).
SOURCES = ("pyproject.toml", "README.md", "harness", "kernels", "strategies", "reports")


def child_env(**extra) -> dict:
    """The environment of a child run: this interpreter's folder first on PATH (so a printed ``python``
    is this one), no PYTHONPATH pointing into the checkout."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", **extra)
    env.pop("PYTHONPATH", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def run_verbatim(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """A printed command, run as a user would paste it into a shell."""
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=child_env(), capture_output=True, text=True, timeout=300)


# -- one import name -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built offline from a copy of the sources (the build writes build/ and *.egg-info there)."""
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("out", "__pycache__", "*.egg-info")
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, src / name, **(
            {"ignore": ignore} if (ROOT / name).is_dir() else {}))
    dist = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(dist), str(src)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"cannot build the wheel offline here: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    (path,) = dist.glob("kvfence-*.whl")
    return path


def test_wheel_has_one_top_level_name_and_the_pytest_plugin(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entries = zf.read(entry_points).decode()
    assert tops == {"kvfence"}, tops
    assert not any("/out/" in n for n in names)  # generated output is no part of the package
    assert "kvfence/kernels/draft/draft_kv_indices.py" in names and "kvfence/strategies/__init__.py" in names
    assert re.search(r"\[pytest11\]\s*kvfence = kvfence\.pytest_plugin\s", entries), entries


def test_wheel_installs_next_to_a_package_named_kernels(wheel, tmp_path):
    """The clash of the old layout: a project (or PyPI) package ``kernels`` and kvfence's own kernels."""
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True,
                          timeout=120)
    if made.returncode != 0:
        pytest.skip(f"cannot make a venv here: {(made.stderr.strip().splitlines() or ['?'])[-1]}")
    python = venv / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                           "--no-index", "-q", str(wheel)], capture_output=True, text=True, timeout=300)
    if "no such option: --python" in proc.stderr:
        pytest.skip("this pip cannot install into another interpreter (pip --python needs pip >= 22.3)")
    assert proc.returncode == 0, proc.stderr
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "kernels").mkdir()
    (site / "kernels" / "__init__.py").write_text("draft_kv_indices = 'the other kernels package'\n")
    # kvfence's dependencies (torch, triton, ...) from this environment, after the fresh venv's own packages.
    deps = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    (site / "zz_outer_deps.pth").write_text("\n".join(deps) + "\n")
    probe = ("import kernels, kvfence, kvfence.kernels.draft.draft_kv_indices as ours; "
             "print(kernels.draft_kv_indices); print(ours.__file__); print(kvfence.__file__)")
    out = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=child_env(), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    theirs, ours, package = out.stdout.split("\n")[:3]
    assert theirs == "the other kernels package"
    assert ours.startswith(str(site / "kvfence" / "kernels")) and package.startswith(str(site / "kvfence"))


def test_import_kvfence_imports_neither_torch_nor_triton():
    probe = ("import sys, kvfence, kvfence.contracts.draft.strategies; "
             "print(sorted({'torch', 'triton'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# -- a project of its own --------------------------------------------------------------------------------
@pytest.fixture
def project(tmp_path) -> Path:
    """A user's project: its kernel file (kvfence's reference kernel, copied) and tests/test_kernel.py."""
    root = tmp_path / "proj"
    (root / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "kernels" / "draft" / "draft_kv_indices.py", root / "my_kernel.py")
    assert CORRECT_LINE in (root / "my_kernel.py").read_text()
    (root / "tests" / "test_kernel.py").write_text(USER_TEST)
    return root


def run_pytest(project: Path) -> subprocess.CompletedProcess:
    # On the CPU whatever machine runs this: the shrunk case below is the CPU domain's simplest one.
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "tests"],
                          cwd=project, env=child_env(KVFENCE_DEVICE="cpu"), capture_output=True, text=True,
                          timeout=600)


@pytest.mark.interpreter  # the project's pytest runs kernels under the CPU interpreter
def test_a_projects_own_tests_pass_a_correct_kernel_and_fail_a_planted_bug(project):
    good = run_pytest(project)
    assert good.returncode == 0, good.stdout[-3000:] + good.stderr[-2000:]
    assert "1 passed" in good.stdout

    kernel = project / "my_kernel.py"
    kernel.write_text(kernel.read_text().replace(CORRECT_LINE, "z = z"))
    bad = run_pytest(project)
    assert bad.returncode == 1, bad.stdout[-3000:] + bad.stderr[-2000:]
    assert "MISSING_WRITE" in bad.stdout
    section = bad.stdout.split("kvfence: replay this case", 1)[1]
    line = next(t for t in section.splitlines() if t.startswith("python -m kvfence repro "))
    assert "--kernel my_kernel.py:" + ATTR in line
    case_path = project / line.split()[4]
    from kvfence.engine.casefile import load_case

    shrunk = load_case(case_path).case
    c, b = shrunk.case.config, shrunk.case.batch
    assert (c.topk, c.num_steps, c.page_size, b.raw_bs) == (1, 1, 1, 1), (c, b)  # shrunk to the simplest shape
    replay = run_verbatim(line, project)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "MISSING_WRITE" in replay.stdout


# -- repro lines that work -------------------------------------------------------------------------------
SIZING = '''
def width(n, topk, ctx, num_steps):
    """The pre-fix sizing, as a user's own policy: no topk factor."""
    return n * (ctx + num_steps)
'''


def printed_repro_lines(out: Path, stdout: str) -> dict:
    """Every repro command a fuzz run printed, by where: terminal, report.md, report.html, summary.json."""
    pattern = re.compile(r"(?:python -m )?(?<![\w-])kvfence repro [^`<\n]+")
    return {
        "terminal": pattern.findall(stdout),
        "report.md": pattern.findall((out / "report.md").read_text()),
        "report.html": [html.unescape(x) for x in pattern.findall((out / "report.html").read_text())],
        "summary.json": [c["repro"] for c in json.loads((out / "summary.json").read_text())["cases"].values()],
    }


@pytest.mark.interpreter  # fuzz --device cpu in a subprocess
@pytest.mark.long
def test_every_repro_line_of_a_plugin_run_replays_as_printed(tmp_path):
    """Kernel and sizing are plug-ins named as module:attr from the current folder (no PYTHONPATH)."""
    shutil.copy(ROOT / "kernels" / "draft" / "draft_kv_indices.py", tmp_path / "my_kernel.py")
    (tmp_path / "my_sizing.py").write_text(SIZING)
    proc = subprocess.run(["kvfence", "fuzz", "--kernel", f"my_kernel:{ATTR}", "--sizing", "my_sizing:width",
                           "--device", "cpu", "--max-examples", "30", "--seed", "1", "--shrink-seconds", "5", "--quiet",
                           "--out", "out"],
                          cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    lines = printed_repro_lines(tmp_path / "out", proc.stdout)
    assert all(lines.values()), lines
    for where, found in lines.items():
        for line in found:
            assert f"--kernel my_kernel:{ATTR}" in line and "--sizing my_sizing:width" in line, (where, line)
    for line in {line for found in lines.values() for line in found}:  # each distinct line, once
        replay = run_verbatim(line, tmp_path)
        assert replay.returncode == 1, (line, replay.stdout[-2000:], replay.stderr[-2000:])


def test_repro_command_names_only_plugins():
    """A builtin kernel or sizing needs no flag (the case file names it); a plug-in is named again."""
    from kvfence.engine.casefile import repro_command

    assert repro_command("c.json", "reference", "safe", "draft") == "python -m kvfence repro c.json"
    assert repro_command("c.json", "reference-blocked", "prefix", "draft") == "python -m kvfence repro c.json"
    assert repro_command("c.json", "mutant:no_z0_rule", "safe", "draft") == "python -m kvfence repro c.json"
    # a table contract's own sizing and a release's are named by the case file too
    assert (repro_command("c.json", "reference", "flashmla-graph", "flashmla-page-table")
            == "python -m kvfence repro c.json")
    assert (repro_command("c.json", "sglang==0.5.5", "sglang==0.5.5:flashmla", "flashmla-page-table")
            == "python -m kvfence repro c.json")
    assert (repro_command("my dir/c.json", "k.py:f", "safe", "draft")
            == "python -m kvfence repro 'my dir/c.json' --kernel k.py:f")
    assert (repro_command("c.json", "reference", "pkg.mod:w", "draft")
            == "python -m kvfence repro c.json --sizing pkg.mod:w")


# -- module:attr from the current folder -----------------------------------------------------------------
def test_module_spec_resolves_from_the_current_folder_or_says_how(tmp_path):
    (tmp_path / "my_sizing.py").write_text(SIZING)
    probe = ("from kvfence.contracts.draft.sizing import resolve_sizing; import sys; "
             "print(resolve_sizing(sys.argv[1])(1, 2, 8, 1))")
    # -I: the current folder is not on sys.path (as for the console script, whose sys.path[0] is its bin
    # folder; the plug-in run above goes through it): kvfence adds it.
    found = subprocess.run([sys.executable, "-I", "-c", probe, "my_sizing:width"], cwd=tmp_path, env=child_env(),
                           capture_output=True, text=True, timeout=120)
    assert found.returncode == 0 and found.stdout.strip() == "9", found.stderr
    missing = subprocess.run(["kvfence", "fuzz", "--sizing", "no_such_sizing:width", "--out", "o"], cwd=tmp_path,
                             env=child_env(), capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert "No module named 'no_such_sizing'" in missing.stderr and str(tmp_path) in missing.stderr


def test_check_kernel_refuses_unusable_arguments_in_one_line(tmp_path, device):
    """Bad input to the API is ``BadInput`` naming the problem, before anything is launched."""
    import kvfence
    from kvfence.errors import BadInput

    (tmp_path / "afile").write_text("")
    for kwargs, needle in (({"max_examples": 0}, "max_examples"), ({"mode": "fast"}, "mode"),
                           ({"sizing": "huge"}, "unknown sizing 'huge'"), ({"device": "tpu"}, "unknown device"),
                           ({"shrink_seconds": -1}, "shrink_seconds must be"),
                           ({"shrink_seconds": "10"}, "shrink_seconds must be"),
                           ({"case_timeout": 0}, "case_timeout must be a positive"),
                           ({"case_timeout": float("nan")}, "case_timeout must be a positive"),
                           ({"out_dir": tmp_path / "afile"}, "afile exists and is not a directory"),
                           ({"out_dir": tmp_path / "afile" / "sub"}, "out_dir .*afile/sub: cannot write in"),
                           ({"out_dir": 3}, "out_dir must be a path")):
        with pytest.raises(BadInput, match=needle):
            kvfence.check_kernel("reference", **dict({"out_dir": tmp_path}, **kwargs))
    with pytest.raises(BadInput, match="No module named 'no_such_kernels'"):
        kvfence.check_kernel("no_such_kernels:launch", device=device, out_dir=tmp_path)
    assert not (tmp_path / "cases").exists()
