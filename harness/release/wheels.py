"""A project's release wheels, as data: versions, the cache, finding or downloading a wheel, reading its members.

Shared by every reader of upstream wheels (SGLang's draft cache, the draft's ``release_kernels``; any contract's
SGLang kernel ``kvfence.release.contract_kernels``; vLLM's ``kvfence.release.vllm_kernels``): a version is checked
before it names a file or reaches pip's argv, a wheel comes from ``--wheel``, ``KVFENCE_WHEEL_DIR`` or ``pip
download --no-deps`` (never installed), nothing offline downloads, every member is read within a bound, and the
cache holds code kvfence runs, so it must be its user's alone (``check_trusted``).
"""

from __future__ import annotations

import ast
import errno
import hashlib
import os
import re
import stat
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from kvfence.errors import BadInput, printable, require

#: A release version as PyPI spells it (0.5.23, 0.5.15.post1, 0.11.0rc1, 0.10.1.1).
VERSION = re.compile(r"[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?")
#: Longest release version accepted (a version names cache folders and files).
MAX_VERSION_CHARS = 64
#: Python versions to ask pip for when none matches this interpreter (a wheel's Python source is the same).
OTHER_PYTHONS = ("3.12", "3.11", "3.10", "3.13")


@contextmanager
def cache_writes(path: Path):
    """``with cache_writes(path):`` an ``OSError`` writing the cache (a full disk, a read-only folder) is one line
    naming the file it failed on (else ``path``) and its errno: ``BadInput``, exit 2, never a traceback."""
    try:
        yield
    except OSError as exc:
        name = errno.errorcode.get(exc.errno, f"errno {exc.errno}") if exc.errno else type(exc).__name__
        raise BadInput(f"cannot write the cache: {exc.filename or path}: {exc.strerror or exc} ({name}); point "
                       "KVFENCE_CACHE at a folder you can write") from None


def cache_root() -> Path:
    """``$KVFENCE_CACHE``, else ``~/.cache/kvfence``."""
    env = os.environ.get("KVFENCE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kvfence"


def offline_by_env() -> bool:
    return os.environ.get("KVFENCE_OFFLINE", "").strip().lower() in ("1", "true", "yes")


def is_version(text) -> bool:
    """Whether ``text`` is a release version (``check_version`` accepts it)."""
    return isinstance(text, str) and len(text) <= MAX_VERSION_CHARS and VERSION.fullmatch(text) is not None


def check_version(version, project: str = "sglang") -> str:
    """``version`` if it is a release version of ``project``: digits and dots, an optional pre, post or dev part,
    nothing else (no newline, no path), at most ``MAX_VERSION_CHARS`` long; ``BadInput`` (one line) otherwise."""
    article = "an" if project[:1] in "aefhilmnorsx" else "a"  # as the name is spoken: an sglang, a vllm
    require(is_version(version), f"{printable(version, 80)!r} is not {article} {project} release version (e.g. "
                                 "0.5.23 or 0.5.15.post1)")
    return version


def check_trusted(folder: Path) -> None:
    """The cache holds code kvfence imports, and its sha256 catches accidents, not tampering (anyone who
    can write the file can rewrite the hash): the cache root, the entry and its files must belong to
    this user and be writable by no one else (docs/security.md, "The upstream cache holds kernel text,
    admitted again on every read")."""
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


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def find_wheel(project: str, version: str, wheel: Optional[str], offline: bool, tmp: Path, announce, *,
               cached_in: Path, platforms: Sequence[str] = (), why: str = "") -> Path:
    """The ``project`` wheel of ``version``: ``wheel`` (a ``--wheel`` path), else ``KVFENCE_WHEEL_DIR``'s, else
    downloaded with pip into ``tmp`` (never installed) unless ``offline`` (``cached_in`` names the cache entry
    the refusal points at; ``why``, what is wrong with it when the release is in the cache but that record is
    missing or damaged). ``platforms``: a platform tag to retry with when none matches this host."""
    if wheel:
        path = Path(wheel)
        require(path.is_file(), f"--wheel {wheel}: no such file")
        return path
    wheel_dir = os.environ.get("KVFENCE_WHEEL_DIR")
    if wheel_dir:
        found = sorted(Path(wheel_dir).glob(f"{project}-{version}-*.whl"))
        require(found, f"{project}=={version}: no {project}-{version}-*.whl in KVFENCE_WHEEL_DIR={wheel_dir}")
        return found[0]
    absent = f"{project}=={version}: {cached_in} is {why}" if why else \
        f"{project}=={version} is not in the cache ({cached_in})"
    require(not offline, f"{absent} and the network is off "
                         "(--offline / KVFENCE_OFFLINE=1); fetch it where PyPI is reachable, or point KVFENCE_CACHE "
                         f"at a cache that has it, or set KVFENCE_WHEEL_DIR to a folder holding {project}-{version}-"
                         "*.whl")
    if announce:
        announce(f"kvfence: downloading the {project}=={version} wheel with pip (no install, no dependencies)")
    return pip_download(project, version, tmp, platforms)


def pip_download(project: str, version: str, dest: Path, platforms: Sequence[str] = ()) -> Path:
    """``pip download --no-deps`` of one release's wheel into ``dest``: for this interpreter, then for other Python
    versions (and ``platforms``) before the release is called unknown; every failure is one line."""
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    attempts: List[List[str]] = [[]] + [["--python-version", p] for p in OTHER_PYTHONS if p != here]
    attempts += [["--python-version", p, "--platform", tag] for tag in platforms for p in (here,) + OTHER_PYTHONS]
    last = ""
    for extra in attempts:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--retries", "1", "--timeout", "30", "-d", str(dest), *extra,
               f"{project}=={version}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired:
            raise BadInput(f"{project}=={version}: pip download timed out (network?)") from None
        found = sorted(dest.glob(f"{project}-*.whl"))
        if proc.returncode == 0 and found:
            return found[0]
        last = proc.stderr + proc.stdout
        if "from versions: none" in last or "No matching distribution" not in last:
            break  # the index answered nothing at all, or pip failed otherwise: no retry helps
    if "from versions: none" in last or re.search(r"NewConnectionError|Max retries|Temporary failure|"
                                                  r"Network is unreachable|Could not fetch URL", last):
        raise BadInput(f"{project}=={version}: cannot download the wheel, the package index is not reachable (no "
                       "network?); use the cache, --wheel PATH or KVFENCE_WHEEL_DIR")
    if "No matching distribution" in last:
        raise BadInput(f"{project}=={version}: no such release with a wheel on the package index")
    tail = [line for line in last.strip().splitlines() if line.strip()]
    raise BadInput(f"{project}=={version}: pip download failed: {printable(tail[-1], 200) if tail else 'no output'}")


def member_bytes(zf: zipfile.ZipFile, name: str) -> bytes:
    """A member kvfence needs whole (METADATA, RECORD, a kernel's module), read within the member bound."""
    from kvfence.release.wheel_ast import read_member

    data, why = read_member(zf, zf.getinfo(name))
    if data is None:
        raise BadInput(f"wheel is corrupt: {name} is {why}")
    return data


def wheel_record(zf: zipfile.ZipFile, name: str) -> Dict[str, str]:
    """The wheel's RECORD (``name``): ``{member: "sha256=..."}``."""
    require(name in zf.namelist(), f"wheel is corrupt: no {name}")
    rows = {}
    for line in member_bytes(zf, name).decode("utf-8", "replace").splitlines():
        path, _, rest = line.partition(",")
        rows[path] = rest.partition(",")[0]
    return rows


def parameters(source: str, function: str, where: str) -> List[str]:
    """The parameter names of the top-level function ``function`` of ``source`` (read, never run)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise BadInput(f"{where}: the module defining {function} does not parse: {exc.msg}") from None
    fn = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    require(fn, f"{where}: {function} is not a top-level function")
    return [a.arg for a in fn[0].args.args]
