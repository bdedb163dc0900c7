"""The draft kernel's release cache: SGLang's own draft kernels, taken from its PyPI wheel: ``--kernel
sglang==VERSION[:attr]``.

``fetch(version)`` gets the ``sglang`` wheel of one release (``pip download --no-deps``: no install, no
SGLang import, no GPU dependency), finds the module that defines ``generate_draft_decode_kv_indices`` (it
moved between releases), and writes a standalone module into the cache folder (``$KVFENCE_CACHE`` or
``~/.cache/kvfence/``), ``sglang-VERSION/<module>.py``, next to a ``manifest.json`` and ``shipped.json`` (how
the release's backends size the kernel's buffer, read as data by ``shipped_wheel``). The module holds only what
the kernels need, extracted with ``ast``: the kernel, ``generate_draft_decode_window_kv_indices`` when the release
has it, the ``@triton.jit`` helpers they call, and the module-level constants they read, plus ``import triton`` /
``import triton.language as tl``.

The wheel is data. kvfence never imports SGLang and never runs anything from the wheel except those jit
functions, and only when asked to fuzz them. Extraction refuses any name it cannot resolve to a jit
function, a literal constant or Triton itself, and admits the text by the kernel text rule
(``kvfence.release.kernel_text``: an allow-list of what Triton kernels are written with), again on every read
of the cache (docs/security.md).

Each kernel's ABI is read from its signature (``detect_abi``); a release whose kernel fits none of
``ABIS`` is ``BadInput`` with one line naming what differs. Such a release, and one without the kernel, is
``Refused`` and remembered in the cache (``sglang-VERSION.refused.json``: data, the reason and the wheel's
sha256), so a later offline run (the release matrix on a host without network) gives the same reason.
``KVFENCE_OFFLINE=1`` (or ``--offline``) forbids the network: only the cache and local wheels are used.
``KVFENCE_WHEEL_DIR`` (or ``--wheel``) supplies wheels from disk instead of pip.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple

from kvfence.contracts.draft.shipped_wheel import DRAFT_KERNEL, RECORD_FILE, WINDOW_KERNEL, read_wheel_or_note
from kvfence.errors import BadInput, require
from kvfence.release.extract import check_entry, entry_header, extract
from kvfence.release.upstream import (
    ABI_UNSUPPORTED,
    NO_KERNEL,
    REFUSALS,
    SPEC_PREFIX,
    Refused,
    entry_folder,
    find_wheel,
)
from kvfence.release.wheels import (
    cache_root,
    cache_writes,
    check_trusted,
    check_version,
    is_version,
    member_bytes,
    offline_by_env,
    sha256_hex,
    wheel_record,
)

#: The kernels extracted from a release (the first is required, the second optional).
KERNELS = (DRAFT_KERNEL, WINDOW_KERNEL)
#: Bumped when the cache layout changes; an entry of another format is refetched, never trusted.
CACHE_FORMAT = 4  # 2: the shipped-sizing record beside the kernels; 3: its replay notes; 4: an ABI says ``rail``
MANIFEST = "manifest.json"


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


@dataclass(frozen=True)
class Abi:
    """How to launch one extracted kernel: ABI name, whether it is the window rail's (its ABI adds the rail's
    ``window``) and its parameters (from its signature)."""

    name: str  # a key of ABIS
    rail: bool  # the window rail's kernel (WINDOW_KERNEL), else the draft kernel's
    required: Tuple[str, ...]  # required parameters, in order
    optional: Tuple[str, ...]  # parameters with defaults (left at their defaults)

    def to_dict(self) -> dict:
        return {"name": self.name, "rail": self.rail, "required": list(self.required),
                "optional": list(self.optional)}

    @classmethod
    def from_dict(cls, d: dict) -> "Abi":
        abi = cls(d["name"], d["rail"], tuple(d["required"]), tuple(d["optional"]))
        require(abi.name in ABIS and type(abi.rail) is bool, f"unknown ABI {d!r}")
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
    return Abi(name, rail, required, optional)


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
            check_trusted(folder)  # its refusal (who may write the cache) is its own message, not "corrupt"
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


def _validate_entry(version: str, folder: Path) -> Entry:
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    require(isinstance(manifest, dict), "manifest is not a JSON object")
    require(manifest.get("format") == CACHE_FORMAT, f"manifest format {manifest.get('format')!r}, "
            f"expected {CACHE_FORMAT}")
    require(manifest.get("version") == version, f"manifest is for version {manifest.get('version')!r}")
    module = folder / manifest["module_file"]
    require(module.parent == folder and module.suffix == ".py", f"bad module_file {manifest['module_file']!r}")
    text = module.read_text(encoding="utf-8")
    require(sha256_hex(text.encode()) == manifest["module_sha256"], f"{module.name} does not match its sha256")
    # The file will be imported: it must hold only what extraction writes (imports of triton, constants,
    # jit functions), whatever happened to it on disk.
    check_entry(text, str(module), set(manifest["functions"]))
    # Extracting the cached module again must give itself: every check of extraction holds for it too.
    require(extract(text, module.name, KERNELS)[1] == manifest["functions"], "module does not extract to its manifest")
    abi = manifest.get("abi")
    require(isinstance(abi, dict) and all(isinstance(d, dict) and all(
        isinstance(d.get(k), list) and all(isinstance(x, str) for x in d[k]) for k in ("required", "optional"))
        for d in abi.values()), "manifest abi must map each kernel to an object with required and optional lists")
    entry = Entry(version, folder, module, manifest)
    require(DRAFT_KERNEL in entry.abis, f"manifest has no ABI for {DRAFT_KERNEL}")
    return entry


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
        path = find_wheel(version, wheel, offline, Path(tmp), announce)
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
              "wheel": wheel.name, "wheel_sha256": sha256_hex(wheel.read_bytes())}
    path = refusal_path(version)
    with cache_writes(path):
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
        if path.is_dir() and is_version(name):
            found[name] = "entry"
        elif name.endswith(".refused.json") and is_version(name[:-len(".refused.json")]):
            found.setdefault(name[:-len(".refused.json")], "refused")
    return found


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
        text, functions = extract(source, source_path, KERNELS)
    except SyntaxError as exc:
        raise BadInput(f"sglang=={version}: {source_path} does not parse: {exc.msg} (line {exc.lineno})") from None
    except Refused as exc:
        raise Refused(f"sglang=={version}: {exc}", exc.status) from None
    except BadInput as exc:
        raise BadInput(f"sglang=={version}: {exc}") from None
    module_file = Path(source_path).name
    require(module_file.endswith(".py") and module_file[:-3].isidentifier(),
            f"sglang=={version}: {source_path!r} is not a module name kvfence writes")
    header = entry_header(f"{', '.join(k for k in KERNELS if k in defs)} of sglang=={version}, extracted by kvfence. "
                          f"Source: {source_path} in {wheel.name} (sha256 {sha256_hex(wheel_bytes)}). "
                          "Generated; do not edit (the manifest holds its sha256).")
    text = header + "\n" + text
    check_entry(text, f"{source_path} (as extracted)", set(functions))  # as load_entry will, before it is written
    shipped_text = json.dumps(read_wheel_or_note(wheel), indent=1) + "\n"  # its sizing sites, as data (never imported)
    manifest = {"format": CACHE_FORMAT, "version": version, "source_path": source_path, "wheel": wheel.name,
                "wheel_sha256": sha256_hex(wheel_bytes), "module_file": module_file,
                "module_sha256": sha256_hex(text.encode()), "functions": functions, "abi": abi,
                "shipped_sha256": sha256_hex(shipped_text.encode())}
    # Write a sibling folder, then swap it in: a reader never sees half an entry.
    folder = entry_folder(version)
    with cache_writes(folder):
        _swap_in(folder, module_file, text, RECORD_FILE, shipped_text, manifest)
        refusal_path(version).unlink(missing_ok=True)  # the release is testable now (a --refresh, another wheel)
    return _validate_entry(version, folder)


def _swap_in(folder: Path, module_file: str, text: str, record_file: str, record_text: str, manifest: dict) -> None:
    """The entry's files written into a sibling folder, then swapped in: a reader never sees half an entry."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    old: Optional[Path] = None
    try:
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the entry from the other users of a shared cache
        (staging / module_file).write_text(text, encoding="utf-8")
        (staging / record_file).write_text(record_text, encoding="utf-8")
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


def _find_kernel_module(version: str, wheel: Path) -> Tuple[str, str]:
    """``(path in the wheel, source)`` of the module defining the draft kernel; checks the wheel on the way."""
    from kvfence.release.wheel_ast import read_member
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            meta = f"sglang-{version}.dist-info/METADATA"
            require(meta in names, f"wheel {wheel.name} is corrupt or not sglang {version}: no {meta}")
            fields = dict(re.findall(r"^(Name|Version): *(\S+)", member_bytes(zf, meta).decode("utf-8", "replace"),
                                     re.M))
            require(fields.get("Name", "").lower() == "sglang" and fields.get("Version") == version,
                    f"wheel {wheel.name} is {fields.get('Name')} {fields.get('Version')}, not sglang {version}")
            record = wheel_record(zf, f"sglang-{version}.dist-info/RECORD")
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


# -- resolving a --kernel spec ------------------------------------------------------------------------
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
    kernels = ", ".join(f"{name} ({abi.name} ABI{', window rail' if abi.rail else ''})"
                        for name, abi in entry.abis.items())
    return f"sglang=={entry.version}: {entry.manifest['source_path']}: {kernels}"




class DraftReleaseCache:
    """``kvfence.release.knowledge.ReleaseCache`` for the draft kernel: this module's cache, registered with the
    draft's release knowledge (``kvfence.contracts.draft.release``)."""

    kernel = DRAFT_KERNEL

    def fetch(self, version: str, *, wheel: Optional[str] = None, offline: Optional[bool] = None,
              refresh: bool = False, announce=None) -> Entry:
        return fetch(version, wheel=wheel, offline=offline, refresh=refresh, announce=announce)

    def cached_versions(self) -> Dict[str, str]:
        return cached_versions()

    def describe(self, entry: Entry) -> str:
        return describe(entry)

    def abi_parameters(self, abi: str) -> Tuple[str, ...]:
        return ABIS[abi]
