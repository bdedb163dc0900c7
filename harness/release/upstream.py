"""SGLang's own kernels, taken from its PyPI wheel: ``--kernel sglang==VERSION[:attr]``.

``fetch(version)`` gets the ``sglang`` wheel of one release (``pip download --no-deps``: no install, no
SGLang import, no GPU dependency), finds the module that defines ``generate_draft_decode_kv_indices`` (it
moved between releases), and writes a standalone module into the cache folder (``$KVFENCE_CACHE`` or
``~/.cache/kvfence/``), ``sglang-VERSION/<module>.py``, next to a ``manifest.json`` and ``shipped.json`` (how
the release's backends size the kernel's buffer, read as data by ``kvfence.release.shipped``). The module holds only
what the kernels need, extracted with ``ast``: the kernel, ``generate_draft_decode_window_kv_indices`` when
the release has it, the ``@triton.jit`` helpers they call, and the module-level constants they read, plus
``import triton`` / ``import triton.language as tl``.

The wheel is data. kvfence never imports SGLang and never runs anything from the wheel except those jit
functions, and only when asked to fuzz them. Extraction refuses any name it cannot resolve to a jit
function, a literal constant or Triton itself.

Each kernel's ABI is read from its signature (``detect_abi``); a release whose kernel fits none of
``ABIS`` is ``BadInput`` with one line naming what differs. Such a release, and one without the kernel, is
``Refused`` and remembered in the cache (``sglang-VERSION.refused.json``: data, the reason and the wheel's
sha256), so a later offline run (the release matrix on a host without network) gives the same reason. ``KVFENCE_OFFLINE=1`` (or ``--offline``)
forbids the network: only the cache and local wheels are used. ``KVFENCE_WHEEL_DIR`` (or ``--wheel``)
supplies wheels from disk instead of pip.
"""

from __future__ import annotations

import ast
import base64
import builtins
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from kvfence.errors import BadInput, require

#: ``--kernel sglang==VERSION`` or ``sglang==VERSION:attr``.
SPEC_PREFIX = "sglang=="
DRAFT_KERNEL = "generate_draft_decode_kv_indices"
WINDOW_KERNEL = "generate_draft_decode_window_kv_indices"
#: The kernels extracted from a release (the first is required, the second optional).
KERNELS = (DRAFT_KERNEL, WINDOW_KERNEL)
#: Bumped when the cache layout changes; an entry of another format is refetched, never trusted.
CACHE_FORMAT = 3  # 2: the shipped-sizing record (kvfence.release.shipped) beside the kernels; 3: its replay notes
MANIFEST = "manifest.json"

# A release version as PyPI spells sglang's (no local part, no epoch): also keeps pip's argv clean.
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")

# -- ABIs ---------------------------------------------------------------------------------------------
_HEAD = ("req_pool_indices", "req_to_token", "paged_kernel_lens", "kv_indices", "kv_indptr", "positions")
_TAIL = ("kv_indices_stride", "kv_indptr_stride", "bs_upper", "iter_upper", "num_tokens_upper", "page_size")
#: Required parameters of each known ABI, in order. ``classic`` is the classic ABI of docs/contract.md;
#: ``row-stride`` its newer form (0.5.22+: a runtime req_to_token row stride where classic has ``pool_len``);
#: ``num-seqs-topk`` is an older ABI (0.4.3-0.4.7) that passed the grid's ``num_seqs`` and ``topk`` as
#: constexprs and had no ``page_size``.
ABIS: Dict[str, Tuple[str, ...]] = {
    "classic": _HEAD + ("pool_len",) + _TAIL,
    "row-stride": _HEAD + ("row_stride",) + _TAIL,
    "num-seqs-topk": _HEAD + ("num_seqs", "topk", "pool_len") + _TAIL[:-1],
}
#: Required parameters the window-rail kernel adds after an ABI's own (docs/contract.md).
_RAIL_EXTRA = ("window",)
#: The rail kernel names its outputs after the rail; same place, same meaning.
_ALIASES = {"window_kv_indices": "kv_indices", "window_kv_indptr": "kv_indptr"}
#: Trailing parameters with defaults that are known, and the default under which the kernel does exactly
#: what the classic contract says (another default would change the contract, so it is refused).
NEUTRAL_DEFAULTS = {"window_size": 0, "sink_size": 0, "NUM_STEPS": 0, "ENTRY_PAGE_SIZE": 1, "v2p": None,
                    "TRANSLATE": False}


#: Why a release cannot be tested, read from its wheel (``Refused.status``).
NO_KERNEL = "no-kernel"
ABI_UNSUPPORTED = "abi-unsupported"
REFUSALS = (NO_KERNEL, ABI_UNSUPPORTED)


class Refused(BadInput):
    """A release kvfence cannot test for a reason inside its wheel: it has no draft kernel (``NO_KERNEL``)
    or its kernel fits no known ABI (``ABI_UNSUPPORTED``). ``fetch`` remembers it in the cache
    (``sglang-VERSION.refused.json``), so an offline run (the release matrix on a GPU host) gives the same
    reason instead of "not in the cache"."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Abi:
    """How to launch one extracted kernel: ABI name, contract and its parameters (from its signature)."""

    name: str  # a key of ABIS
    contract: str  # "draft" (the draft kernel) or "window-rail" (window-rail kernel)
    required: Tuple[str, ...]  # required parameters, in order
    optional: Tuple[str, ...]  # parameters with defaults (left at their defaults)

    def to_dict(self) -> dict:
        return {"name": self.name, "contract": self.contract, "required": list(self.required),
                "optional": list(self.optional)}

    @classmethod
    def from_dict(cls, d: dict) -> "Abi":
        abi = cls(d["name"], d["contract"], tuple(d["required"]), tuple(d["optional"]))
        require(abi.name in ABIS and abi.contract in ("draft", "window-rail"), f"unknown ABI {d!r}")
        return abi


def detect_abi(fn: ast.FunctionDef) -> Abi:
    """The ABI of a kernel's definition; ``BadInput`` naming the first difference from every known ABI."""
    where = fn.name
    a = fn.args
    require(not (a.vararg or a.kwarg or a.posonlyargs or a.kwonlyargs),
            f"{where} has *args, **kwargs, positional-only or keyword-only parameters; no known ABI does")
    params = [p.arg for p in a.args]
    n_required = len(params) - len(a.defaults)
    required, optional = tuple(params[:n_required]), tuple(params[n_required:])
    rail = fn.name == WINDOW_KERNEL
    extra = _RAIL_EXTRA if rail else ()
    canonical = tuple(_ALIASES.get(p, p) for p in required)
    name = next((n for n, ps in ABIS.items() if canonical == ps + extra), None)
    if name is None:
        raise BadInput(f"{where}: {_abi_difference(canonical, extra)}")
    for param, default in zip(optional, a.defaults):
        if param in NEUTRAL_DEFAULTS:
            value = _literal(default)
            require(value == NEUTRAL_DEFAULTS[param] and type(value) is type(NEUTRAL_DEFAULTS[param]),
                    f"{where}: {param} defaults to {ast.unparse(default)}; the {name} ABI needs "
                    f"{NEUTRAL_DEFAULTS[param]!r} (its contract at the defaults)")
    return Abi(name, "window-rail" if rail else "draft", required, optional)


def _abi_difference(got: Tuple[str, ...], extra: Tuple[str, ...]) -> str:
    """One line: how ``got`` differs from the nearest known ABI (the one sharing the longest head)."""

    def shared(ps):
        return next((i for i, (x, y) in enumerate(zip(got, ps)) if x != y), min(len(got), len(ps)))

    name, ps = max(((n, p + extra) for n, p in ABIS.items()), key=lambda item: shared(item[1]))
    i = shared(ps)
    if i < len(got) and i < len(ps):
        what = f"required parameter {i + 1} is {got[i]!r} where the {name} ABI has {ps[i]!r}"
    elif len(got) > len(ps):
        what = f"extra required parameter(s) {', '.join(got[len(ps):])} after the {name} ABI's {len(ps)}"
    else:
        what = f"{len(got)} required parameters, missing {', '.join(ps[len(got):])} of the {name} ABI"
    return f"{what}; no known ABI ({', '.join(ABIS)}) fits: {', '.join(got)}"


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


# -- cache --------------------------------------------------------------------------------------------
def cache_root() -> Path:
    """``$KVFENCE_CACHE``, else ``~/.cache/kvfence``."""
    env = os.environ.get("KVFENCE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvfence"


def offline_by_env() -> bool:
    return os.environ.get("KVFENCE_OFFLINE", "").strip().lower() in ("1", "true", "yes")


def check_version(version: str) -> str:
    require(isinstance(version, str) and _VERSION.match(version) is not None,
            f"{version!r} is not an sglang release version (e.g. 0.5.23 or 0.5.15.post1)")
    return version


@dataclass(frozen=True)
class Entry:
    """One release in the cache: its extracted module and what the manifest says about it."""

    version: str
    folder: Path
    module_path: Path
    manifest: dict

    @property
    def abis(self) -> Dict[str, Abi]:
        return {name: Abi.from_dict(d) for name, d in self.manifest["abi"].items()}


def entry_folder(version: str) -> Path:
    return cache_root() / f"sglang-{version}"


#: Times ``load_entry`` reads an entry again that another process swapped while it read.
SWAP_RETRIES = 3


def load_entry(version: str) -> Optional[Entry]:
    """The cached entry of ``version``, None if there is none; ``BadInput`` if it is corrupt."""
    folder = entry_folder(version)
    why: object = "it changed each time it was read"
    for _ in range(SWAP_RETRIES + 1):
        if not folder.exists():
            return None
        try:
            _check_trusted(folder)  # its refusal (who may write the cache) is its own message, not "corrupt"
        except FileNotFoundError:
            continue  # swapped while this process looked: read it again
        try:
            return _validate_entry(version, folder)
        except FileNotFoundError as exc:
            # Another process swapped the entry while this one read it (_extract_to_cache moves the old
            # folder aside, then the new one in): read it again rather than call a good entry corrupt.
            why = f"{type(exc).__name__}: {exc}"
        except (BadInput, OSError, ValueError, KeyError, TypeError, AttributeError, SyntaxError) as exc:
            why = exc if isinstance(exc, BadInput) else f"{type(exc).__name__}: {exc}"
            break
    raise BadInput(f"cache entry {folder} is corrupt ({why}); delete it or run "
                   f"`kvfence upstream fetch {version} --refresh`")


def _check_trusted(folder: Path) -> None:
    """The cache holds code kvfence imports, and its sha256 catches accidents, not tampering (anyone who
    can write the file can rewrite the hash): the cache root, the entry and its files must belong to
    this user and be writable by no one else (docs/security.md, "The upstream cache is trusted code")."""
    for path in (folder.parent, folder, *sorted(folder.iterdir())):
        try:
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):  # a link's own mode is always 777 and means nothing: its owner and
                require(st.st_uid == os.getuid(),  # where it points count (e.g. ~/.cache -> /data/cache)
                        f"cache entry {folder}: {path} is a link not owned by you; the cache holds code kvfence "
                        "runs: fix it (chown) or delete it and fetch again")
                st = path.stat()
        except OSError:
            continue  # gone, dangling or unreadable: the validation below says so
        owner_ok = st.st_uid == os.getuid()
        require(owner_ok and not st.st_mode & 0o022,
                f"cache entry {folder}: {path} is {'not owned by you' if not owner_ok else 'writable by others'} "
                f"(mode {st.st_mode & 0o777:o}); the cache holds code kvfence runs, so it must be writable only by "
                "its user: fix it (chmod go-w, chown) or delete it and fetch again")


def _validate_entry(version: str, folder: Path) -> Entry:
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    require(isinstance(manifest, dict), "manifest is not a JSON object")
    require(manifest.get("format") == CACHE_FORMAT, f"manifest format {manifest.get('format')!r}, "
            f"expected {CACHE_FORMAT}")
    require(manifest.get("version") == version, f"manifest is for version {manifest.get('version')!r}")
    module = folder / manifest["module_file"]
    require(module.parent == folder and module.suffix == ".py", f"bad module_file {manifest['module_file']!r}")
    text = module.read_text(encoding="utf-8")
    require(_sha256(text.encode()) == manifest["module_sha256"], f"{module.name} does not match its sha256")
    # The file will be imported: it must hold only what extraction writes (imports of triton, constants,
    # jit functions), whatever happened to it on disk.
    _check_extracted(ast.parse(text), set(manifest["functions"]))
    # Extracting the cached module again must give itself: every check of extraction holds for it too.
    require(extract(text, module.name)[1] == manifest["functions"], "module does not extract to its manifest")
    abi = manifest.get("abi")
    require(isinstance(abi, dict) and all(isinstance(d, dict) and all(
        isinstance(d.get(k), list) and all(isinstance(x, str) for x in d[k]) for k in ("required", "optional"))
        for d in abi.values()), "manifest abi must map each kernel to an object with required and optional lists")
    entry = Entry(version, folder, module, manifest)
    require(DRAFT_KERNEL in entry.abis, f"manifest has no ABI for {DRAFT_KERNEL}")
    return entry


def _check_extracted(tree: ast.Module, functions: set) -> None:
    for node in tree.body:
        if isinstance(node, ast.Import):
            require(all(a.name in ("triton", "triton.language") for a in node.names), "unexpected import")
        elif isinstance(node, ast.ImportFrom):
            require(node.module == "__future__" or (node.module or "").split(".")[0] == "triton",
                    f"unexpected import from {node.module}")
        elif isinstance(node, ast.FunctionDef):
            require(node.name in functions and _is_jit(node), f"unexpected function {node.name}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            # A top-level constant runs when the module is imported: its value (and annotation) may read
            # only literals, Triton and other constants, as extraction requires of every constant it takes
            # (a constant no kernel reads is not checked by extracting again, so it is checked here).
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            require(all(isinstance(t, ast.Name) for t in targets), f"unexpected assignment at line {node.lineno}")
            require(node.value is not None, f"unexpected annotation without a value at line {node.lineno}")
            _check_safe_expr(node.value, f"constant at line {node.lineno}")
            if isinstance(node, ast.AnnAssign):
                _check_safe_expr(node.annotation, f"annotation at line {node.lineno}")
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            raise BadInput(f"unexpected statement at line {node.lineno}")
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    require(functions == defined, f"functions {sorted(defined)} != manifest {sorted(functions)}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- fetching -----------------------------------------------------------------------------------------
def fetch(version: str, *, wheel: Optional[str] = None, offline: Optional[bool] = None,
          refresh: bool = False, announce=None) -> Entry:
    """The cache entry of ``version``: from the cache, else extracted from a wheel (downloaded if allowed).

    ``wheel``: a wheel file to use instead of pip; ``offline`` (default ``KVFENCE_OFFLINE``) forbids pip.
    ``refresh`` re-extracts even over a valid (or corrupt) entry.
    """
    check_version(version)
    offline = offline_by_env() if offline is None else offline
    refresh = refresh or _other_format(version)
    if not refresh:
        entry = load_entry(version)
        if entry is not None:
            return entry
        refused = load_refusal(version)
        if refused is not None:
            raise refused
    with tempfile.TemporaryDirectory(prefix="kvfence-wheel-") as tmp:
        path = _find_wheel(version, wheel, offline, Path(tmp), announce)
        try:
            return _extract_to_cache(version, path)
        except Refused as exc:
            _remember_refusal(version, path, exc)
            raise


def _other_format(version: str) -> bool:
    """The cache holds ``version`` in another ``CACHE_FORMAT`` (an older kvfence wrote it): fetch it again."""
    for path in (entry_folder(version) / MANIFEST, refusal_path(version)):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # absent, or corrupt: load_entry / load_refusal say so
        if isinstance(record, dict) and isinstance(record.get("format"), int) and record["format"] != CACHE_FORMAT:
            return True
    return False


def refusal_path(version: str) -> Path:
    return cache_root() / f"sglang-{version}.refused.json"


def load_refusal(version: str) -> Optional[Refused]:
    """The remembered ``Refused`` of ``version`` (None if there is none); ``BadInput`` if the record is corrupt."""
    path = refusal_path(version)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        require(isinstance(record, dict) and record.get("format") == CACHE_FORMAT
                and record.get("version") == version and record.get("status") in REFUSALS
                and isinstance(record.get("reason"), str), "not a refusal record of this version")
    except (BadInput, OSError, ValueError) as exc:
        raise BadInput(f"cache record {path} is corrupt ({exc}); delete it or run "
                       f"`kvfence upstream fetch {version} --refresh`") from None
    return Refused(record["reason"], record["status"])


def _remember_refusal(version: str, wheel: Path, exc: Refused) -> None:
    record = {"format": CACHE_FORMAT, "version": version, "status": exc.status, "reason": str(exc),
              "wheel": wheel.name, "wheel_sha256": _sha256(wheel.read_bytes())}
    path = refusal_path(version)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=1) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)  # a reader sees the old record or the new one, never half of one


def cached_versions() -> Dict[str, str]:
    """Releases the cache knows: version -> ``"entry"`` (extracted) or ``"refused"`` (a remembered refusal).
    Folder and file names only; nothing is validated or read here."""
    root = cache_root()
    found: Dict[str, str] = {}
    for path in sorted(root.glob("sglang-*")) if root.is_dir() else []:
        name = path.name[len("sglang-"):]
        if path.is_dir() and _VERSION.match(name):
            found[name] = "entry"
        elif name.endswith(".refused.json") and _VERSION.match(name[:-len(".refused.json")]):
            found.setdefault(name[:-len(".refused.json")], "refused")
    return found


def _find_wheel(version: str, wheel: Optional[str], offline: bool, tmp: Path, announce) -> Path:
    if wheel:
        path = Path(wheel)
        require(path.is_file(), f"--wheel {wheel}: no such file")
        return path
    wheel_dir = os.environ.get("KVFENCE_WHEEL_DIR")
    if wheel_dir:
        found = sorted(Path(wheel_dir).glob(f"sglang-{version}-*.whl"))
        require(found, f"sglang=={version}: no sglang-{version}-*.whl in KVFENCE_WHEEL_DIR={wheel_dir}")
        return found[0]
    require(not offline, f"sglang=={version} is not in the cache ({entry_folder(version)}) and the network is "
            "off (--offline / KVFENCE_OFFLINE=1); fetch it where PyPI is reachable, or point KVFENCE_CACHE at "
            "a cache that has it")
    if announce:
        announce(f"kvfence: downloading the sglang=={version} wheel with pip (no install, no dependencies)")
    return _pip_download(version, tmp)


# The wheel's Python source is the same for every CPython tag; newer releases publish only some tags, so
# a miss for this interpreter is retried for others before the version is called unknown.
_OTHER_PYTHONS = ("3.12", "3.11", "3.10", "3.13")


def _pip_download(version: str, dest: Path) -> Path:
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    last = ""
    for python in (None,) + tuple(p for p in _OTHER_PYTHONS if p != here):
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--retries", "1", "--timeout", "30", "-d", str(dest),
               f"sglang=={version}"]
        if python:
            cmd[-1:-1] = ["--python-version", python]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            raise BadInput(f"sglang=={version}: pip download timed out (network?)") from None
        found = sorted(dest.glob("sglang-*.whl"))
        if proc.returncode == 0 and found:
            return found[0]
        last = proc.stderr + proc.stdout
        if "from versions: none" in last or "No matching distribution" not in last:
            break  # the index answered nothing at all, or pip failed otherwise: no retry helps
    if "from versions: none" in last or re.search(r"NewConnectionError|Max retries|Temporary failure|"
                                                  r"Network is unreachable|Could not fetch URL", last):
        raise BadInput(f"sglang=={version}: cannot download the wheel, the package index is not reachable "
                       "(no network?); use the cache, --wheel PATH or KVFENCE_WHEEL_DIR")
    if "No matching distribution" in last:
        raise BadInput(f"sglang=={version}: no such release with a wheel on the package index")
    tail = [line for line in last.strip().splitlines() if line.strip()]
    raise BadInput(f"sglang=={version}: pip download failed: {tail[-1] if tail else 'no output'}")


# -- extraction ---------------------------------------------------------------------------------------
def _extract_to_cache(version: str, wheel: Path) -> Entry:
    wheel_bytes = wheel.read_bytes()
    source_path, source = _find_kernel_module(version, wheel)
    try:
        tree = ast.parse(source)
        defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        # The ABI first: a signature no ABI fits is the more useful message than what extraction would say.
        try:
            abi = {name: detect_abi(defs[name]).to_dict() for name in KERNELS if name in defs}
        except BadInput as exc:
            raise Refused(str(exc), ABI_UNSUPPORTED) from None
        text, functions = extract(source, source_path)
    except SyntaxError as exc:
        raise BadInput(f"sglang=={version}: {source_path} does not parse: {exc.msg} (line {exc.lineno})") from None
    except Refused as exc:
        raise Refused(f"sglang=={version}: {exc}", exc.status) from None
    except BadInput as exc:
        raise BadInput(f"sglang=={version}: {exc}") from None
    module_file = Path(source_path).name
    header = (f'"""{", ".join(k for k in KERNELS if k in defs)} of sglang=={version}, extracted by kvfence.\n\n'
              f"Source: {source_path} in {wheel.name} (sha256 {_sha256(wheel_bytes)}).\n"
              'Generated; do not edit (the manifest holds its sha256).\n"""\n\n')
    text = header + text
    from kvfence.release import shipped  # the wheel's sizing sites, read as data (never imported)

    shipped_text = json.dumps(shipped.read_wheel_or_note(wheel), indent=1) + "\n"
    manifest = {"format": CACHE_FORMAT, "version": version, "source_path": source_path, "wheel": wheel.name,
                "wheel_sha256": _sha256(wheel_bytes), "module_file": module_file,
                "module_sha256": _sha256(text.encode()), "functions": functions, "abi": abi,
                "shipped_sha256": _sha256(shipped_text.encode())}
    # Write a sibling folder, then swap it in: a reader never sees half an entry.
    folder = entry_folder(version)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    old: Optional[Path] = None
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the entry from the other users of a shared cache
        (staging / module_file).write_text(text, encoding="utf-8")
        (staging / shipped.RECORD_FILE).write_text(shipped_text, encoding="utf-8")
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
        # The old entry moves aside in one rename and the new one in in another: a reader sees the old entry,
        # none, or the new one, never a folder half removed (load_entry reads again if it was mid-swap).
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}-old-", dir=folder.parent))
            try:
                os.replace(folder, old)
            except OSError:  # another process swapped it first
                pass
        try:
            os.replace(staging, folder)
        except OSError:
            # Another process (an xdist worker) put the same release there first: use its entry.
            if not folder.is_dir():
                raise
    finally:
        for leftover in (staging, old):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    refusal_path(version).unlink(missing_ok=True)  # the release is testable now (a --refresh, another wheel)
    return _validate_entry(version, folder)


def _find_kernel_module(version: str, wheel: Path) -> Tuple[str, str]:
    """``(path in the wheel, source)`` of the module defining the draft kernel; checks the wheel on the way."""
    from kvfence.release.shipped import read_member
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            meta = f"sglang-{version}.dist-info/METADATA"
            require(meta in names, f"wheel {wheel.name} is corrupt or not sglang {version}: no {meta}")
            fields = dict(re.findall(r"^(Name|Version): *(\S+)", member_bytes(zf, meta).decode("utf-8", "replace"),
                                     re.M))
            require(fields.get("Name", "").lower() == "sglang" and fields.get("Version") == version,
                    f"wheel {wheel.name} is {fields.get('Name')} {fields.get('Version')}, not sglang {version}")
            record = _record(zf, f"sglang-{version}.dist-info/RECORD")
            needle = re.compile(rf"^def {DRAFT_KERNEL}\(", re.M)
            hits, skipped = [], []
            for info in zf.infolist():
                name = info.filename
                if name.startswith("sglang/") and name.endswith(".py"):
                    data, why = read_member(zf, info)  # bounded: a zip bomb is skipped, not inflated
                    if data is None:
                        skipped.append(f"{name} ({why})")
                    elif needle.search(data.decode("utf-8", "replace")):
                        hits.append((name, data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError) as exc:
        raise BadInput(f"wheel {wheel} is corrupt: {exc}") from None
    if not hits:
        unread = f"; {len(skipped)} member(s) not read: {', '.join(skipped[:3])}" if skipped else ""
        raise Refused(f"sglang=={version} has no {DRAFT_KERNEL} (searched the .py files of {wheel.name}{unread})",
                      NO_KERNEL)
    require(len(hits) == 1, f"sglang=={version} defines {DRAFT_KERNEL} in several modules: "
            f"{', '.join(h[0] for h in hits)}")
    name, data = hits[0]
    expected = record.get(name)
    require(expected is not None, f"wheel {wheel.name} is corrupt: {name} is not in its RECORD")
    digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    require(digest == expected, f"wheel {wheel.name} is corrupt: {name} does not match its RECORD hash")
    try:
        return name, data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"wheel {wheel.name} is corrupt: {name} is not UTF-8") from None


def member_bytes(zf: zipfile.ZipFile, name: str) -> bytes:
    """A member kvfence needs whole (METADATA, RECORD, a kernel's module), read within the member bound."""
    from kvfence.release.shipped import read_member

    data, why = read_member(zf, zf.getinfo(name))
    require(data is not None, f"wheel is corrupt: {name} is {why}")
    return data


def _record(zf: zipfile.ZipFile, name: str) -> Dict[str, str]:
    require(name in zf.namelist(), f"wheel is corrupt: no {name}")
    rows = {}
    for line in member_bytes(zf, name).decode("utf-8", "replace").splitlines():
        path, _, rest = line.partition(",")
        rows[path] = rest.partition(",")[0]
    return rows


def _is_jit(fn: ast.FunctionDef) -> bool:
    for deco in fn.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if ast.unparse(target) in ("triton.jit", "jit"):
            return True
    return False


# Builtins a jit function may name (Triton's own and harmless ones); any other (``__import__``, ``open``,
# ``eval``) is refused like any unresolvable name. The interpreter runs a jit body as Python.
_ALLOWED_BUILTINS = {"range", "min", "max", "abs", "int", "float", "bool", "len", "isinstance", "print", "tuple",
                     "list", "zip", "enumerate", "getattr", "hasattr", "Ellipsis"} & set(dir(builtins))
# What a module-level constant, a decorator or a default may be: literals, names, Triton attribute chains and
# calls of them (``tl.constexpr(64)``, ``triton.jit(do_not_specialize=[...])``), arithmetic.
_SAFE_NODES = (ast.Constant, ast.Name, ast.Load, ast.Attribute, ast.Call, ast.keyword, ast.BinOp, ast.UnaryOp,
               ast.operator, ast.unaryop, ast.Tuple, ast.List)


def _check_safe_expr(node: ast.AST, what: str) -> None:
    for sub in ast.walk(node):
        require(isinstance(sub, _SAFE_NODES), f"{what}: {type(sub).__name__} in {ast.unparse(node)!r} is not allowed")
        if isinstance(sub, ast.Call):
            root = sub.func
            while isinstance(root, ast.Attribute):
                root = root.value
            require(isinstance(root, ast.Name) and root.id in ("triton", "tl"),
                    f"{what}: {ast.unparse(sub)!r} calls something other than Triton")


def _free_names(node: ast.AST, bound: set) -> List[str]:
    """Names ``node`` reads that it does not bind itself (parameters, assignments, loop targets)."""
    stored, loaded = set(bound), []
    for sub in ast.walk(node):
        if isinstance(sub, ast.arg):
            stored.add(sub.arg)
        elif isinstance(sub, ast.Name):
            if isinstance(sub.ctx, ast.Store):
                stored.add(sub.id)
            else:
                loaded.append(sub.id)
    seen = []
    for name in loaded:
        if name not in stored and name not in _ALLOWED_BUILTINS and name not in seen:
            seen.append(name)
    return seen


def extract(source: str, source_path: str = "<module>", roots: Tuple[str, ...] = KERNELS) -> Tuple[str, List[str]]:
    """The standalone module text for the kernels of ``source``, and the jit functions it holds.

    Starts from ``roots`` (default ``KERNELS``, the draft family; a contract names its own) and follows every name they read: a top-level ``@triton.jit`` function is
    taken (and followed), a top-level constant is taken when its value only reads literals, Triton and
    other such constants, ``triton`` / ``tl`` come from the standard imports. Anything else is ``BadInput``.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise BadInput(f"{source_path} does not parse: {exc.msg} (line {exc.lineno})") from None
    lines = source.splitlines(keepends=True)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    constants = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name):
                constants[target.id] = node
    imports = {}
    future = False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            future = future or any(a.name == "annotations" for a in node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                imports[alias.asname or alias.name.split(".")[0]] = node
    taken: Dict[str, ast.AST] = {}
    triton_imports: Dict[str, ast.AST] = {}
    todo = [name for name in roots if name in functions]

    def resolve(name: str, user: str) -> None:
        if name in ("triton", "tl") or name in taken or name in triton_imports:
            return
        if name in functions:
            fn = functions[name]
            require(_is_jit(fn), f"{source_path}: {user} calls {name}, which is not a @triton.jit function")
            todo.append(name)
        elif name in constants:
            node = constants[name]
            _check_safe_expr(node.value, f"{source_path}: constant {name}")
            taken[name] = node
            for inner in _free_names(node.value, set()):
                resolve(inner, name)
        elif name in imports and _imports_only_triton(imports[name]):
            triton_imports[name] = imports[name]
        elif name in imports:
            raise BadInput(f"{source_path}: {user} uses {name!r}, imported from outside Triton "
                           f"({ast.unparse(imports[name])}); kvfence extracts only jit code and constants")
        else:
            raise BadInput(f"{source_path}: {user} reads {name!r}, which kvfence cannot resolve")

    while todo:
        name = todo.pop()
        if name in taken:
            continue
        fn = functions[name]
        # Evaluated when the module is imported, not only when the kernel runs: Triton and literals only.
        for expr in fn.decorator_list + fn.args.defaults + [a.annotation for a in fn.args.args if a.annotation]:
            _check_safe_expr(expr, f"{source_path}: {name}")
        taken[name] = fn
        for free in _free_names(fn, {name}):
            resolve(free, name)
    nodes = sorted(set(taken.values()) | set(triton_imports.values()), key=lambda n: n.lineno)
    parts = ["from __future__ import annotations\n\n"] if future else []
    parts.append("import triton\nimport triton.language as tl\n")
    for node in nodes:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        parts.append(("\n\n" if isinstance(node, ast.FunctionDef) else "\n") + "".join(lines[start - 1:node.end_lineno]))
    names = [n.name for n in nodes if isinstance(n, ast.FunctionDef)]
    return "".join(parts).rstrip() + "\n", names


def _imports_only_triton(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return all(a.name.split(".")[0] == "triton" for a in node.names)
    return (node.module or "").split(".")[0] == "triton" and node.level == 0


# -- resolving a --kernel spec ------------------------------------------------------------------------
def is_spec(spec: str) -> bool:
    return isinstance(spec, str) and spec.startswith(SPEC_PREFIX)


def parse_spec(spec: str) -> Tuple[str, str]:
    """``sglang==VERSION[:attr]`` -> ``(version, attr)``."""
    version, _, attr = spec[len(SPEC_PREFIX):].partition(":")
    check_version(version)
    attr = attr or DRAFT_KERNEL
    require(attr in KERNELS, f"kernel {spec!r}: {attr!r} is not one of the extracted kernels ({', '.join(KERNELS)})")
    return version, attr


def resolve(spec: str) -> Tuple[Entry, str, Abi]:
    """The cache entry (fetched when allowed), kernel name and ABI a ``sglang==VERSION[:attr]`` spec names."""
    version, attr = parse_spec(spec)
    entry = fetch(version, announce=lambda m: print(m, file=sys.stderr, flush=True))
    abis = entry.abis
    require(attr in abis, f"kernel {spec!r}: sglang=={version} has no {attr} ({entry.manifest['source_path']})")
    return entry, attr, abis[attr]


def describe(entry: Entry) -> str:
    """One line: where the kernels came from and their ABIs."""
    kernels = ", ".join(f"{name} ({abi.name} ABI, {abi.contract})" for name, abi in entry.abis.items())
    return f"sglang=={entry.version}: {entry.manifest['source_path']}: {kernels}"
