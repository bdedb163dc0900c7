"""Extracting a release's jit kernels from its source, as data: the functions wanted and exactly what they need.

``extract(source, path, roots)`` parses a module of a wheel with ``ast`` (never importing or running it) and
writes a standalone module: the ``@triton.jit`` functions ``roots`` name, the jit helpers and module-level
constants they read (a constant only when its value reads literals, Triton and other such constants), and
``import triton`` / ``import triton.language as tl``. Anything else they read is ``BadInput``: kvfence runs
only jit code a release defines, under Triton. Every piece taken is admitted by the kernel text rule
(``kvfence.release.kernel_text``: an allow-list of what Triton kernels are written with), and ``check_entry``
admits a cache entry's module by the same rule each time it is read back, before it is imported.
"""

from __future__ import annotations

import ast
import json
from typing import Any, Dict, List, Tuple

from kvfence.errors import BadInput, require
from kvfence.release.kernel_text import BUILTINS, check_constant, check_function, check_kernel_text, check_nodes


def is_jit(fn: ast.FunctionDef) -> bool:
    for deco in fn.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if ast.unparse(target) in ("triton.jit", "jit"):
            return True
    return False


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
        if name not in stored and name not in BUILTINS and name not in seen:
            seen.append(name)
    return seen


def extract(source: str, source_path: str, roots: Tuple[str, ...]) -> Tuple[str, List[str]]:
    """The standalone module text for the kernels of ``source``, and the jit functions it holds.

    Starts from ``roots`` (the kernels wanted) and follows every name they read: a top-level ``@triton.jit`` function is
    taken (and followed), a top-level constant is taken when its value only reads literals, Triton and
    other such constants, ``triton`` / ``tl`` come from the standard imports. Each piece is admitted by the kernel
    text rule (``kvfence.release.kernel_text``) as it is taken, naming ``source_path:line`` when it is not; anything
    else it reads is ``BadInput`` too.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise BadInput(f"{source_path} does not parse: {getattr(exc, 'msg', type(exc).__name__)} "
                       f"(line {getattr(exc, 'lineno', '?')})") from None
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    imports, future = _top_imports(tree)
    taken = _taken(functions, _top_constants(tree), imports, roots, source_path)
    nodes = sorted(set(taken.values()), key=lambda n: n.lineno)
    check_nodes(nodes, source_path)  # the module as it will be written, with the wheel's line numbers
    parts = ["from __future__ import annotations\n\n"] if future else []
    parts.append("import triton\nimport triton.language as tl\n")
    lines = source.splitlines(keepends=True)
    for node in nodes:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        parts.append(("\n\n" if isinstance(node, ast.FunctionDef) else "\n")
                     + "".join(lines[start - 1:node.end_lineno]))
    names = [n.name for n in nodes if isinstance(n, ast.FunctionDef)]
    return "".join(parts).rstrip() + "\n", names


def _top_constants(tree: ast.Module) -> Dict[str, ast.stmt]:
    """The module's top-level assignments, by the names they assign."""
    constants: Dict[str, ast.stmt] = {}
    for node in tree.body:
        targets: List[ast.expr]
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                constants[target.id] = node
    return constants


def _top_imports(tree: ast.Module) -> Tuple[Dict[str, ast.stmt], bool]:
    """The module's top-level imports, by the names they bind, and whether it has ``from __future__ import
    annotations``."""
    imports: Dict[str, ast.stmt] = {}
    future = False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            future = future or any(a.name == "annotations" for a in node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                imports[alias.asname or alias.name.split(".")[0]] = node
    return imports, future


def _taken(functions: Dict[str, ast.FunctionDef], constants: Dict[str, Any], imports: Dict[str, ast.stmt],
           roots: Tuple[str, ...], source_path: str) -> Dict[str, ast.stmt]:
    """The jit functions and constants the ``roots`` reach, each admitted by the kernel text rule as it is taken;
    a name read that is no jit function or admitted constant is ``BadInput``."""
    # What a function may call or read at module level before each name is resolved below (which refuses a
    # function that is no jit function and an import, naming it).
    callable_names, readable = set(functions) | set(imports), set(constants)
    taken: Dict[str, ast.stmt] = {}
    todo = [name for name in roots if name in functions]

    def resolve(name: str, user: str) -> None:
        if name in ("triton", "tl") or name in taken:
            return
        if name in functions:
            fn = functions[name]
            require(is_jit(fn), f"{source_path}: {user} calls {name}, which is not a @triton.jit function")
            todo.append(name)
        elif name in constants:
            node = constants[name]
            check_constant(node, source_path)
            taken[name] = node
            assert node.value is not None  # constants holds annotated assignments with a value only
            for inner in _free_names(node.value, set()):
                resolve(inner, name)
        elif name in imports:
            raise BadInput(f"{source_path}: {user} uses {name!r}, imported by {ast.unparse(imports[name])!r}; "
                           "kvfence extracts only jit code and constants, with triton and triton.language as tl")
        else:
            raise BadInput(f"{source_path}: {user} reads {name!r}, which kvfence cannot resolve")

    while todo:
        name = todo.pop()
        if name in taken:
            continue
        fn = functions[name]
        check_function(fn, source_path, callable_names, readable)
        taken[name] = fn
        for free in _free_names(fn, {name}):
            resolve(free, name)
    return taken


def entry_header(text: str) -> str:
    """The docstring an extracted module starts with: ``text`` as one string literal whatever it holds (a wheel's
    member and file names are data: no quote or newline in them ends the docstring)."""
    return json.dumps(text) + "\n"


def check_entry(text: str, where: str, functions: set) -> None:
    """A cache entry's module, before it is imported: admitted by the kernel text rule (``BadInput`` naming
    ``where:line``) and defining exactly the jit functions its manifest lists."""
    tree = check_kernel_text(text, where)
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    require(functions == defined, f"{where}: functions {sorted(defined)} != manifest {sorted(functions)}")
