"""Kernel specs: what a run's ``--kernel`` names, resolved to a kernel of the contract's ABI.

A spec is ``reference`` (the contract's own kernel, ``Contract.reference``), ``mutant:NAME`` (one of its planted
bugs: the reference's file with the mutant's patch applied, or the mutant's own kernel), a release
``SOURCE==VERSION[:attr]`` (``sglang==0.5.23``: the release's kernel, extracted from its wheel as data by the
kernel source registered under the entry-point group ``kvfence.kernel_sources``, never imported as shipped), or
a plug-in ``file.py:attr`` / ``module:attr`` (user code, imported in a throwaway process first:
``kvfence.engine.probe``). A resolved kernel must be a ``@triton.jit`` function taking the reference's
parameters (``check_abi``): anything else is one line naming the spec, never a launch that fails.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from kvfence.contract import Contract, Mutant
from kvfence.errors import BadInput, require

#: Kernel specs a case file may name that run no code the file chose.
TRUSTED = ("reference", "mutant:")
#: ``SOURCE==VERSION[:attr]``: a release of an upstream project (a kernel source).
RELEASE = re.compile(r"^([a-z][a-z0-9_-]*)==")
SOURCES_GROUP = "kvfence.kernel_sources"


def references(record: Contract[Any]) -> Dict[str, str]:
    """The contract's own kernels by name: ``{"reference": record.reference}``, or its ``reference`` mapping
    (``reference`` first; the others are the same ABI launched another way, which ``launch`` reads from
    ``Launch.kernel``)."""
    ref = record.reference
    return dict(ref) if isinstance(ref, Mapping) else {"reference": ref}


def reference_spec(record: Contract[Any]) -> str:
    """``module:attr`` of the contract's reference kernel."""
    return references(record)["reference"]


def release_source(spec: str) -> Optional[str]:
    """The source name of a release spec (``sglang`` of ``sglang==0.5.23``), or None."""
    match = RELEASE.match(spec) if isinstance(spec, str) else None
    return match.group(1) if match else None


def is_plugin(spec: object) -> bool:
    """A ``module:attr`` / ``file.py:attr`` spec (a kernel's or a sizing's): user code, which a case file never
    makes kvfence import. The one test of it: every command asks here."""
    return isinstance(spec, str) and ":" in spec and not (spec.startswith("mutant:") or release_source(spec))


def sizing_is_plugin(record: Contract[Any], spec: str) -> bool:
    """A sizing spec naming user code (not one of ``record``'s named sizings nor a release's shipped sizing,
    ``SOURCE==VERSION:...``), which a case file never makes kvfence import: ``repro`` asks for it again."""
    return is_plugin(spec) and spec not in list(record.sizings)


def check_spec(spec: object, what: str = "kernel", record: Optional[Contract[Any]] = None) -> None:
    """Syntax only (``BadInput`` unless ``spec`` looks like a kernel spec); imports nothing."""
    if not (isinstance(spec, str) and spec and "\n" not in spec and len(spec) <= 4096):
        raise BadInput(f"{what} spec must be a non-empty one-line string, got {str(spec)[:80]!r}")
    if spec.startswith("mutant:") or release_source(spec):
        return
    if ":" not in spec:
        require(record is None or spec in references(record),
                f"unknown {what} {spec!r}: expected "
                f"{', '.join(references(record)) if record is not None else 'reference'}, mutant:NAME, "
                "SOURCE==VERSION, module:attr or file.py:attr")
        return
    where, _, attr = spec.rpartition(":")
    require(bool(where and attr), f"unknown {what} {spec!r}: expected reference, mutant:NAME, SOURCE==VERSION, "
                                  "module:attr or file.py:attr")


# -- loading user code ---------------------------------------------------------------------------------------
def load_file(path: Path) -> ModuleType:
    """Import a plug-in file once per process (kernel and sizing specs may name the same file)."""
    resolved = path.resolve()
    name = "kvfence_plugin_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:16]
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None) == str(resolved):
        return module
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise ImportError(f"cannot import {resolved} (not a Python source file)")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # triton.jit needs the module to be importable by name
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def import_module(name: str) -> ModuleType:
    """Import ``name`` as ``python -m`` would from the current folder: the folder is on the import path
    (appended, so an installed package of the same name still wins), in every process that resolves a spec."""
    here = os.getcwd()
    if not any(os.path.abspath(p or os.curdir) == here for p in sys.path):
        sys.path.append(here)
        importlib.invalidate_caches()
    return importlib.import_module(name)


def load_attr(spec: str, what: str) -> Any:
    """The attribute a ``module:attr`` or ``file.py:attr`` spec names; every failure is one line (``BadInput``)."""
    require(":" in spec, f"unknown {what} {spec!r}: expected a builtin name, module:attr or file.py:attr")
    where, _, attr = spec.rpartition(":")
    require(where and attr, f"malformed {what} spec {spec!r}: expected module:attr or file.py:attr")
    try:
        if where.endswith(".py") or os.sep in where:
            path = Path(where)
            require(path.is_file(), f"{what} file {where} does not exist")
            module = load_file(path)
        else:
            module = import_module(where)
    except BadInput:
        raise
    except ModuleNotFoundError as exc:
        raise BadInput(f"cannot import {what} {spec!r}: ModuleNotFoundError: {exc} (looked in the current folder "
                       f"{os.getcwd()} and on sys.path: run from the folder that holds it, set PYTHONPATH, or name a "
                       "file such as path/to/file.py:attr)") from None
    except (Exception, SystemExit) as exc:  # user code's import: bad input, one line
        # Not KeyboardInterrupt: here it is a Ctrl-C (exit 130), in the plug-in probe (kvfence.engine.probe) an
        # import that raises it, reported there as "importing ... raised KeyboardInterrupt".
        raise BadInput(f"cannot import {what} {spec!r}: {type(exc).__name__}: {exc}") from None
    require(hasattr(module, attr), f"{what} {spec!r}: {where} has no attribute {attr!r}")
    return getattr(module, attr)


def module_file(spec: str) -> Path:
    """The file of the module a ``module:attr`` spec names, found without importing it."""
    where = spec.rpartition(":")[0]
    if where.endswith(".py") or os.sep in where:
        return Path(where)
    found = importlib.util.find_spec(where)
    if found is None or not found.origin:
        raise BadInput(f"cannot find the module of {spec!r}")
    return Path(found.origin)


# -- triton kernels ------------------------------------------------------------------------------------------
def is_triton_kernel(obj: object) -> bool:
    """A ``@triton.jit`` function (compiled or interpreted), or an autotune / heuristics wrapper of one."""
    return hasattr(obj, "fn") and hasattr(obj, "run") and callable(obj.fn)


def unwrap(kernel: Any) -> Tuple[Any, Any, Set[str]]:
    """``(jit_function, python_function, names the wrappers supply)`` of a possibly autotuned kernel."""
    supplied: Set[str] = set()
    jit = kernel
    while is_triton_kernel(jit) and is_triton_kernel(jit.fn):
        for config in getattr(jit, "configs", None) or []:  # triton.autotune
            supplied.update(getattr(config, "kwargs", {}))
        supplied.update(getattr(jit, "values", None) or {})  # triton.heuristics
        jit = jit.fn
    return jit, jit.fn, supplied


def parameters(kernel: Any) -> Tuple[str, ...]:
    """The parameter names of a ``@triton.jit`` kernel's Python function."""
    _, fn, _ = unwrap(kernel)
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


def check_abi(record: Contract[Any], spec: str, kernel: Any) -> None:
    """``BadInput`` unless ``kernel`` is a ``@triton.jit`` function taking as many parameters as the contract's
    reference kernel (an int, a class, a plain function or another ABI's kernel is refused before any launch)."""
    require(is_triton_kernel(kernel), f"kernel {spec!r} is {type(kernel).__name__}, not a @triton.jit function of "
                                      f"contract {record.name}'s ABI")
    ours = parameters(load_attr(reference_spec(record), "kernel"))
    theirs = parameters(kernel)
    require(len(theirs) == len(ours), f"kernel {spec!r} takes {len(theirs)} parameters ({', '.join(theirs)}); "
                                      f"contract {record.name}'s ABI takes {len(ours)} ({', '.join(ours)})")


# -- planted bugs --------------------------------------------------------------------------------------------
_SCRATCH: List[Path] = []


def patched_kernel(name: str, patch: Sequence[Sequence[str]], reference: Path, file_name: str) -> Path:
    """A planted bug's kernel file: ``patch`` (``(reference text, mutated text)`` pairs, each matching exactly
    once) applied to ``reference``'s source, written as ``file_name`` in a per-process scratch folder (several
    pytest-xdist workers never share a file); loaded like any plug-in kernel file."""
    require(isinstance(patch, (list, tuple)) and patch and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in patch),
        f"mutant {name}: its patch must be a non-empty list of (reference text, mutated text) pairs")
    source = reference.read_text()
    for old, new in patch:
        found = source.count(old)
        require(found == 1, f"mutant {name}: {old.strip()!r} matches {found} places in {reference.name} "
                            "(a patch must match exactly once)")
        require(old != new, f"mutant {name}: a patch pair leaves {old.strip()!r} unchanged")
        source = source.replace(old, new)
    if not _SCRATCH:
        import tempfile

        _SCRATCH.append(Path(tempfile.mkdtemp(prefix="kvfence-mutants-")))
    path = _SCRATCH[0] / file_name
    path.write_text(f"# kvfence mutant {name!r}: {reference.name} with its planted patch.\n" + source)
    return path


def patched_release(record: Contract[Any], spec: str, project: str) -> Tuple[Path, str]:
    """A planted bug made from a release's text at run time, ``SOURCE==VERSION:MUTANT``: ``(file, function)`` of
    ``project==VERSION``'s kernel of ``record`` (through its kernel source: read from the wheel, admitted by the
    kernel text rule) with the record's mutant ``MUTANT``'s patch applied."""
    source, _, rest = spec.partition("==")
    version, _, name = rest.partition(":")
    require(bool(name), f"kernel {spec!r}: expected {source}==VERSION:MUTANT")
    mutant = mutant_of(record, name)
    require(bool(mutant.patch), f"kernel {spec!r}: mutant {name} of {record.name} has no patch")
    path, function = release_kernel_file(record, f"{project}=={version}")
    return patched_kernel(name, [list(p) for p in mutant.patch], path,
                          f"{project}-{version}-{record.name}-{name}.py"), function


def mutant_kernel_spec(owner: str, mutant: Mutant, reference: str) -> str:
    """The kernel spec of contract ``owner``'s planted bug ``mutant``: its own kernel spec, or ``file.py:attr`` of
    the file of ``reference`` (``module:attr``, the contract's reference kernel) with the mutant's patch applied
    (``patched_kernel``); ``BadInput`` for a sizing mutant."""
    if mutant.kernel:
        return mutant.kernel
    require(bool(mutant.patch), f"mutant {mutant.name} of {owner} is a sizing mutant: run the reference "
                                f"kernel with --sizing {mutant.sizing}")
    path = module_file(reference)
    patched = patched_kernel(mutant.name, [list(p) for p in mutant.patch], path,
                             f"{path.stem}-{owner}-{mutant.name}.py")
    return f"{patched}:{reference.rpartition(':')[2]}"


def mutant_of(record: Contract[Any], name: str) -> Mutant:
    """The record's planted bug ``name`` (``BadInput`` naming the known ones otherwise)."""
    known = {m.name: m for m in record.mutants}
    require(name in known,
            f"contract {record.name}: unknown mutant {name!r}: choose from {', '.join(known) or '(none)'}")
    return known[name]


# -- releases ------------------------------------------------------------------------------------------------
def release_kernel_file(record: Contract[Any], spec: str) -> Tuple[Path, str]:
    """``(file, function)`` of a release spec's kernel for ``record``, from the kernel source registered for its
    project (entry-point group ``kvfence.kernel_sources``): extracted from the release's wheel into the cache,
    as data. ``BadInput`` for a source nobody registered, a release without the kernel, another signature."""
    from importlib.metadata import entry_points

    source = release_source(spec)
    found = [ep for ep in entry_points(group=SOURCES_GROUP) if ep.name == source]
    require(bool(found), f"kernel {spec!r}: no kernel source {source!r} is registered "
                         f"(known: {', '.join(sorted(ep.name for ep in entry_points(group=SOURCES_GROUP))) or 'none'})")
    extract = load_attr(found[0].value, "kernel source")
    where: Tuple[Path, str] = extract(record, spec)
    return where


# -- resolving -----------------------------------------------------------------------------------------------
_RESOLVED: Dict[Tuple[str, str], object] = {}


def resolve(record: Contract[Any], spec: str) -> Any:
    """The ``@triton.jit`` kernel ``spec`` names for ``record`` (see the module docstring), checked against the
    contract's ABI; ``BadInput`` otherwise. Resolved once per process: the same jit function keeps its compiled
    specializations across runs."""
    key = (record.name, spec)
    if key not in _RESOLVED:
        kernel = _resolve(record, spec)
        check_abi(record, spec, kernel)
        _RESOLVED[key] = kernel
    return _RESOLVED[key]


def _resolve(record: Contract[Any], spec: str) -> Any:
    check_spec(spec, record=record)
    named = references(record)
    if spec in named:
        return load_attr(named[spec], "kernel")
    if spec.startswith("mutant:"):
        mutant = mutant_of(record, spec.split(":", 1)[1])
        return _resolve(record, mutant_kernel_spec(record.name, mutant, reference_spec(record)))
    if release_source(spec):
        path, function = release_kernel_file(record, spec)
        return load_attr(f"{path}:{function}", "kernel")
    return load_attr(spec, "kernel")
