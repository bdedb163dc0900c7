"""Any contract's kernel of a vLLM release: ``--kernel vllm==VERSION[:attr]`` for a contract whose release knowledge
says where vLLM's wheel defines it (``kvfence.release.knowledge.Upstream``: the function, and module paths under the
wheel's own package, ``vllm/...``; ``:attr`` the function's name or one of the ``variants`` it names, each extracted
into a cache entry of its own). A function named ``Class.method`` is a ``@staticmethod`` whose next decorator is
``@triton.jit`` (a ``VllmTritonJitKernel``'s body): ``_lifted`` appends its text, dedented, to the module as a
top-level function of the method's name, which is then extracted like any other. Registered as the kernel source
``vllm`` (entry-point group ``kvfence.kernel_sources``, read by ``kvfence.engine.kernels``), beside SGLang's
(``kvfence.release.contract_kernels``).

vLLM's wheel is data, as SGLang's is: fetched with ``pip download vllm==VERSION --no-deps`` (or taken from
``KVFENCE_WHEEL_DIR``), its METADATA and RECORD checked, the module read from the zip and never imported. The
kernel and the ``@triton.jit`` helpers and constants it needs are extracted with ``kvfence.release.extract``; a jit
helper the module imports from another module of the wheel (``from vllm.x.y import helper``: model runner V2's
``_load_ptr``) is read from that module the same way and extracted beside it (each admitted by the kernel text
rule, ``kvfence.release.kernel_text``, naming its own module's file and line); anything else the kernel reads is
one line, never run. The result is a cache entry of the contract's own (``$KVFENCE_CACHE/contracts/
vllm-VERSION/CONTRACT.py`` and its manifest, with the sha256 and the trust checks of SGLang's entries), checked
against the contract's reference kernel by its parameter names. Refusals are one line: a release without the
kernel (``Refused``, ``no-kernel``), another signature (``abi-unsupported``), no wheel and no network.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import re
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path
from typing import Dict, Tuple

from kvfence.errors import BadInput, require
from kvfence.release.contract_kernels import contract_entry, entry_state, load_contract_entry, write_entry
from kvfence.release.extract import entry_header, extract, is_jit
from kvfence.release.upstream import ABI_UNSUPPORTED, NO_KERNEL, Refused
from kvfence.release.wheels import (
    check_version,
    find_wheel,
    member_bytes,
    offline_by_env,
    parameters,
    wheel_record,
)

#: ``--kernel vllm==VERSION`` or ``vllm==VERSION:attr``.
SPEC_PREFIX = "vllm=="
PACKAGE = "vllm"
#: Bumped when an entry's shape changes; an entry of another format is extracted again.
CACHE_FORMAT = 1
#: A wheel built for this platform when pip finds none for this host (vLLM publishes Linux wheels only).
_PLATFORM = "manylinux_2_28_x86_64"


def contract_kernel(record, spec: str) -> Tuple[Path, str]:
    """``(file, function)`` of ``record``'s kernel in release ``vllm==VERSION[:attr]``: read from the wheel as data,
    extracted into the cache on first use. ``Refused`` (one line) when the release has no such kernel or one of
    another signature; ``BadInput`` for a contract whose knowledge names no vLLM module, no wheel, no network."""
    from kvfence.engine.kernels import module_file, reference_spec
    from kvfence.release.knowledge import shipped

    version, _, attr = spec[len(SPEC_PREFIX):].partition(":")
    check_version(version, PACKAGE)
    where, entry = _chosen(record, shipped(record.name).upstream, attr, spec)
    paths = tuple(p for p in where.paths if p.startswith(f"{PACKAGE}/"))
    require(bool(paths), f"contract {record.name} names no kernel in vLLM's wheels")
    qualified = where.function
    function = qualified.rpartition(".")[2]  # a Class.method is lifted to a top-level function of its own name
    module, manifest = contract_entry(version, entry, PACKAGE)
    if load_contract_entry(module, manifest, function, CACHE_FORMAT) is not None:
        return module, function
    with tempfile.TemporaryDirectory(prefix="kvfence-wheel-") as tmp:
        wheel = find_wheel(PACKAGE, version, None, offline_by_env(), Path(tmp),
                           lambda m: print(m, file=sys.stderr, flush=True), cached_in=module,
                           platforms=(_PLATFORM,), why=entry_state(module))
        found, source, helpers = _read_wheel(version, wheel, paths, qualified)
    ours = parameters(module_file(reference_spec(record)).read_text(), reference_spec(record).rpartition(":")[2],
                       "kvfence")
    theirs = parameters(source, function, f"vllm=={version}")
    if ours != theirs:
        raise Refused(f"vllm=={version}: {function} takes ({', '.join(theirs)}), the {record.name} ABI "
                      f"({', '.join(ours)}); kvfence does not know this signature", ABI_UNSUPPORTED)
    text, functions = extract(_with_helpers(source, found, helpers, version), found, roots=(function,))
    require(function in functions, f"vllm=={version}: {function} in {found} is not a @triton.jit function")
    text = entry_header(f"{qualified} of vllm=={version} ({found}), extracted by kvfence. Generated.") + text
    write_entry(module, manifest, text, {"format": CACHE_FORMAT, "version": version, "contract": record.name,
                                         "kernel": qualified, "source": found, "helpers": sorted(helpers),
                                         "functions": functions})
    return module, function


def _chosen(record, where, attr: str, spec: str):
    """``(Upstream, cache entry name)`` a spec's ``:attr`` selects: the contract's kernel (``attr`` empty or its
    function's name) or one of its ``variants`` by name (a cache entry of its own)."""
    require(where is not None, f"contract {record.name} names no kernel in vLLM's wheels")
    variants = dict(where.variants)
    if attr in ("", where.function, where.function.rpartition(".")[2]):
        return where, record.name
    require(attr in variants, f"kernel {spec!r}: contract {record.name} launches {where.function}"
                              + (f" or a variant ({', '.join(variants)})" if variants else "") + f", not {attr}")
    return variants[attr], f"{record.name}-{attr}"


# -- the wheel -------------------------------------------------------------------------------------------------
def _read_wheel(version: str, wheel: Path, paths, function: str) -> Tuple[str, str, Dict[str, Tuple[str, str]]]:
    """``(module path, its source, {helper: (its module path, that module's source)})``: the module of ``paths``
    the wheel holds that defines ``function``, and every jit helper it imports from another module of the wheel
    (each member checked against the wheel's RECORD). A ``Class.method`` function is lifted out of its class
    (``_lifted``): the source returned defines it at the top level."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            meta = f"{PACKAGE}-{version}.dist-info/METADATA"
            require(meta in names, f"wheel {wheel.name} is corrupt or not vllm {version}: no {meta}")
            fields = dict(re.findall(r"^(Name|Version): *(\S+)", member_bytes(zf, meta).decode("utf-8", "replace"),
                                     re.M))
            require(fields.get("Name", "").lower() == PACKAGE and fields.get("Version") == version,
                    f"wheel {wheel.name} is {fields.get('Name')} {fields.get('Version')}, not vllm {version}")
            record = wheel_record(zf, f"{PACKAGE}-{version}.dist-info/RECORD")
            present = [p for p in paths if p in names]
            if not present:
                raise Refused(f"vllm=={version} has no {function} (looked in {', '.join(paths)})", NO_KERNEL)
            found = present[0]
            source = _member_text(zf, found, record, wheel)
            owner, _, method = function.rpartition(".")
            if not re.search(rf"^class {re.escape(owner)}\b" if owner else rf"^def {re.escape(function)}\(",
                             source, re.M):
                raise Refused(f"vllm=={version}: {found} has no {function}", NO_KERNEL)
            if owner:
                source = _lifted(source, found, owner, method, version)
                function = method
            helpers = {}
            for name, module_path in _imported_helpers(source, found, function).items():
                if module_path in names:
                    helpers[name] = (module_path, _member_text(zf, module_path, record, wheel))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError) as exc:
        raise BadInput(f"vllm=={version}: the wheel is unreadable: {exc}") from None
    return found, source, helpers


def _lifted(source: str, path: str, owner: str, method: str, version: str) -> str:
    """``source`` with ``owner.method`` (a ``@staticmethod`` whose next decorator is ``@triton.jit``) appended as a
    top-level function of the same name: its text from the jit decorator on, dedented, the ``@staticmethod`` line
    left behind. A method of another shape, or a name the module defines already, is one line (``Refused``)."""
    tree = ast.parse(source)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner), None)
    fn = next((n for n in (cls.body if cls else ()) if isinstance(n, ast.FunctionDef) and n.name == method), None)
    if fn is None:
        raise Refused(f"vllm=={version}: {path} has no {owner}.{method}", NO_KERNEL)
    decorators = [ast.unparse(d) for d in fn.decorator_list]
    if len(decorators) != 2 or decorators[0] != "staticmethod" or not is_jit(fn):
        raise Refused(f"vllm=={version}: {path}: {owner}.{method} is decorated {', '.join(decorators) or 'by nothing'}"
                      ", not @staticmethod then @triton.jit; kvfence does not know this shape", ABI_UNSUPPORTED)
    taken = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    taken |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    require(method not in taken, f"vllm=={version}: {path} defines {method} at the top level too; kvfence cannot "
                                 f"lift {owner}.{method} beside it")
    lines = source.splitlines(keepends=True)
    first = fn.decorator_list[1].lineno
    body = textwrap.dedent("".join(lines[first - 1:fn.end_lineno]))
    return source.rstrip("\n") + f"\n\n\n# {owner}.{method}, lines {first}-{fn.end_lineno}\n" + body


def _member_text(zf: zipfile.ZipFile, name: str, record: Dict[str, str], wheel: Path) -> str:
    data = member_bytes(zf, name)
    digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    require(record.get(name) == digest, f"wheel {wheel.name} is corrupt: {name} does not match its RECORD hash")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"wheel {wheel.name} is corrupt: {name} is not UTF-8") from None


def _imported_helpers(source: str, path: str, function: str) -> Dict[str, str]:
    """``{name: module path in the wheel}`` of the names the kernel (and the module's jit functions it calls) reads
    that the module imports from another module of vLLM (``from vllm.a.b import name``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise BadInput(f"{path} does not parse: {exc.msg} (line {exc.lineno})") from None
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    imported = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == PACKAGE:
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
    out, seen, todo = {}, set(), [function]
    while todo:
        fn = functions.get(todo.pop())
        if fn is None or fn.name in seen:
            continue
        seen.add(fn.name)
        for sub in ast.walk(fn):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                if sub.id in functions:
                    todo.append(sub.id)
                elif sub.id in imported and imported[sub.id][0] != f"{PACKAGE}.triton_utils":
                    module, name = imported[sub.id]
                    assert module is not None  # an import from PACKAGE (the test above)
                    require(name == sub.id, f"{path}: {fn.name} reads {sub.id}, imported as another name "
                                            f"({name} of {module}); kvfence extracts a helper by its own name")
                    out[sub.id] = module.replace(".", "/") + ".py"
    return out


def _with_helpers(source: str, path: str, helpers: Dict[str, Tuple[str, str]], version: str) -> str:
    """The module's source with its imports of ``helpers`` removed (the lines kept, blank) and each helper's
    extraction from its own module appended: one module ``extract`` reads as a whole. A helper that is no
    ``@triton.jit`` function, or reads anything but Triton, literals and jit code, is one line."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    taken = set(helpers)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) in taken for a in node.names):
            for i in range(node.lineno - 1, node.end_lineno or node.lineno):  # a parsed node has its end line
                lines[i] = "\n"
    own = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    parts = ["".join(lines)]
    for name, (module_path, module_source) in sorted(helpers.items()):
        try:
            defs = {n.name: n for n in ast.parse(module_source).body if isinstance(n, ast.FunctionDef)}
        except SyntaxError as exc:
            raise BadInput(f"vllm=={version}: {module_path} does not parse: {exc.msg}") from None
        require(name in defs and is_jit(defs[name]), f"vllm=={version}: {path} imports {name} from {module_path}, "
                                                     "which is not a @triton.jit function there")
        text, functions = extract(module_source, module_path, roots=(name,))
        clash = sorted(own & set(functions))
        require(not clash, f"vllm=={version}: {module_path} defines {', '.join(clash)}, which {path} defines too")
        parts.append(f"\n\n# from {module_path}\n" + text)
    return "".join(parts)


