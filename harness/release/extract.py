"""Extracting a release's jit kernels from its source, as data: the functions wanted and exactly what they need.

``extract(source, path, roots)`` parses a module of a wheel with ``ast`` (never importing or running it) and
writes a standalone module: the ``@triton.jit`` functions ``roots`` name, the jit helpers and module-level
constants they read (a constant only when its value reads literals, Triton and other such constants), and
``import triton`` / ``import triton.language as tl``. Anything else they read is ``BadInput``: kvfence runs
only jit code a release defines, under Triton.
"""

from __future__ import annotations

import ast
import builtins
from typing import Dict, List, Tuple

from kvfence.errors import BadInput, require


def is_jit(fn: ast.FunctionDef) -> bool:
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


def check_safe_expr(node: ast.AST, what: str) -> None:
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


def extract(source: str, source_path: str, roots: Tuple[str, ...]) -> Tuple[str, List[str]]:
    """The standalone module text for the kernels of ``source``, and the jit functions it holds.

    Starts from ``roots`` (the kernels wanted) and follows every name they read: a top-level ``@triton.jit`` function is
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
            require(is_jit(fn), f"{source_path}: {user} calls {name}, which is not a @triton.jit function")
            todo.append(name)
        elif name in constants:
            node = constants[name]
            check_safe_expr(node.value, f"{source_path}: constant {name}")
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
            check_safe_expr(expr, f"{source_path}: {name}")
        taken[name] = fn
        for free in _free_names(fn, {name}):
            resolve(free, name)
    nodes = sorted(set(taken.values()) | set(triton_imports.values()), key=lambda n: n.lineno)
    parts = ["from __future__ import annotations\n\n"] if future else []
    parts.append("import triton\nimport triton.language as tl\n")
    for node in nodes:
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        parts.append(("\n\n" if isinstance(node, ast.FunctionDef) else "\n")
                     + "".join(lines[start - 1:node.end_lineno]))
    names = [n.name for n in nodes if isinstance(n, ast.FunctionDef)]
    return "".join(parts).rstrip() + "\n", names


def _imports_only_triton(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return all(a.name.split(".")[0] == "triton" for a in node.names)
    return (node.module or "").split(".")[0] == "triton" and node.level == 0


def check_extracted(tree: ast.Module, functions: set) -> None:
    for node in tree.body:
        if isinstance(node, ast.Import):
            require(all(a.name in ("triton", "triton.language") for a in node.names), "unexpected import")
        elif isinstance(node, ast.ImportFrom):
            require(node.module == "__future__" or (node.module or "").split(".")[0] == "triton",
                    f"unexpected import from {node.module}")
        elif isinstance(node, ast.FunctionDef):
            require(node.name in functions and is_jit(node), f"unexpected function {node.name}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            # A top-level constant runs when the module is imported: its value (and annotation) may read
            # only literals, Triton and other constants, as extraction requires of every constant it takes
            # (a constant no kernel reads is not checked by extracting again, so it is checked here).
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            require(all(isinstance(t, ast.Name) for t in targets), f"unexpected assignment at line {node.lineno}")
            require(node.value is not None, f"unexpected annotation without a value at line {node.lineno}")
            check_safe_expr(node.value, f"constant at line {node.lineno}")
            if isinstance(node, ast.AnnAssign):
                check_safe_expr(node.annotation, f"annotation at line {node.lineno}")
        elif not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            raise BadInput(f"unexpected statement at line {node.lineno}")
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    require(functions == defined, f"functions {sorted(defined)} != manifest {sorted(functions)}")
