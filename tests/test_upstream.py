"""SGLang's kernels from its wheel (kvfence.contracts.draft.release_kernels): ``upstream fetch`` and ``--kernel
sglang==VERSION``.

The unit tests build small fake wheels in tmp_path: a zip with a dist-info and an ``sglang/.../spec_utils.py``
holding a classic-ABI kernel written here from docs/contract.md (no SGLang code), plus module-level code that would
fail if kvfence ever imported the module (it must only extract the jit functions). Every subprocess runs
with ``KVFENCE_OFFLINE=1`` so nothing here touches the network; the ``network``-marked test at the end
fetches a real release from PyPI (``--kvfence-network`` or ``KVFENCE_NETWORK=1``).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvfence.contracts.draft import release_kernels
from kvfence.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.0.1"
MODULE = "sglang/srt/speculative/spec_utils.py"

# A classic-ABI kernel written from docs/contract.md for these tests, with a jit helper and a constexpr constant
# (both must be extracted), and module-level code that needs SGLang and torch (must not be).
FAKE_MODULE = '''\
from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang.srt.utils import is_cuda

COPY_BLOCK = tl.constexpr(64)
_ON_CUDA = is_cuda()  # runs only if the module is imported: kvfence must never do that


def host_helper(x):
    return torch.zeros(x)


@triton.jit
def _draft_start(L, k, num_steps, topk, page_size: tl.constexpr):
    # Paged layout (docs/contract.md); with page_size == 1 it reduces to the flat L + k*num_steps.
    last = L % page_size
    pages = (last + num_steps + page_size - 1) // page_size
    return tl.where(topk == 1, L + k * num_steps, L - last + k * pages * page_size + last)


@triton.jit
def generate_draft_decode_kv_indices(
    req_pool_indices, req_to_token, paged_kernel_lens, kv_indices, kv_indptr, positions,
    pool_len,
    kv_indices_stride,
    kv_indptr_stride,
    bs_upper: tl.constexpr,
    iter_upper: tl.constexpr,
    num_tokens_upper: tl.constexpr,
    page_size: tl.constexpr,
):
    s = tl.program_id(0)
    b = tl.program_id(1)
    k = tl.program_id(2)
    num_steps = tl.num_programs(0)
    num_seqs = tl.num_programs(1)
    topk = tl.num_programs(2)
    n = s + 1
    offs_b = tl.arange(0, bs_upper)
    before = tl.sum(tl.load(paged_kernel_lens + offs_b, mask=offs_b < b, other=0))
    L = tl.load(paged_kernel_lens + b)
    row = kv_indices + s * kv_indices_stride + topk * before + b * n * topk + k * (L + n)
    src = req_to_token + tl.load(req_pool_indices + b) * pool_len
    for start in range(0, L, COPY_BLOCK):
        t = start + tl.arange(0, COPY_BLOCK)
        tl.store(row + t, tl.load(src + t, mask=t < L), mask=t < L)
    j = tl.arange(0, iter_upper)
    e = _draft_start(L, k, num_steps, topk, page_size)
    tl.store(row + L + j, tl.load(src + e + j, mask=j < n), mask=j < n)
    z = b * topk + k
    z = tl.where(z == 0, num_seqs * topk, z)
    p = tl.arange(0, num_tokens_upper)
    base = tl.sum(tl.load(positions + p, mask=p < z, other=0))
    tl.store(kv_indptr + s * kv_indptr_stride + z, (base + z * n).to(kv_indptr.dtype.element_ty))
'''

# Edits of FAKE_MODULE, each a (old, new) list: another ABI, a bug, or a signature no ABI fits.
ROW_STRIDE = [("    pool_len,\n", "    row_stride,\n"), ("* pool_len", "* row_stride")]
# The 0.4.3-0.4.7 ABI: num_seqs and topk as constexprs before pool_len, no page_size (flat layout only).
NUM_SEQS_TOPK = [("    pool_len,\n", "    num_seqs: tl.constexpr,\n    topk: tl.constexpr,\n    pool_len,\n"),
                 ("    page_size: tl.constexpr,\n):", "):"), ("    num_seqs = tl.num_programs(1)\n", ""),
                 ("    topk = tl.num_programs(2)\n", ""), ("_draft_start(L, k, num_steps, topk, page_size)",
                                                          "_draft_start(L, k, num_steps, topk, 1)")]
INCLUSIVE_PREFIX_SUM = [("mask=offs_b < b, other=0", "mask=offs_b <= b, other=0")]
NO_PAGE_SIZE = [("    page_size: tl.constexpr,\n):", "):")]
EXTRA_REQUIRED = [("    page_size: tl.constexpr,\n):", "    page_size: tl.constexpr,\n    scale,\n):")]
WINDOW_DEFAULT_ON = [("    page_size: tl.constexpr,\n):", "    page_size: tl.constexpr,\n"
                                                         "    window_size: tl.constexpr = 64,\n):")]
NEUTRAL_DEFAULTS = [("    page_size: tl.constexpr,\n):", "    page_size: tl.constexpr,\n"
                                                          "    window_size: tl.constexpr = 0,\n    v2p=None,\n"
                                                          "    TRANSLATE: tl.constexpr = False,\n):")]
CALLS_HOST_CODE = [("    n = s + 1\n", "    n = s + 1\n    host_helper(n)\n")]
READS_SGLANG = [("    n = s + 1\n", "    n = s + 1 + is_cuda\n")]
CALLS_DANGEROUS_BUILTIN = [("    n = s + 1\n", "    n = s + 1\n    __import__('os').system('echo pwned')\n")]
CONSTANT_RUNS_CODE = [("COPY_BLOCK = tl.constexpr(64)", "COPY_BLOCK = tl.constexpr(len(open('/etc/passwd').read()))")]
DEFAULT_RUNS_CODE = [("    page_size: tl.constexpr,\n):", "    page_size: tl.constexpr,\n    BLOCK=print('x'),\n):")]
WINDOW_RAIL = '''

@triton.jit
def generate_draft_decode_window_kv_indices(
    req_pool_indices, req_to_token, paged_kernel_lens, window_kv_indices, window_kv_indptr, positions,
    row_stride, kv_indices_stride, kv_indptr_stride, bs_upper: tl.constexpr, iter_upper: tl.constexpr,
    num_tokens_upper: tl.constexpr, page_size: tl.constexpr, window: tl.constexpr,
):
    tl.store(window_kv_indptr + tl.program_id(0), window)
'''


def edited(edits) -> str:
    text = FAKE_MODULE
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return text


def make_wheel(folder: Path, version: str = VERSION, modules=None, *, tamper: bool = False) -> Path:
    """A minimal sglang wheel: ``modules`` {path: text}, a dist-info with METADATA and a hashed RECORD."""
    modules = {MODULE: FAKE_MODULE} if modules is None else modules
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"sglang-{version}-py3-none-any.whl"
    info = f"sglang-{version}.dist-info"
    files = dict(modules)
    files["sglang/__init__.py"] = "raise ImportError('kvfence must not import sglang')\n"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: kvfence-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    if tamper:  # contents changed after RECORD was written
        files[MODULE] = files[MODULE].replace("n = s + 1", "n = s + 2")
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def kvfence(*args, cache: Path, wheel_dir=None, **env_extra):
    env = dict(os.environ, PYTHONPATH=str(ROOT), KVFENCE_CACHE=str(cache), KVFENCE_OFFLINE="1")
    env.update(env_extra)
    env.pop("KVFENCE_WHEEL_DIR", None)
    if wheel_dir is not None:
        env["KVFENCE_WHEEL_DIR"] = str(wheel_dir)
    return subprocess.run([sys.executable, "-m", "kvfence", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def one_line_exit_2(proc, *needles):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # One error line; the only other stderr lines allowed are kvfence's own notices (e.g. "downloading").
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("kvfence: error: ")]
    assert len(errors) == 1 and all(line.startswith("kvfence: ") for line in lines), proc.stderr
    assert all(n in errors[0] for n in needles), errors[0]


def fuzz(cache, tmp_path, spec, *extra, wheel_dir=None):
    return kvfence("fuzz", "--kernel", spec, "--device", "cpu", "--max-examples", "20", "--seed", "1", "--quiet",
                   "--shrink-seconds", "5", "--out", str(tmp_path / "out"), *extra, cache=cache, wheel_dir=wheel_dir)


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "cache"


# -- fetch and extraction ------------------------------------------------------------------------------
def test_fetch_extracts_only_the_jit_code_and_writes_a_manifest(tmp_path, cache):
    wheel = make_wheel(tmp_path / "wheels")
    proc = kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), cache=cache)
    assert proc.returncode == 0, proc.stderr
    module = Path(proc.stdout.strip())
    assert module == cache / f"sglang-{VERSION}" / "spec_utils.py"
    assert f"{MODULE}: generate_draft_decode_kv_indices (classic ABI)" in proc.stderr
    text = module.read_text()
    tree = ast.parse(text)
    defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert defs == ["_draft_start", "generate_draft_decode_kv_indices"]
    assert "COPY_BLOCK = tl.constexpr(64)" in text
    for absent in ("torch", "sglang.srt", "is_cuda", "host_helper", "_ON_CUDA"):
        assert absent not in text, absent
    manifest = json.loads((module.parent / "manifest.json").read_text())
    assert manifest["source_path"] == MODULE
    assert manifest["wheel_sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert manifest["abi"]["generate_draft_decode_kv_indices"]["name"] == "classic"
    assert manifest["functions"] == defs


@pytest.mark.parametrize("edits,abi", [([], "classic"), (ROW_STRIDE, "row-stride"), (NUM_SEQS_TOPK, "num-seqs-topk"),
                                       (NEUTRAL_DEFAULTS, "classic")])
def test_abi_is_detected_from_the_signature(edits, abi):
    fn = next(n for n in ast.parse(edited(edits)).body if getattr(n, "name", "") == release_kernels.DRAFT_KERNEL)
    detected = release_kernels.detect_abi(fn)
    assert (detected.name, detected.rail) == (abi, False)


@pytest.mark.parametrize("edits,needles", [
    (NO_PAGE_SIZE, ("12 required parameters", "missing page_size")),
    (EXTRA_REQUIRED, ("extra required parameter(s) scale",)),
    (WINDOW_DEFAULT_ON, ("window_size defaults to 64", "needs 0")),
    ([("    pool_len,\n", "    pool_stride,\n"), ("* pool_len", "* pool_stride")],
     ("required parameter 7 is 'pool_stride'", "'pool_len'")),
])
def test_a_kernel_no_abi_fits_is_one_line_exit_2(tmp_path, cache, edits, needles):
    wheel = make_wheel(tmp_path / "wheels", modules={MODULE: edited(edits)})
    one_line_exit_2(kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), cache=cache),
                    f"sglang=={VERSION}", *needles)
    assert not (cache / f"sglang-{VERSION}").exists()


@pytest.mark.parametrize("edits,needles", [(CALLS_HOST_CODE, ("host_helper", "not a @triton.jit function")),
                                           (READS_SGLANG, ("is_cuda", "imported by 'from sglang.srt.utils")),
                                           (CALLS_DANGEROUS_BUILTIN, (f"{MODULE}:43: '__import__' is a dunder",)),
                                           (CONSTANT_RUNS_CODE, (f"{MODULE}:9: a constant's value", "len(open(")),
                                           (DEFAULT_RUNS_CODE, (f"{MODULE}:35: the default \"print('x')\"",))])
def test_kernels_reaching_outside_jit_code_are_refused(tmp_path, cache, edits, needles):
    wheel = make_wheel(tmp_path / "wheels", modules={MODULE: edited(edits)})
    one_line_exit_2(kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), cache=cache), *needles)


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_the_window_rail_kernel_is_extracted_and_needs_its_contract(tmp_path, cache):
    wheel = make_wheel(tmp_path / "wheels", modules={MODULE: FAKE_MODULE + WINDOW_RAIL})
    assert kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), cache=cache).returncode == 0
    manifest = json.loads((cache / f"sglang-{VERSION}" / "manifest.json").read_text())
    rail = manifest["abi"][release_kernels.WINDOW_KERNEL]
    assert (rail["name"], rail["rail"], rail["required"][-1]) == ("row-stride", True, "window")
    # Fuzzed under the draft contract (the default) it is refused in one line: it is the rail.
    one_line_exit_2(fuzz(cache, tmp_path, f"sglang=={VERSION}:{release_kernels.WINDOW_KERNEL}"),
                    "implements the window-rail contract, not draft")


# -- fuzzing the extracted kernel ----------------------------------------------------------------------
@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_extracted_classic_kernel_fuzzes_clean_from_the_cache(tmp_path, cache):
    # Fetched once from a wheel folder, then fuzzed with the network off: the cache answers.
    wheels = tmp_path / "wheels"
    make_wheel(wheels)
    assert kvfence("upstream", "fetch", VERSION, cache=cache, wheel_dir=wheels).returncode == 0
    proc = fuzz(cache, tmp_path, f"sglang=={VERSION}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no findings" in proc.stdout


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_extracted_buggy_kernel_is_caught(tmp_path, cache):
    """The pair of the test above: the same fake release with an inclusive prefix sum must fail."""
    wheels = tmp_path / "wheels"
    make_wheel(wheels, modules={MODULE: edited(INCLUSIVE_PREFIX_SUM)})
    proc = fuzz(cache, tmp_path, f"sglang=={VERSION}", wheel_dir=wheels)  # fetched on first use
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "VALUE_MISMATCH" in proc.stdout or "STRAY_WRITE" in proc.stdout


@pytest.mark.interpreter  # runs --device cpu in a subprocess
@pytest.mark.parametrize("edits,extra", [(ROW_STRIDE, ()), (NUM_SEQS_TOPK, ("--page-size", "1"))])
def test_other_abis_launch_with_their_own_arguments(tmp_path, cache, edits, extra):
    # A wrong argument order or value (num_seqs, topk, row_stride) would corrupt offsets and be caught.
    wheels = tmp_path / "wheels"
    make_wheel(wheels, modules={MODULE: edited(edits)})
    proc = fuzz(cache, tmp_path, f"sglang=={VERSION}", *extra, wheel_dir=wheels)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- bad input -----------------------------------------------------------------------------------------
def test_release_without_the_kernel_is_one_line_exit_2(tmp_path, cache):
    wheel = make_wheel(tmp_path / "wheels", modules={"sglang/srt/other.py": "x = 1\n"})
    one_line_exit_2(kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), cache=cache),
                    f"sglang=={VERSION} has no generate_draft_decode_kv_indices")


@pytest.mark.parametrize("make,needles", [
    (lambda p: p.write_bytes(b"PK\x03\x04 not really a zip"), ("is corrupt",)),
    (lambda p: make_wheel(p.parent, tamper=True), ("is corrupt", "does not match its RECORD hash")),
    (lambda p: make_wheel(p.parent, version="0.0.2").rename(p), ("not sglang 0.0.1",)),
])
def test_corrupt_wheel_is_one_line_exit_2(tmp_path, cache, make, needles):
    path = tmp_path / "wheels" / f"sglang-{VERSION}-py3-none-any.whl"
    path.parent.mkdir(parents=True)
    make(path)
    one_line_exit_2(kvfence("upstream", "fetch", VERSION, "--wheel", str(path), cache=cache), *needles)


@pytest.mark.interpreter  # runs --device cpu in a subprocess
@pytest.mark.parametrize("damage,needles", [
    (lambda d: (d / "spec_utils.py").write_text("import os\nos.system('echo pwned')\n"),
     ("does not match its sha256",)),
    (lambda d: (d / "manifest.json").write_text("{truncated"), ("JSONDecodeError",)),
    (lambda d: (d / "spec_utils.py").unlink(), ("No such file",)),
])
def test_corrupt_cache_entry_is_one_line_exit_2_and_refresh_repairs_it(tmp_path, cache, damage, needles):
    wheel = make_wheel(tmp_path / "wheels")
    assert kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), cache=cache).returncode == 0
    damage(cache / f"sglang-{VERSION}")
    proc = fuzz(cache, tmp_path, f"sglang=={VERSION}")
    one_line_exit_2(proc, "cache entry", "is corrupt", *needles)
    assert "pwned" not in proc.stdout  # the damaged module was never imported
    assert kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), "--refresh", cache=cache).returncode == 0
    assert kvfence("upstream", "fetch", VERSION, cache=cache).returncode == 0


@pytest.mark.parametrize("added,needle", [
    ("print('side effect')", "at module level is not kernel code"),
    # A constant no kernel reads is not checked by extracting again: its value must be checked on its own.
    ("Z = __import__('os').system('echo pwned')", "'__import__' is a dunder name"),
    ("Z = tl.constexpr(open('/tmp/kvfence-pwned', 'w').write('x'))", "is not numbers, constants"),
    ("Z: int = __import__('os').getpid()", "'__import__' is a dunder name"),
    ("Z: __import__('os').getpid() = 1", "'__import__' is a dunder name"),
    ("Z.attr = 1", "assigning to 'Z.attr'"),
])
def test_hand_edited_module_with_matching_hash_is_still_refused(tmp_path, cache, monkeypatch, added, needle):
    # Someone re-hashed a module that now runs code at import: the structural check refuses it.
    wheel = make_wheel(tmp_path / "wheels")
    assert kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), cache=cache).returncode == 0
    folder = cache / f"sglang-{VERSION}"
    module = folder / "spec_utils.py"
    text = module.read_text() + f"\n{added}\n"
    module.write_text(text)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["module_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("KVFENCE_CACHE", str(cache))
    with pytest.raises(BadInput, match=f"is corrupt.*({needle})"):
        release_kernels.load_entry(VERSION)


@pytest.mark.interpreter  # runs --device cpu in a subprocess
@pytest.mark.parametrize("argv,needles", [
    (["upstream", "fetch", "latest"], ("'latest' is not an sglang release version",)),
    (["upstream", "fetch", "0.5.23; rm -rf /"], ("is not an sglang release version",)),
    (["upstream", "fetch", "0.0.9"], ("not in the cache", "network is off")),
    (["upstream", "fetch", "0.0.1", "--wheel", "/nonexistent.whl"], ("--wheel /nonexistent.whl: no such file",)),
    (["fuzz", "--device", "cpu", "--kernel", "sglang==0.0.9"], ("not in the cache", "KVFENCE_OFFLINE=1")),
    (["fuzz", "--device", "cpu", "--kernel", "sglang==0.0.1:launch"], ("'launch' is not one of the extracted",)),
    (["upstream"], ("required",)),
])
def test_bad_upstream_input_is_one_line_exit_2(cache, argv, needles):
    one_line_exit_2(kvfence(*argv, cache=cache), *needles)


def test_unknown_version_in_a_wheel_folder_is_one_line_exit_2(tmp_path, cache):
    wheels = tmp_path / "wheels"
    make_wheel(wheels)
    one_line_exit_2(kvfence("upstream", "fetch", "9.9.9", cache=cache, wheel_dir=wheels),
                    "no sglang-9.9.9-*.whl in KVFENCE_WHEEL_DIR")


def test_unreachable_index_is_one_line_exit_2(cache):
    # pip against a closed local port, its config ignored: what fetch sees with no network.
    proc = kvfence("upstream", "fetch", "0.5.23", cache=cache, KVFENCE_OFFLINE="0", PIP_CONFIG_FILE=os.devnull,
                   PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_EXTRA_INDEX_URL="", PIP_FIND_LINKS="",
                   PIP_NO_INDEX="0")
    one_line_exit_2(proc, "sglang==0.5.23", "not reachable")


# -- the real thing ------------------------------------------------------------------------------------
@pytest.mark.network
def test_real_release_from_pypi_is_extracted_and_fuzzes_clean(tmp_path, cache):
    proc = kvfence("upstream", "fetch", "0.5.23", cache=cache, KVFENCE_OFFLINE="0")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((Path(proc.stdout.strip()).parent / "manifest.json").read_text())
    assert manifest["source_path"] == "sglang/kernels/ops/speculative/cache_locs.py"
    assert {k: v["name"] for k, v in manifest["abi"].items()} == {release_kernels.DRAFT_KERNEL: "row-stride",
                                                                    release_kernels.WINDOW_KERNEL: "row-stride"}
    proc = fuzz(cache, tmp_path, "sglang==0.5.23")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    one_line_exit_2(kvfence("upstream", "fetch", "9.9.9", cache=cache, KVFENCE_OFFLINE="0"),
                    "sglang==9.9.9: no such release")


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_an_extracted_rail_kernel_is_fuzzed_under_the_rail_contract(tmp_path, cache):
    # The fake rail above writes only garbage into its indptr: under --contract window-rail it reaches the
    # launch with its window (the ABI's 14th argument) and the verdict catches it (exit 1, not 2).
    wheel = make_wheel(tmp_path / "wheels", modules={MODULE: FAKE_MODULE + WINDOW_RAIL})
    assert kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), cache=cache).returncode == 0
    proc = fuzz(cache, tmp_path, f"sglang=={VERSION}:{release_kernels.WINDOW_KERNEL}", "--contract", "window-rail",
                "--window", "3", "--sizing", "window-fixed")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "window_kv_indptr" in proc.stdout
