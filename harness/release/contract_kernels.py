"""Any contract's kernel of an SGLang release: ``--kernel sglang==VERSION[:attr]`` for a contract whose release
knowledge says where the wheel defines it (``kvfence.release.knowledge.Upstream``). Registered as the kernel
source ``sglang`` (entry-point group ``kvfence.kernel_sources``, read by ``kvfence.engine.kernels``).

The function is extracted from the wheel as data (``kvfence.release.extract``) into a cache entry of the
contract's own, checked against the contract's ABI by its parameters, and loaded like a plug-in kernel file. Its
text is admitted by the kernel text rule (``kvfence.release.kernel_text``) before it is written
(``write_entry``) and every time the entry is read (``load_contract_entry``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional, Tuple

from kvfence.errors import BadInput, require
from kvfence.release.extract import check_entry, entry_header, extract
from kvfence.release.upstream import ABI_UNSUPPORTED, NO_KERNEL, SPEC_PREFIX, Refused, find_wheel
from kvfence.release.wheels import (
    cache_root,
    cache_writes,
    check_trusted,
    check_version,
    member_bytes,
    offline_by_env,
    parameters,
    sha256_hex,
)

#: Bumped when a contract kernel's cache entry changes shape; an entry of another format is extracted again.
CONTRACT_CACHE_FORMAT = 1


def contract_entry(version: str, contract: str, project: str = "sglang") -> Tuple[Path, Path]:
    """``(module, manifest)`` of one contract's kernel of one ``project`` release in the cache: an entry of its own
    (``contracts/PROJECT-VERSION/CONTRACT.py`` and ``.json``), apart from every other contract's and from the
    draft kernel's release entry, so no command's writes can spoil another's."""
    folder = cache_root() / "contracts" / f"{project}-{version}"
    return folder / f"{contract}.py", folder / f"{contract}.json"


def load_contract_entry(module: Path, manifest: Path, function: str,
                        fmt: int = CONTRACT_CACHE_FORMAT) -> Optional[Path]:
    """The cached module if its manifest (of format ``fmt``) vouches for it; None if there is no entry or one of
    another format (extracted again); ``BadInput`` if corrupt."""
    if not module.exists() and not manifest.exists():
        return None
    try:
        check_trusted(module.parent)
        data = json.loads(manifest.read_text(encoding="utf-8"))
        require(isinstance(data, dict) and data.get("format") == fmt, "another format")
        text = module.read_text(encoding="utf-8")
        require(sha256_hex(text.encode()) == data.get("sha256"), f"{module.name} does not match its sha256")
        check_entry(text, str(module), set(data.get("functions", [])))
        require(function in data.get("functions", []), f"it holds no {function}")
    except (BadInput, OSError, ValueError, SyntaxError) as exc:
        if isinstance(exc, BadInput) and "another format" in str(exc):
            return None  # an entry of an older layout: extracted again
        raise BadInput(f"cache entry {module} is corrupt ({exc}); delete it and run the command again") from None
    return module


def contract_kernel(record, spec: str) -> Tuple[Path, str]:
    """``(file, function)`` of ``record``'s kernel in release ``sglang==VERSION[:attr]``: read from the wheel as
    data (never imported), the function and the jit helpers and constants it needs extracted into the cache, on
    first use. ``Refused`` (one line) when the release has no such kernel or one of another signature."""
    from kvfence.engine.kernels import module_file, reference_spec
    from kvfence.release.knowledge import upstream_of

    where = upstream_of(record.name)
    version, _, attr = spec[len(SPEC_PREFIX):].partition(":")
    check_version(version)
    function = where.function
    require(attr in ("", function), f"kernel {spec!r}: contract {record.name} launches {function}, not {attr}")
    module, manifest = contract_entry(version, record.name)
    if load_contract_entry(module, manifest, function) is not None:
        return module, function
    found, source = wheel_source(version, where.paths, function, record.name, tuple(r[0] for r in where.renamed),
                                 (module, entry_state(module)))
    if f"def {function}(" not in source:  # the kernel under an older name: launched through kvfence's adapter
        return _renamed_kernel(where, source, found, module, manifest, version, record.name)
    ours = parameters(module_file(reference_spec(record)).read_text(), reference_spec(record).rpartition(":")[2],
                       "kvfence")
    theirs = parameters(source, function, f"sglang=={version}")
    if len(ours) != len(theirs):
        raise Refused(f"sglang=={version}: {function} takes {len(theirs)} parameters ({', '.join(theirs)}), the "
                      f"{record.name} ABI {len(ours)} ({', '.join(ours)}); kvfence does not know this signature",
                      ABI_UNSUPPORTED)
    store_extracted(module, manifest, source, found, function, version, record.name, "Generated")
    return module, function


def _renamed_kernel(where, source: str, found: str, module: Path, manifest: Path, version: str,
                    contract: str) -> Tuple[Path, str]:
    """The release's kernel under an older name (``Upstream.renamed``) extracted with kvfence's adapter after it;
    ``Refused`` (``ABI_UNSUPPORTED``) when its parameters are not the ones the adapter passes."""
    name, params, adapter = next(r for r in where.renamed if f"def {r[0]}(" in source)
    theirs = parameters(source, name, f"sglang=={version}")
    if tuple(theirs) != tuple(params):
        raise Refused(f"sglang=={version}: {name} takes {len(theirs)} parameters ({', '.join(theirs)}); kvfence "
                      f"launches {name} only with the {len(params)} it adapts ({', '.join(params)})", ABI_UNSUPPORTED)
    store_extracted(module, manifest, source, found, name, version, contract,
                    f"Launched through kvfence's adapter {where.function} (the contract's ABI)",
                    adapter=(where.function, adapter))
    return module, where.function


def entry_state(module: Path) -> str:
    """What is wrong with a contract's entry that ``load_contract_entry`` did not return (for the offline line)."""
    return "missing from the cache" if not module.exists() else "in the cache in another format (an older kvfence's)"


def wheel_source(version: str, paths, function: str, contract: str, others: Tuple[str, ...] = (),
                 record: Optional[Tuple[Path, str]] = None) -> Tuple[str, str]:
    """``(member path, its text)``: the first of ``paths`` that sglang ``version``'s wheel holds (the wheel from
    ``KVFENCE_WHEEL_DIR`` or pip, never installed); ``Refused`` (``NO_KERNEL``) when it holds none of them or the
    member defines neither ``function`` nor one of ``others`` (its older names). ``record``: the cache entry read it
    for and what is wrong with it."""
    with tempfile.TemporaryDirectory(prefix="kvfence-wheel-") as tmp:
        wheel = find_wheel(version, None, offline_by_env(), Path(tmp),
                           lambda m: print(m, file=sys.stderr, flush=True), record)
        try:
            with zipfile.ZipFile(wheel) as zf:
                names = set(zf.namelist())
                found = [p for p in paths if p in names]
                if not found:
                    raise Refused(f"sglang=={version} has no {function} for contract {contract} "
                                  f"(looked in {', '.join(paths)})", NO_KERNEL)
                source = member_bytes(zf, found[0]).decode("utf-8")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, UnicodeDecodeError) as exc:
            raise BadInput(f"sglang=={version}: the wheel is unreadable: {exc}") from None
    if not any(f"def {name}(" in source for name in (function, *others)):
        raise Refused(f"sglang=={version}: {found[0]} has no {' or '.join((function, *others))}", NO_KERNEL)
    return found[0], source


def store_extracted(module: Path, manifest: Path, source: str, found: str, function: str, version: str,
                    contract: str, purpose: str, fmt: int = CONTRACT_CACHE_FORMAT, project: str = "sglang",
                    adapter: Optional[Tuple[str, str]] = None) -> None:
    """``function`` and the jit helpers and constants it reads, extracted from ``source`` (``found`` in the wheel)
    into ``module``, with its manifest (format ``fmt``, the text's sha256) beside it; each file written whole.
    ``adapter``: ``(name, text)`` of kvfence's own jit function appended after them (``Upstream.renamed``)."""
    text, functions = extract(source, found, roots=(function,))
    require(function in functions, f"{project}=={version}: {function} in {found} is not a @triton.jit function")
    if adapter is not None:
        require(adapter[0] not in functions, f"{project}=={version}: {found} defines {adapter[0]} already")
        text, functions = text.rstrip("\n") + "\n\n\n# kvfence's adapter (not the release's code):\n" + adapter[1], \
            [*functions, adapter[0]]
    text = entry_header(f"{function} of {project}=={version} ({found}), extracted by kvfence. {purpose}.") + text
    write_entry(module, manifest, text, {"format": fmt, "version": version, "contract": contract, "source": found,
                                         "functions": functions})


def write_entry(module: Path, manifest: Path, text: str, record: dict) -> None:
    """An extracted module and its manifest (``record`` with the text's sha256 added) written into the cache,
    each file whole, once the text passes the kernel text rule as the reader will check it."""
    check_entry(text, str(module), set(record["functions"]))
    with cache_writes(module):
        module.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        for path, body in ((module, text), (manifest, json.dumps(dict(record, sha256=sha256_hex(text.encode()))))):
            staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            staging.write_text(body, encoding="utf-8")
            os.replace(staging, path)
