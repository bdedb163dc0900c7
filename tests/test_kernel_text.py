"""No code from a wheel runs: kernel text is admitted by an allow-list (kvfence.release.kernel_text, docs/security.md).

A release kernel's ``@triton.jit`` body is Python under Triton's CPU interpreter, and its module's decorators,
defaults and constants run when kvfence imports it. Each escape below (the issue's ``tl.__builtins__`` and
``getattr(tl, '__builtins__')``, and their variants) is refused in one line naming ``file:line``, by the checker
itself, by the extractor (the wheel's file and line), and end to end: ``fuzz --kernel sglang==V`` (the draft's
release path), ``--contract trtllm-mha-page-table --kernel sglang==V`` (a contract's release kernel), ``--contract
slot-mapping --kernel vllm==V`` (in the kernel and in the jit helper it imports) and ``affected`` for vLLM, each
with a payload that would create a marker file, which must not exist afterwards. A tampered cache entry (payload
added, sha256 re-written) is refused on read. The correct kernels of the same fake wheels are admitted (the
end-to-end pairs are the existing tests/test_upstream.py, test_slot_mapping.py and test_affected_sites.py runs),
and every real release's kernels pass (``KVFENCE_TEST_WHEELS``; skipped without it).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvfence.errors import BadInput
from kvfence.release.extract import extract
from kvfence.release.kernel_text import check_kernel_text

ROOT = Path(__file__).resolve().parents[1]
#: A short fuzz run on the CPU (the refusals come before any case; the good entries run a few).
FEW = ("--device", "cpu", "--max-examples", "3", "--seed", "0")

#: A kernel written here in the shape of the release kernels (a constant, a jit helper, tl, .to, range).
KERNEL = '''\
import triton
import triton.language as tl

BLOCK = tl.constexpr(64)
LIMIT = 1 << 20


@triton.jit
def _clamp(x, n):
    return tl.where(x < n, x, n)


@triton.jit
def kernel(src, dst, n, BLOCK_N: tl.constexpr = 64, FLAG: tl.constexpr = False):
    pid = tl.program_id(0)
    offs = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    v = tl.load(src + offs, mask=offs < n, other=0)
    # ESCAPE
    for i in range(0, 2):
        v = _clamp(v, n + i) if i > 0 else v
    tl.store(dst + offs, v.to(dst.dtype.element_ty), mask=offs < n)
'''
BODY_LINE = KERNEL.splitlines().index("    # ESCAPE") + 1

#: Statements put in the kernel's body, each with what the refusal says (after ``file:line: ``).
BODY_ESCAPES = [
    ("tl.__builtins__['__import__']('os').system('true')", "'__builtins__' is a dunder"),
    ("getattr(tl, '__builtins__')['__import__']('os').system('true')", "calling 'getattr'"),
    ("x = tl.load.__globals__['os']", "'__globals__' is a dunder"),
    ("x = (1).__class__.__subclasses__()", "is a dunder"),
    ("x = src.__class__", "'__class__' is a dunder"),
    ("x = tl.__dict__", "'__dict__' is a dunder"),
    ("x = tl.core.builtins", "tl.core is not one of the tl names"),
    ("x = triton.language.core", "triton.language is not one of the triton names"),
    ("x = globals()['os']", "calling 'globals'"),
    ("x = vars(tl)", "calling 'vars'"),
    ("x = type(tl)", "calling 'type'"),
    ("exec('import os')", "calling 'exec'"),
    ("x = eval('1')", "calling 'eval'"),
    ("x = open('/dev/null')", "calling 'open'"),
    ("x = compile('1', 'f', 'eval')", "calling 'compile'"),
    ("x = __import__('os')", "'__import__' is a dunder"),
    ("print(v)", "calling 'print'"),
    ("breakpoint()", "calling 'breakpoint'"),
    ("f = lambda: 0", "a Lambda"),
    ("import os", "a Import statement"),
    ("from os import system", "a ImportFrom statement"),
    ("global tl", "a Global statement"),
    ("x = (y := tl)", "a NamedExpr"),
    ("x = f\"{open('/dev/null')}\"", "a JoinedStr"),
    ("x = '{0.__class__}'.format(tl)", "the attribute .format"),
    ("x = [i for i in range(3)]", "a ListComp"),
    ("x = (i for i in range(3)).gi_frame", "a GeneratorExp"),
    ("x = {'a': 1}", "a Dict"),
    ("def inner():\n        return 0", "a FunctionDef statement"),
    ("with open('/dev/null') as f:\n        pass", "a With statement"),
    ("try:\n        pass\n    except Exception:\n        pass", "a Try statement"),
    ("del v", "a Delete statement"),
    ("raise SystemExit(0)", "a Raise statement"),
    ("x = src.handle", "the attribute .handle"),
    ("m = tl\n    m.core", "the attribute .core"),
    ("f = tl.load\n    f(src)", "calling 'f'"),
    ("x = v.to.__self__", "'__self__' is a dunder"),
    ("x = tl.load(*[src])", "a *argument"),
    ("x = tl.load(src, **{'mask': None})", "a **argument"),
    ("x = (lambda: tl)()", "a Lambda"),
    ("tl.load = print", "assigning to 'tl.load'"),
    ("range = tl", "'range' is rebound"),
    ("tl = src", "'tl' is rebound"),
    ("x = b'payload'", "a bytes literal"),
    ("x = unknown_name + 1", "'unknown_name' is not a parameter"),
    ("x = max(['import os'], key=FLAG)", "calling max with keyword arguments"),
    ("x = min([1], key=print)", "calling min with keyword arguments"),
    ("f = max\n    x = f(1, 2)", "calling 'f'"),
]

#: Module-level edits (old text, new text), with the line the refusal names and what it says.
MODULE_ESCAPES = [
    (("import triton\n", "import triton\nimport os\n"), 2, "the import 'import os'"),
    (("import triton\n", "import triton\nfrom triton.language.core import builtins\n"), 2, "the import"),
    (("LIMIT = 1 << 20", "LIMIT = open('/dev/null')"), 5, "a constant's value"),
    (("LIMIT = 1 << 20", "LIMIT = 10 ** 100"), 5, "a shift or power past 64"),
    (("LIMIT = 1 << 20", "LIMIT = 2 ** 60 * 2 ** 60"), 5, "past 2**64"),
    (("LIMIT = 1 << 20", "LIMIT: __import__('os').getpid() = 1"), 5, "'__import__' is a dunder"),
    (("LIMIT = 1 << 20", "__builtins__ = {}"), 5, "is a dunder"),
    (("LIMIT = 1 << 20", "class LIMIT:\n    pass"), 5, "a ClassDef statement"),
    (("LIMIT = 1 << 20", "if True:\n    import os"), 5, "a If statement"),
    (("@triton.jit\ndef _clamp", "@triton.jit\n@print\ndef _clamp"), 9, "decorated other than by @triton.jit"),
    (("@triton.jit\ndef _clamp", "@triton.jit(do_not_specialize=[print('x')])\ndef _clamp"), 8,
     "decorated other than by @triton.jit"),
    (("@triton.jit\ndef _clamp", "def _clamp"), 8, "decorated other than by @triton.jit (no decorator)"),
    (("FLAG: tl.constexpr = False", "FLAG=print('pwned')"), 14, "the default \"print('pwned')\""),
    (("FLAG: tl.constexpr = False", "FLAG=(lambda: 0)"), 14, "the default"),
    (("FLAG: tl.constexpr = False", "FLAG=exec"), 14, "the default 'exec' is not a literal or a constant"),
    (("FLAG: tl.constexpr = False", "FLAG=range"), 14, "the default 'range' is not a literal or a constant"),
    (("FLAG: tl.constexpr = False", "FLAG: \"__import__('os')\" = False"), 14, "the annotation"),
    (("FLAG: tl.constexpr = False", "*rest"), 14, "*args"),
]


def _with_body(statement: str) -> str:
    return KERNEL.replace("    # ESCAPE", "    " + statement)


def _edited(old_new) -> str:
    old, new = old_new
    assert old in KERNEL, old
    return KERNEL.replace(old, new, 1)


def test_the_kernel_written_in_the_releases_shape_is_admitted_and_extracts_whole():
    check_kernel_text(KERNEL, "k.py")
    text, functions = extract("import torch\n\ndef host():\n    return torch.zeros(1)\n\n" + KERNEL, "pkg/k.py",
                              ("kernel",))
    assert functions == ["_clamp", "kernel"] and "BLOCK =" not in text and "host" not in text
    check_kernel_text(text, "k.py")


@pytest.mark.parametrize("statement,said", BODY_ESCAPES, ids=[s for s, _ in BODY_ESCAPES])
def test_an_escape_in_a_kernel_body_is_refused_naming_file_and_line(statement, said):
    text = _with_body(statement)
    for run in (lambda: check_kernel_text(text, "cache/k.py"),
                lambda: extract(text, "pkg/mod.py", ("kernel",))):
        with pytest.raises(BadInput) as caught:
            run()
        message = str(caught.value)
        lines = range(BODY_LINE, BODY_LINE + statement.count("\n") + 1)
        assert "\n" not in message and said in message, message
        assert any(message.startswith(f"{where}:{line}: ") for where in ("cache/k.py", "pkg/mod.py")
                   for line in lines), message


@pytest.mark.parametrize("edit,line,said", MODULE_ESCAPES, ids=[e[1] for e, _, _ in MODULE_ESCAPES])
def test_an_escape_at_module_level_is_refused_naming_file_and_line(edit, line, said):
    text = _edited(edit)
    with pytest.raises(BadInput) as caught:
        check_kernel_text(text, "cache/k.py")
    message = str(caught.value)
    assert message.startswith(f"cache/k.py:{line}: ") and said in message and "\n" not in message, message


def test_a_kernel_reaching_an_escape_through_its_helper_is_refused_at_the_helper():
    text = KERNEL.replace("    return tl.where(x < n, x, n)", "    getattr(tl, '__builtins__')\n"
                                                               "    return tl.where(x < n, x, n)")
    with pytest.raises(BadInput, match=r"^pkg/mod\.py:10: calling 'getattr'"):
        extract(text, "pkg/mod.py", ("kernel",))


# -- end to end: a payload that would create a marker file never runs ---------------------------------------------
def _payload(marker: Path, how: str = "builtins") -> str:
    command = f"touch {marker}"
    if how == "getattr":
        return f"getattr(tl, '__builtins__')['__import__']('os').system({command!r})"
    return f"tl.__builtins__['__import__']('os').system({command!r})"


def _refused(proc, where: str, marker: Path) -> None:
    assert not marker.exists(), "the wheel's code ran"
    lines = proc.stderr.strip().splitlines()
    errors = [x for x in lines if x.startswith("kvfence: error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout + proc.stderr
    assert re.search(where, errors[0]) and "kvfence admits only Triton kernel text" in errors[0], errors[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.interpreter
@pytest.mark.parametrize("how", ["builtins", "getattr"])
def test_fuzz_of_a_hostile_draft_release_is_refused_and_runs_nothing(tmp_path, how):
    from test_upstream import FAKE_MODULE, MODULE, VERSION, kvfence, make_wheel

    marker = tmp_path / "pwned"
    text = FAKE_MODULE.replace("    n = s + 1\n", f"    n = s + 1\n    {_payload(marker, how)}\n")
    line = text.splitlines().index(f"    {_payload(marker, how)}") + 1
    wheels = tmp_path / "wheels"
    make_wheel(wheels, modules={MODULE: text})
    proc = kvfence("fuzz", "--kernel", f"sglang=={VERSION}", *FEW, "--out",
                   str(tmp_path / "out"), cache=tmp_path / "cache", wheel_dir=wheels)
    _refused(proc, rf"{MODULE}:{line}: ", marker)
    assert not (tmp_path / "cache" / f"sglang-{VERSION}").exists()


@pytest.mark.interpreter
def test_fuzz_of_a_hostile_contract_release_kernel_is_refused_and_runs_nothing(tmp_path):
    from test_upstream import kvfence, make_wheel

    marker = tmp_path / "pwned"
    ours = (ROOT / "kernels" / "page_table" / "trtllm_mha_page_table.py").read_text()
    text = ours.replace("    b = tl.program_id(0)\n", f"    b = tl.program_id(0)\n    {_payload(marker)}\n", 1)
    path = "sglang/kernels/ops/attention/trtllm_mha_page_table.py"
    make_wheel(tmp_path / "wheels", "9.5.1", {path: text})
    proc = kvfence("fuzz", "--contract", "trtllm-mha-page-table", "--kernel", "sglang==9.5.1", "--device", "cpu",
                   "--max-examples", "3", "--out", str(tmp_path / "out"), cache=tmp_path / "cache",
                   wheel_dir=tmp_path / "wheels")
    _refused(proc, rf"{path}:35: ", marker)


def _vllm_env(tmp_path: Path) -> dict:
    return dict(os.environ, TRITON_INTERPRET="1", KVFENCE_WHEEL_DIR=str(tmp_path / "wheels"),
                KVFENCE_CACHE=str(tmp_path / "cache"), KVFENCE_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
                HF_HUB_CACHE=str(tmp_path / "hf" / "hub"), PYTHONPATH=str(ROOT))


def _hostile_vllm(tmp_path: Path, version: str, where: str) -> Path:
    """A fake vLLM wheel (tests/test_slot_mapping.py's, from kvfence's own kernel text) whose kernel (``where`` is
    ``kernel``) or imported jit helper (``helper``) holds the payload; the marker it would create."""
    from test_slot_mapping import KERNEL as SLOT_KERNEL
    from test_slot_mapping import as_release, vllm_wheel

    marker = tmp_path / f"pwned-{where}"
    files = as_release(SLOT_KERNEL.read_text())
    if where == "kernel":
        module = "vllm/v1/worker/gpu/block_table.py"
        files[module] = files[module].replace("    b = tl.program_id(1)\n",
                                              f"    b = tl.program_id(1)\n    {_payload(marker)}\n", 1)
    else:
        module = "vllm/v1/worker/gpu/buffer_utils.py"
        files[module] = files[module].replace("    ptr = tl.load(ptr_to_ptr)\n",
                                              f"    {_payload(marker, 'getattr')}\n    ptr = tl.load(ptr_to_ptr)\n")
    assert _payload(marker, "getattr" if where == "helper" else "builtins") in files[module]
    (tmp_path / "wheels").mkdir(exist_ok=True)
    vllm_wheel(tmp_path / "wheels", version, files)
    return marker


@pytest.mark.interpreter
@pytest.mark.parametrize("where,line", [("kernel", r"block_table\.py:\d+"), ("helper", r"buffer_utils\.py:10")])
def test_fuzz_of_a_hostile_vllm_release_is_refused_and_runs_nothing(tmp_path, where, line):
    marker = _hostile_vllm(tmp_path, "9.4.1", where)
    proc = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--contract", "slot-mapping", "--kernel",
                           "vllm==9.4.1", *FEW, "--out", str(tmp_path / "out")],
                          cwd=tmp_path, env=_vllm_env(tmp_path), capture_output=True, text=True, timeout=600)
    _refused(proc, rf"{line}: ", marker)
    assert not (tmp_path / "cache" / "contracts" / "vllm-9.4.1" / "slot-mapping.py").exists()


@pytest.mark.interpreter
def test_affected_for_a_hostile_vllm_release_is_unknown_and_runs_nothing(tmp_path):
    marker = _hostile_vllm(tmp_path, "9.4.2", "kernel")
    command = ["vllm", "serve", "M", "--block-size", "16", "--max-model-len", "64"]
    proc = subprocess.run([sys.executable, "-m", "kvfence", "affected", "--device", "cpu", "--out",
                           str(tmp_path / "out"), "--json", "--kv-cache-group", "4:1", "9.4.2", *command],
                          cwd=tmp_path, env=_vllm_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert not marker.exists(), "the wheel's code ran"
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    verdict = next(v for v in json.loads(proc.stdout)["verdicts"] if v["contract"] == "slot-mapping")
    assert verdict["status"] == "unknown" and re.search(r"block_table\.py:\d+: '__builtins__' is a dunder",
                                                        verdict["condition"]), verdict


# -- a tampered cache entry is refused on read ----------------------------------------------------------------------
@pytest.mark.interpreter
def test_a_tampered_cache_entry_is_refused_on_read_and_runs_nothing(tmp_path):
    """Entries extracted from good wheels, then a payload put in a kernel body and the sha256 written to match
    (what anyone who can write the cache can do): the draft's entry and a contract's entry are both refused."""
    from test_upstream import FAKE_MODULE, MODULE, VERSION, kvfence, make_wheel

    marker = tmp_path / "pwned"
    ours = (ROOT / "kernels" / "page_table" / "trtllm_mha_page_table.py").read_text()
    wheels, cache = tmp_path / "wheels", tmp_path / "cache"
    make_wheel(wheels, VERSION, {MODULE: FAKE_MODULE, "sglang/kernels/ops/attention/trtllm_mha_page_table.py": ours})
    fuzz = {"draft": ["--kernel", f"sglang=={VERSION}"],
            "trtllm-mha-page-table": ["--contract", "trtllm-mha-page-table", "--kernel", f"sglang=={VERSION}"]}
    for name, argv in fuzz.items():
        ok = kvfence("fuzz", *argv, *FEW, "--out", str(tmp_path / name),
                     cache=cache, wheel_dir=wheels)
        assert ok.returncode in (0, 1), ok.stdout + ok.stderr  # extracted, admitted and run
    draft = cache / f"sglang-{VERSION}" / "spec_utils.py"
    contract = cache / "contracts" / f"sglang-{VERSION}" / "trtllm-mha-page-table.py"
    for module, hash_key, anchor in ((draft, "module_sha256", "    n = s + 1\n"),
                                     (contract, "sha256", "    b = tl.program_id(0)\n")):
        text = module.read_text().replace(anchor, anchor + f"    {_payload(marker)}\n", 1)
        module.write_text(text)
        manifest = module.parent / "manifest.json" if hash_key == "module_sha256" else module.with_suffix(".json")
        record = json.loads(manifest.read_text())
        record[hash_key] = hashlib.sha256(text.encode()).hexdigest()
        manifest.write_text(json.dumps(record))
    for name, argv in fuzz.items():
        module = draft if name == "draft" else contract
        line = module.read_text().splitlines().index(f"    {_payload(marker)}") + 1
        proc = kvfence("fuzz", *argv, *FEW, "--out", str(tmp_path / f"t-{name}"),
                       cache=cache, wheel_dir=wheels)
        _refused(proc, rf"is corrupt \({re.escape(str(module))}:{line}: '__builtins__' is a dunder", marker)


# -- every real release's kernels pass --------------------------------------------------------------------------------
WHEELS = os.environ.get("KVFENCE_TEST_WHEELS")


@pytest.mark.skipif(not WHEELS or not glob.glob(os.path.join(WHEELS or ".", "*.whl")),
                    reason="no release wheels ($KVFENCE_TEST_WHEELS)")
def test_every_real_release_kernel_is_admitted(tmp_path, monkeypatch):
    """Every kernel kvfence reads from each wheel in $KVFENCE_TEST_WHEELS, through every path that admits one: the
    draft entry (draft and window-rail), each contract's release kernel (its entry written and read back), and the
    bare extraction of each contract's function whatever its signature (the planted release mutants' text)."""
    from kvfence.contracts.draft import release_kernels
    from kvfence.engine.registry import get
    from kvfence.release import contract_kernels, knowledge, vllm_kernels
    from kvfence.release.upstream import Refused

    monkeypatch.setenv("KVFENCE_WHEEL_DIR", WHEELS)
    monkeypatch.setenv("KVFENCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVFENCE_OFFLINE", "1")
    admitted = []
    for wheel in sorted(Path(WHEELS).glob("*.whl")):
        project, version = wheel.name.split("-")[:2]
        if project == "sglang":
            try:
                admitted += [f"{version} {k}" for k in release_kernels.fetch(version).manifest["functions"]]
            except Refused:
                pass
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            for contract in knowledge.names():
                where = knowledge.shipped(contract).upstream
                paths = [p for p in (where.paths if where else ()) if p.startswith(f"{project}/") and p in names]
                source = zf.read(paths[0]).decode() if paths else ""
                if not re.search(rf"^def {where.function if where else '-'}\(", source, re.M):
                    continue
                if project == "sglang":  # vLLM's kernel needs its helper from another module: read below
                    text, _ = extract(source, paths[0], (where.function,))
                    check_kernel_text(text, paths[0])
                reader = vllm_kernels if project == "vllm" else contract_kernels
                try:
                    module, _ = reader.contract_kernel(get(contract), f"{project}=={version}")
                    module, _ = reader.contract_kernel(get(contract), f"{project}=={version}")  # read back
                except Refused:  # another signature: its text was admitted above
                    continue
                admitted.append(f"{version} {contract}")
    releases = {w.name.split("-")[1] for w in Path(WHEELS).glob("*.whl")}
    assert releases == {a.split()[0] for a in admitted}, (sorted(releases), admitted)  # each release gave kernels
