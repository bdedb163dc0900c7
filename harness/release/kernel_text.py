"""The kernel text kvfence admits from a release's wheel: an allow-list of what Triton kernels are written with.

A release's ``@triton.jit`` function is Python: Triton's CPU interpreter (``TRITON_INTERPRET=1``) runs its body as
Python, and importing its module runs its decorators, defaults and module-level constants. So every kernel text
kvfence takes from a wheel, and every cache entry it imports, is admitted by one rule (docs/security.md, "Kernel
text from a wheel"), checked on the syntax tree before anything is written to the cache and again each time an
entry is read back:

* the module holds only ``from __future__ import annotations``, ``import triton``, ``import triton.language as
  tl``, string docstrings, constants and ``@triton.jit`` functions (decorated by ``triton.jit`` alone, or by
  ``triton.jit(...)`` with literal keyword arguments);
* a constant's value is data: numbers, other constants, ``tl.constexpr(...)`` of them and ``tl`` dtypes, with
  ``+ - * // % & | ^ << >> **`` whose results stay below ``2**64`` (computed here, never by Python's import);
* a function body holds assignments to plain names, ``for``/``while``/``if``, ``return``, ``assert``, ``pass``,
  ``break``, ``continue`` and expression statements, over arithmetic, comparisons, boolean operators,
  conditional expressions, subscripts, tuples, lists and literals;
* a name it reads is a parameter or a local of the function, a jit function or constant of the module, ``tl``,
  ``triton`` or one of ``BUILTINS``; no name, attribute, parameter or keyword is a dunder, and ``tl``,
  ``triton`` and the builtins are never rebound;
* an attribute is ``tl.NAME`` with NAME in ``TL_ATTRS``, ``triton.NAME`` with NAME in ``TRITON_ATTRS``, or, on
  any other value (a tensor, a dtype), one of ``VALUE_ATTRS``;
* a call calls a jit function of the module, one of ``BUILTINS`` (positional arguments only: ``max(key=f)`` calls
  ``f``), an allowed ``tl``/``triton`` attribute, or a value's ``.to(...)``; never a local, never a call's
  result, no ``*args``/``**kwargs``;
* defaults are literals or the module's constants; annotations are ``tl``/``triton`` attributes or
  ``int``/``float``/``bool``.

Anything else (``lambda``, comprehensions, ``getattr``, ``exec``, ``open``, ``import`` in a body, ``global``,
``:=``, f-strings, nested ``def``, ``with``/``try``, another decorator) is ``BadInput`` naming ``file:line``.
The lists were derived from the kernels of every SGLang wheel 0.5.3.post3-0.5.23 and vLLM 0.34.0 kvfence reads
(they use ``range``, 16 ``tl`` names and ``.to``), widened only by pure Triton language operations.

``check_kernel_text(text, where)`` is the one entry point for any module of kernel text (a contract's release
kernel, whatever project it comes from); ``check_function``/``check_constant``/``check_nodes`` serve the
extractor, which checks each piece of a wheel's module as it takes it (naming the wheel's file and line).
"""

from __future__ import annotations

import ast
from typing import Iterable, List, NoReturn, Optional, Sequence, cast

from kvfence.errors import BadInput

#: The builtins a kernel may name: real kernels use ``range`` only; the others are pure conversions.
BUILTINS = frozenset({"range", "min", "max", "abs", "int", "float", "bool", "len"})
#: ``tl.NAME``: what the real kernels read (the first two lines), then pure language operations and dtypes.
TL_ATTRS = frozenset({
    "arange", "cast", "cdiv", "constexpr", "int32", "int64", "load", "maximum", "minimum", "multiple_of",
    "num_programs", "pointer_type", "program_id", "store", "sum", "where",
    "abs", "assume", "atomic_add", "atomic_max", "atomic_min", "broadcast_to", "clamp", "cumsum", "device_assert",
    "expand_dims", "full", "max", "max_contiguous", "min", "range", "reshape", "static_assert", "static_range",
    "zeros", "int1", "int8", "int16", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16", "float32",
    "float64",
})
#: ``triton.NAME``: the decorator and the host-side helpers a kernel may call.
TRITON_ATTRS = frozenset({"jit", "cdiv", "next_power_of_2"})
#: The module aliases a kernel reads, and the attributes each admits.
ALIASES = {"tl": TL_ATTRS, "triton": TRITON_ATTRS}
#: An attribute of any other value (a tensor, a pointer, a dtype); only ``.to`` is called.
VALUE_ATTRS = frozenset({"to", "dtype", "element_ty", "shape"})
VALUE_METHODS = frozenset({"to"})
#: The module-level imports an extracted module holds (the extractor writes them).
IMPORTS = frozenset({"from __future__ import annotations", "import triton", "import triton.language as tl"})
#: Annotation names besides ``tl``/``triton`` attributes.
ANNOTATION_NAMES = frozenset({"int", "float", "bool"})
#: The largest magnitude a module-level constant may reach (computed here, operation by operation).
CONSTANT_LIMIT = 1 << 64

_STATEMENTS = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.While, ast.If, ast.Break, ast.Continue,
               ast.Pass, ast.Return, ast.Expr, ast.Assert)
_EXPRESSIONS = (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Call, ast.Attribute,
                ast.Subscript, ast.Slice, ast.Name, ast.Constant, ast.Tuple, ast.List)
_CONSTANT_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
                 ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b, ast.BitAnd: lambda a, b: a & b,
                 ast.BitOr: lambda a, b: a | b, ast.BitXor: lambda a, b: a ^ b}
_SMALL_SHIFTS = {ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b, ast.Pow: lambda a, b: a ** b}


def _dunder(name: Optional[str]) -> bool:
    return isinstance(name, str) and name.startswith("__")


class _Refusal:
    """Raises the one line: ``where:line: what``."""

    def __init__(self, where: str):
        self.where = where

    def __call__(self, node, what: str) -> NoReturn:
        raise BadInput(f"{self.where}:{getattr(node, 'lineno', '?')}: {what}; kvfence admits only Triton kernel "
                       "text from a wheel (docs/security.md)")

    def require(self, ok: bool, node, what: str) -> None:
        if not ok:
            self(node, what)


def _unparse(node) -> str:
    try:
        return ast.unparse(node)[:80]
    except (ValueError, RecursionError):
        return type(node).__name__


def _no_dunder(refuse: _Refusal, tree) -> None:
    """No dunder name, attribute or keyword anywhere in ``tree``: the first thing an escape reaches for."""
    for node in ast.walk(tree):
        name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
                else node.arg if isinstance(node, (ast.keyword, ast.arg)) else None)
        refuse.require(not _dunder(name), node, f"{name!r} is a dunder name")


def _bindable(refuse: _Refusal, node, name: str) -> None:
    refuse.require(not _dunder(name), node, f"the name {name!r} is a dunder")
    refuse.require(name not in ALIASES and name not in BUILTINS, node, f"{name!r} is rebound")


# -- functions ---------------------------------------------------------------------------------------------------
def check_function(fn, where: str, functions: Iterable[str], constants: Iterable[str]) -> None:
    """``fn`` (a top-level ``def``) is a ``@triton.jit`` function by the rule, reading only its own parameters and
    locals, ``functions`` (which it may call) and ``constants`` of its module, ``tl``, ``triton`` and ``BUILTINS``."""
    refuse = _Refusal(where)
    refuse.require(isinstance(fn, ast.FunctionDef), fn, f"{type(fn).__name__} is not a @triton.jit function")
    _no_dunder(refuse, fn)
    _bindable(refuse, fn, fn.name)
    odd = [d for d in fn.decorator_list if not _jit_decorator(d)] or fn.decorator_list[1:]
    refuse.require(len(fn.decorator_list) == 1 and not odd, odd[0] if odd else fn,
                   f"{fn.name} is decorated other than by @triton.jit "
                   f"({', '.join(_unparse(d) for d in fn.decorator_list) or 'no decorator'})")
    a = fn.args
    refuse.require(not (a.vararg or a.kwarg or a.posonlyargs or a.kwonlyargs), fn,
                   f"{fn.name} has *args, **kwargs, positional-only or keyword-only parameters")
    for arg in a.args:
        _bindable(refuse, arg, arg.arg)
        if arg.annotation is not None:
            _annotation(refuse, arg.annotation)
    if fn.returns is not None:
        _annotation(refuse, fn.returns)
    for default in a.defaults:
        _default(refuse, default, set(constants))
    local = {arg.arg for arg in a.args}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            _bindable(refuse, node, node.id)
            local.add(node.id)
    body = fn.body[1:] if fn.body and _docstring(fn.body[0]) else fn.body
    _Body(refuse, set(functions), set(constants), local).statements(body)


def _jit_decorator(node) -> bool:
    if isinstance(node, ast.Call):
        return (not node.args and _is_attr(node.func, "triton", "jit")
                and all(k.arg is not None and not _dunder(k.arg) and _literal(k.value) for k in node.keywords))
    return _is_attr(node, "triton", "jit")


def _is_attr(node, alias: str, name: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Name)
            and node.value.id == alias)


def _literal(node) -> bool:
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool, str, type(None)))


def _docstring(stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _annotation(refuse: _Refusal, node) -> None:
    ok = (isinstance(node, ast.Name) and node.id in ANNOTATION_NAMES) or (
        isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ALIASES
        and node.attr in ALIASES[node.value.id])
    refuse.require(ok, node, f"the annotation {_unparse(node)!r} is not a tl/triton attribute or int/float/bool")


def _default(refuse: _Refusal, node, constants: set) -> None:
    """A default is evaluated at import, and a parameter holding a builtin (``f=exec``) could be handed to one
    that calls it: literals and the module's constants only."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    ok = (isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool, str, type(None)))) or (
        isinstance(node, ast.Name) and node.id in constants)
    refuse.require(ok, node, f"the default {_unparse(node)!r} is not a literal or a constant")


class _Body:
    """A jit function's statements and expressions, by the rule (``check_function``)."""

    def __init__(self, refuse: _Refusal, functions: set, constants: set, local: set):
        self.refuse, self.functions, self.constants, self.local = refuse, functions, constants, local

    def statements(self, body: Sequence) -> None:
        for stmt in body:
            self.statement(stmt)

    def statement(self, stmt) -> None:
        refuse = self.refuse
        refuse.require(isinstance(stmt, _STATEMENTS), stmt,
                       f"a {type(stmt).__name__} statement ({_unparse(stmt)!r}) is not kernel code")
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                self.target(target)
            self.expr(stmt.value)
        elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
            self.target(stmt.target)
            refuse.require(isinstance(stmt.target, ast.Name), stmt, "an augmented or annotated target not a name")
            if isinstance(stmt, ast.AnnAssign):
                _annotation(refuse, stmt.annotation)
            if stmt.value is not None:
                self.expr(stmt.value)
        elif isinstance(stmt, ast.For):
            self.target(stmt.target)
            self.expr(stmt.iter)
            self.statements(stmt.body + stmt.orelse)
        elif isinstance(stmt, (ast.While, ast.If)):
            self.expr(stmt.test)
            self.statements(stmt.body + stmt.orelse)
        elif isinstance(stmt, ast.Assert):
            self.expr(stmt.test)
            if stmt.msg is not None:
                self.expr(stmt.msg)
        elif isinstance(stmt, (ast.Return, ast.Expr)) and stmt.value is not None:
            self.expr(stmt.value)

    def target(self, node) -> None:
        if isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                self.target(elt)
            return
        self.refuse.require(isinstance(node, ast.Name), node, f"assigning to {_unparse(node)!r}, not to a name")

    def expr(self, node) -> None:
        refuse = self.refuse
        refuse.require(isinstance(node, _EXPRESSIONS), node,
                       f"a {type(node).__name__} ({_unparse(node)!r}) is not kernel code")
        if isinstance(node, ast.Name):
            self.name(node)
        elif isinstance(node, ast.Attribute):
            self.attribute(node)
        elif isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, ast.Constant):
            refuse.require(not isinstance(node.value, bytes), node, "a bytes literal is not kernel code")
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)

    def name(self, node: ast.Name) -> None:
        refuse = self.refuse
        refuse.require(not _dunder(node.id), node, f"the name {node.id!r} is a dunder")
        if isinstance(node.ctx, ast.Store):
            return
        known = self.local | self.functions | self.constants
        refuse.require(node.id in known or node.id in ALIASES or node.id in BUILTINS,
                       node, f"{node.id!r} is not a parameter, a local, a jit function or constant of the module, "
                             f"tl, triton or one of the builtins {', '.join(sorted(BUILTINS))}")

    def attribute(self, node: ast.Attribute) -> None:
        refuse, value = self.refuse, node.value
        refuse.require(isinstance(node.ctx, ast.Load), node, f"assigning to the attribute {_unparse(node)!r}")
        refuse.require(not _dunder(node.attr), node, f"the attribute {node.attr!r} is a dunder")
        if isinstance(value, ast.Name) and value.id in ALIASES:
            refuse.require(node.attr in ALIASES[value.id], node,
                           f"{value.id}.{node.attr} is not one of the {value.id} names a kernel may use")
            return
        self.expr(value)  # what it is read from first: an unknown name says more than its attribute
        refuse.require(node.attr in VALUE_ATTRS, node, f"the attribute .{node.attr} of {_unparse(value)!r} is not "
                                                       f"one of {', '.join(sorted(VALUE_ATTRS))}")

    def call(self, node: ast.Call) -> None:
        refuse, func = self.refuse, node.func
        if isinstance(func, ast.Name):
            callable_ = func.id not in self.local and (func.id in BUILTINS or func.id in self.functions)
            refuse.require(callable_, node, f"calling {func.id!r}, which is not a jit function of the module or "
                                            f"one of {', '.join(sorted(BUILTINS))}")
            self.name(func)
            # min/max(key=...) would call what it is given: a builtin takes positional arguments only.
            refuse.require(func.id not in BUILTINS or not node.keywords, node,
                           f"calling {func.id} with keyword arguments ({_unparse(node)!r})")
        elif isinstance(func, ast.Attribute):
            self.attribute(func)
            aliased = isinstance(func.value, ast.Name) and func.value.id in ALIASES
            refuse.require(aliased or func.attr in VALUE_METHODS, node,
                           f"calling .{func.attr} of {_unparse(func.value)!r}, which is not a kernel method")
        else:
            self.expr(func)  # what it calls first: an escape inside says more than the call of its result
            refuse(node, f"calling {_unparse(func)!r}, the result of an expression")
        for arg in node.args:
            refuse.require(not isinstance(arg, ast.Starred), arg, "a *argument")
            self.expr(arg)
        for kw in node.keywords:
            refuse.require(kw.arg is not None, kw.value, "a **argument")
            refuse.require(not _dunder(kw.arg), kw.value, f"the keyword {kw.arg!r} is a dunder")
            self.expr(kw.value)


# -- constants ---------------------------------------------------------------------------------------------------
def check_constant(node, where: str, known: Optional[dict] = None):
    """The value of a module-level ``NAME = value`` (or ``NAME: annotation = value``) whose value is data by the
    rule, computed here over ``known`` (the constants before it; None: any other name reads as an unknown number).
    ``None`` stands for a value not computed (a Triton dtype, an unknown constant)."""
    refuse = _Refusal(where)
    _no_dunder(refuse, node)
    targets: List[ast.expr]
    if isinstance(node, ast.AnnAssign):
        targets = [node.target]
        _annotation(refuse, node.annotation)
        refuse.require(node.value is not None, node, "an annotation without a value")
    elif isinstance(node, ast.Assign):
        targets = node.targets
    else:
        refuse(node, f"a {type(node).__name__} statement ({_unparse(node)!r}) is not a constant")
    for target in targets:
        if not isinstance(target, ast.Name):
            refuse(target, f"assigning to {_unparse(target)!r}, not to a name")
        _bindable(refuse, target, target.id)
    return _constant_value(refuse, node.value, known)


def _constant_value(refuse: _Refusal, node, known: Optional[dict]):
    """The value of a constant's expression (a number, or ``None`` for a Triton dtype / an unknown constant)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
        refuse.require(abs(cast(float, node.value)) < CONSTANT_LIMIT, node, "a constant past 2**64")  # a number
        return node.value
    if isinstance(node, ast.Name):
        refuse.require(not _dunder(node.id) and node.id not in ALIASES and node.id not in BUILTINS, node,
                       f"a constant reads {node.id!r}")
        refuse.require(known is None or node.id in known, node, f"a constant reads {node.id!r}, not a constant")
        return None if known is None else known[node.id]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "tl":
        refuse.require(node.attr in TL_ATTRS and node.attr != "constexpr", node,
                       f"a constant reads tl.{node.attr}")
        return None
    if isinstance(node, ast.Call) and _is_attr(node.func, "tl", "constexpr"):
        refuse.require(len(node.args) == 1 and not node.keywords, node, "tl.constexpr of other than one value")
        return _constant_value(refuse, node.args[0], known)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Invert)):
        value = _constant_value(refuse, node.operand, known)
        refuse.require(value is None or not isinstance(node.op, ast.Invert) or isinstance(value, int), node,
                       "~ of a float")
        return None if value is None else {ast.USub: lambda v: -v, ast.UAdd: lambda v: v,
                                           ast.Invert: lambda v: ~v}[type(node.op)](value)
    if isinstance(node, ast.BinOp) and type(node.op) in {**_CONSTANT_OPS, **_SMALL_SHIFTS}:
        left, right = _constant_value(refuse, node.left, known), _constant_value(refuse, node.right, known)
        if isinstance(node.op, tuple(_SMALL_SHIFTS)):
            refuse.require(isinstance(node.right, ast.Constant) and type(node.right.value) is int
                           and 0 <= node.right.value <= 64, node, f"{_unparse(node)!r}: a shift or power past 64")
        if left is None or right is None:
            return None
        try:
            value = {**_CONSTANT_OPS, **_SMALL_SHIFTS}[type(node.op)](left, right)
        except (ArithmeticError, TypeError, ValueError) as exc:
            refuse(node, f"{_unparse(node)!r} does not compute ({type(exc).__name__})")
        refuse.require(abs(value) < CONSTANT_LIMIT, node, f"{_unparse(node)!r} is past 2**64")
        return value
    refuse(node, f"a constant's value {_unparse(node)!r} is not numbers, constants, tl.constexpr and tl dtypes")


# -- modules -----------------------------------------------------------------------------------------------------
def check_nodes(nodes: Sequence, where: str) -> None:
    """The top-level statements of a module of kernel text, by the rule; ``BadInput`` naming ``where:line``."""
    refuse = _Refusal(where)
    functions = {n.name for n in nodes if isinstance(n, ast.FunctionDef)}
    known: dict = {}
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = check_constant(node, where, known)
            # check_constant admitted only names as targets
            known.update((t.id, value) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                         if isinstance(t, ast.Name))
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            refuse.require(_unparse(node) in IMPORTS, node, f"the import {_unparse(node)!r} is not one of "
                                                            f"{', '.join(sorted(IMPORTS))}")
        elif isinstance(node, ast.FunctionDef):
            check_function(node, where, functions, known)
        elif not (isinstance(node, (ast.Assign, ast.AnnAssign)) or _docstring(node)):
            refuse(node, f"a {type(node).__name__} statement ({_unparse(node)!r}) at module level is not kernel code")


def check_kernel_text(text: str, where: str) -> ast.Module:
    """Admit a module of kernel text (an extracted release kernel, or a cache entry of one) or refuse it:
    ``BadInput`` in one line naming ``where:line`` and what is not allowed (docs/security.md). Returns the
    parsed module. Call it on any text of a wheel's kernel before it is written where kvfence imports from, and
    on every such file before it is imported."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None) or "?"
        raise BadInput(f"{where}:{line}: does not parse ({type(exc).__name__}); kvfence admits only Triton kernel "
                       "text from a wheel (docs/security.md)") from None
    try:
        check_nodes(tree.body, where)
    except RecursionError:
        raise BadInput(f"{where}: nested too deep; kvfence admits only Triton kernel text from a wheel") from None
    return tree
