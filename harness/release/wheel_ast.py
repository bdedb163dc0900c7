"""Reading SGLang's wheels as data: expressions of a wheel's source as trees over named quantities, never run.

``Wheel`` holds a wheel's ``.py`` files as text (bounded: ``MAX_MEMBER_BYTES``), parsed with ``ast`` on demand;
nothing of it is imported, executed or evaluated by Python. ``Evaluator`` turns an expression of a function body
(``Site``) into a tree (``["int", v]``, ``["sym", name]``, ``[op, a, b]``, ...) over the quantities of
``SYMBOLS``: integers, ``+ - * //``, ``min``/``max``, local assignments and parameters, ``self`` attributes
assigned in ``__init__``, and calls of helper functions defined in the wheel (their ``return`` expression, read
the same way). Anything else raises ``Unreadable`` with the expression text and ``file:line``: never a guess.
``evaluate`` computes a tree at given values, with bounded work (``MAX_EVAL_STEPS``, ``TREE_MAX_DEPTH``).

Two readers build on it: the draft kernel's shipped sizing (``kvfence.contracts.draft.shipped_wheel``) and the
sites of the contracts that list them (``kvfence.release.contract_shipped``, whose evaluator adds its own symbols).
"""

from __future__ import annotations

import ast
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, NoReturn, Optional, Tuple

from kvfence.errors import BadInput, require

#: The symbol table (docs/contract.md, "Shipped sizing"): a dotted name (or its last component, for the
#: ``*.``-prefixed keys) -> the quantity it stands for. ``requests``: the request count the buffer is sized
#: for (graph: the runner's ``max_bs``; eager: the batch's ``num_seqs``); ``topk``, ``steps``: the server's
#: EAGLE settings; ``ctx``: the model's context length; ``sum_seq_lens``: ``sum(L)`` of the launch.
SYMBOLS = {
    "*.topk": "topk", "*.speculative_eagle_topk": "topk", "topk": "topk",
    "*.speculative_num_steps": "steps", "speculative_num_steps": "steps",
    "*.max_context_len": "ctx", "max_context_len": "ctx",
    "forward_batch.batch_size": "requests",
    "forward_batch.seq_lens_sum": "sum_seq_lens",
    # The runner: its max_bs is the largest capture bucket, in requests (max(self.capture_bs)).
    "runner:self.max_bs": "requests",
}
#: The symbol a width may use: a width is a function of (requests, topk, ctx, steps).
WIDTH_SYMBOLS = ("requests", "topk", "ctx", "steps")
#: The symbols of the host check's used side; ``width`` is the capacity (the launch's buffer width).
CHECK_SYMBOLS = ("requests", "topk", "steps", "sum_seq_lens")
MAX_DEPTH = 12
#: Evaluation steps (sub-expressions expanded) one site may take: the evaluator expands locals and helper
#: returns by value, so ``a1 = a0 * a0; a2 = a1 * a1; ...`` doubles its work per line. SGLang's sites take
#: at most a few hundred (``test_shipped.py`` measures them); past this a site is unreadable, not a hang.
MAX_EVAL_STEPS = 20_000
#: The largest integer literal a site may hold: bigger ones are no buffer width (and cost time to multiply).
MAX_LITERAL = 2 ** 62
#: The largest ``.py`` member read from a wheel (SGLang's largest is well under 1 MB): a bigger one, or a
#: member whose real size exceeds its header (a zip bomb), is left out, so its sites are unreadable.
MAX_MEMBER_BYTES = 8 << 20


class Unreadable(Exception):
    """An expression the evaluator does not know: its text, where it is, and why."""

    def __init__(self, text: str, where: str, why: str):
        super().__init__(f"{why}: {text} ({where})")
        self.text, self.where, self.why = text, where, why


# -- expression trees -------------------------------------------------------------------------------
# ["int", v] | ["sym", name] | [op, a, b] for op in + - * // % | ["min"|"max"|"lcm", a, b, ...]
# | [cmp, a, b] for cmp in == != < <= > >= (1 or 0) | ["if", test, then, else] (the draft reader writes
# only the first four; a contract site's method helpers the rest)
_PREC = {"+": 1, "-": 1, "*": 2, "//": 2, "%": 2}


#: Comparisons (a contract site's ``if``: 1 or 0).
_COMPARE = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
            "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


def render(tree) -> str:
    """The formula a tree stands for, as text over the symbol names."""
    def go(t, outer: int) -> str:
        head = t[0]
        if head == "int":
            return str(t[1])
        if head == "sym":
            return t[1]
        if head in ("min", "max", "lcm"):
            return f"{head}({', '.join(go(a, 0) for a in t[1:])})"
        if head == "if":
            return f"({go(t[2], 0)} if {go(t[1], 0)} else {go(t[3], 0)})"
        if head in _COMPARE:
            return f"{go(t[1], 1)} {head} {go(t[2], 1)}"
        p = _PREC[head]
        left = go(t[1], p)
        right = go(t[2], p + 1 if head in ("-", "//", "%") else p)  # a - (b - c), a // (b * c)
        text = f"{left} {head} {right}"
        return f"({text})" if p < outer else text
    return go(tree, 0)


def evaluate(tree, values: Dict[str, int]) -> int:
    """The integer a tree is for the symbol ``values`` (``BadInput`` on a symbol without a value)."""
    head = tree[0]
    if head == "int":
        return tree[1]
    if head == "sym":
        require(tree[1] in values, f"shipped formula needs {tree[1]!r}, which this site does not bind")
        return values[tree[1]]
    if head == "if":
        return evaluate(tree[2] if evaluate(tree[1], values) else tree[3], values)
    args = [evaluate(a, values) for a in tree[1:]]
    if head == "min":
        return min(args)
    if head == "max":
        return max(args)
    if head == "lcm":
        return math.lcm(*args)
    if head in _COMPARE:
        return int(_COMPARE[head](*args))
    a, b = args
    if head in ("//", "%"):
        require(b != 0, "shipped formula divides by zero")
        return a // b if head == "//" else a % b
    return {"+": a + b, "-": a - b, "*": a * b}[head]


def symbols_of(tree) -> set:
    if tree[0] == "sym":
        return {tree[1]}
    if tree[0] == "int":
        return set()
    return set().union(*(symbols_of(a) for a in tree[1:]))


def substitute(tree, bindings: dict):
    """``tree`` with each ``["sym", name]`` in ``bindings`` replaced by its tree."""
    if tree[0] == "sym":
        return bindings.get(tree[1], tree)
    if tree[0] == "int":
        return tree
    return [tree[0]] + [substitute(a, bindings) for a in tree[1:]]


# -- the record's schema -----------------------------------------------------------------------------
#: The deepest formula tree a record may hold: the reader makes a deeper one an ``unreadable`` site, so that
#: every record it writes passes this check when read back.
TREE_MAX_DEPTH = 64


def tree_depth(tree) -> int:
    """The nesting depth of a formula tree (iterative: a hostile record's tree may be very deep)."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        if isinstance(node, list) and node and node[0] not in ("int", "sym"):
            todo.extend((a, depth + 1) for a in node[1:])
    return deepest


def too_deep(text: str, where: str) -> "Unreadable":
    return Unreadable(text, where, f"formula nested more than {TREE_MAX_DEPTH} deep")


def check_tree(tree, symbols, what: str, depth: int = 0) -> None:
    require(depth <= TREE_MAX_DEPTH, f"{what}: formula nested too deep")
    require(isinstance(tree, list) and tree and isinstance(tree[0], str), f"{what}: a formula is not a tree")
    head, args = tree[0], tree[1:]
    if head == "int":
        require(len(args) == 1 and type(args[0]) is int and abs(args[0]) < 1 << 62, f"{what}: bad integer")
    elif head == "sym":
        require(len(args) == 1 and args[0] in symbols, f"{what}: unknown symbol {args[0]!r}"[:200])
    elif head in ("min", "max", "lcm"):
        require(len(args) >= 2, f"{what}: {head} of fewer than two")
    elif head == "if":
        require(len(args) == 3, f"{what}: if needs a test and two branches")
    elif head in _COMPARE:
        require(len(args) == 2, f"{what}: a comparison of two")
    else:
        require(head in _PREC and len(args) == 2, f"{what}: unknown operation {head!r}"[:200])
    if head not in ("int", "sym"):
        for a in args:
            check_tree(a, symbols, what, depth + 1)


# -- the wheel as text ------------------------------------------------------------------------------
def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> Tuple[Optional[bytes], str]:
    """A wheel member's bytes, or ``None`` and why when it is larger than ``MAX_MEMBER_BYTES``: at most that
    many bytes are ever inflated (a zip bomb's header may lie about its size)."""
    if info.file_size > MAX_MEMBER_BYTES:
        return None, f"{info.file_size} bytes, more than {MAX_MEMBER_BYTES}"
    with zf.open(info) as member:
        data = member.read(MAX_MEMBER_BYTES + 1)
    if len(data) > MAX_MEMBER_BYTES:
        return None, f"more than {MAX_MEMBER_BYTES} bytes once inflated"
    return data, ""


class Wheel:
    """The ``.py`` files of a wheel, read as text and parsed on demand (never imported)."""

    def __init__(self, path: Path):
        self.files: Dict[str, str] = {}
        #: Members left out, and why (too large): their sites read as unreadable.
        self.skipped: Dict[str, str] = {}
        try:
            with zipfile.ZipFile(path) as zf:
                for info in zf.infolist():
                    n = info.filename
                    if not n.endswith(".py") or n.startswith("/") or ".." in n.split("/"):
                        continue
                    data, why = read_member(zf, info)
                    if data is None:
                        self.skipped[n] = why
                        continue
                    self.files[n] = data.decode("utf-8", "replace")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, NotImplementedError) as exc:
            raise BadInput(f"wheel {path} is corrupt: {exc}") from None
        self._trees: Dict[str, Optional[ast.Module]] = {}

    def tree(self, name: str) -> Optional[ast.Module]:
        if name not in self._trees:
            try:
                self._trees[name] = ast.parse(self.files[name])
            except (SyntaxError, ValueError, RecursionError, MemoryError):  # incl. nesting and huge literals
                self._trees[name] = None
                self.skipped[name] = "does not parse (a syntax error, or nested or sized past the parser)"
        return self._trees[name]

    def module_file(self, module: str) -> Optional[str]:
        base = module.replace(".", "/")
        for name in (base + ".py", base + "/__init__.py"):
            if name in self.files:
                return name
        return None

    def classes(self, needle: str):
        """``(file, ClassDef)`` of every top-level class of the files whose text contains ``needle``."""
        for name in sorted(self.files):
            if needle in self.files[name]:
                tree = self.tree(name)
                for node in tree.body if tree else []:
                    if isinstance(node, ast.ClassDef):
                        yield name, node


def dotted(node) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def package_of(file: str) -> str:
    parts = file[:-3].split("/")
    return ".".join(parts[:-1]) if parts[-1] != "__init__" else ".".join(parts[:-1])


@dataclass
class Site:
    """A function body as an evaluation context: its file, its locals (lazy, with their own context)."""

    file: str
    fn: Optional[ast.FunctionDef]
    role: str  # "backend", "runner" or "helper": which SYMBOLS apply
    bound: Dict[str, Tuple[ast.AST, "Site"]]
    self_attrs: Dict[str, List[ast.Assign]]  # runner: self.X assignments of its __init__
    depth: int = 0

    def where(self, node) -> str:
        return f"{self.file}:{getattr(node, 'lineno', '?')}"


class Evaluator:
    """The restricted evaluator: ``ast`` expression -> tree over the ``SYMBOLS`` quantities."""

    def __init__(self, wheel: Wheel):
        self.wheel = wheel
        self.steps = 0  # MAX_EVAL_STEPS: reset for each site (``Reader.read``, one evaluator per site elsewhere)
        self.nesting = 0  # expressions being expanded inside each other (TREE_MAX_DEPTH)

    def fail(self, node: ast.AST, site: Site, why: str) -> NoReturn:
        try:
            text = ast.unparse(node)
        except (RecursionError, ValueError):
            text = f"<{type(node).__name__}>"
        raise Unreadable(text[:400], site.where(node), why)

    def symbol(self, name: str, site: Site) -> Optional[str]:
        if site.role == "runner" and f"runner:{name}" in SYMBOLS:
            return SYMBOLS[f"runner:{name}"]
        if name in SYMBOLS and (site.role != "helper" or "." in name):
            return SYMBOLS[name]
        last = name.rsplit(".", 1)[-1]
        if "." in name and f"*.{last}" in SYMBOLS:
            return SYMBOLS[f"*.{last}"]
        return None

    def expr(self, node, site: Site):
        self.nesting += 1
        try:
            if self.nesting > TREE_MAX_DEPTH:
                self.fail(node, site, f"an expression nested more than {TREE_MAX_DEPTH} deep")
            return self._expr(node, site)
        finally:
            self.nesting -= 1

    def _step(self, node: ast.AST, site: Site) -> None:
        """One more evaluation step: refused past ``MAX_EVAL_STEPS`` or ``MAX_DEPTH``."""
        self.steps += 1
        if self.steps > MAX_EVAL_STEPS:
            self.fail(node, site, f"more than {MAX_EVAL_STEPS} evaluation steps (names expanding each other)")
        if site.depth > MAX_DEPTH:
            self.fail(node, site, "nested too deep")

    def _expr(self, node, site: Site):
        self._step(node, site)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            if abs(node.value) > MAX_LITERAL:
                self.fail(node, site, "an integer larger than 2^62")
            return ["int", node.value]
        if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv):
            op = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//"}[type(node.op)]
            return [op, self.expr(node.left, site), self.expr(node.right, site)]
        if isinstance(node, ast.Name):
            if node.id in site.bound:
                value, where = site.bound[node.id]
                return self.expr(value, where)
            local = self._local(node, site)
            if local is not None:
                return self.expr(local, site)
            sym = self.symbol(node.id, site)
            if sym is not None:
                return ["sym", sym]
            self.fail(node, site, "unknown name")
        if isinstance(node, ast.Attribute):
            name = dotted(node)
            if name is not None:
                sym = self.symbol(name, site)
                if sym is not None:
                    return ["sym", sym]
                if name in site.bound:
                    value, where = site.bound[name]
                    return self.expr(value, where)
                assign = self._last(site.self_attrs.get(name, []), node) if name.startswith("self.") else None
                if assign is not None:
                    return self.expr(assign.value, site)
            self.fail(node, site, "unknown attribute")
        if isinstance(node, ast.Call):
            return self.call(node, site)
        self.fail(node, site, f"{type(node).__name__} is not integer + - * // min max")

    def _local(self, node: ast.Name, site: Site):
        """The value of the last plain ``name = ...`` of the enclosing function before ``node``."""
        if site.fn is None:
            return None
        found = None
        for stmt in ast.walk(site.fn):
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id == node.id and stmt.lineno < node.lineno):
                if found is None or stmt.lineno > found.lineno:
                    found = stmt
        return found.value if found is not None else None

    @staticmethod
    def _last(assigns: List[ast.Assign], node) -> Optional[ast.Assign]:
        before = [a for a in assigns if a.lineno < getattr(node, "lineno", 10**9)]
        return max(before, key=lambda a: a.lineno) if before else None

    def call(self, node: ast.Call, site: Site):
        if isinstance(node.func, ast.Name) and node.func.id in ("min", "max") and not node.keywords:
            if len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args):
                return [node.func.id] + [self.expr(a, site) for a in node.args]
            self.fail(node, site, f"{node.func.id} of fewer than two integers")
        if isinstance(node.func, ast.Name):
            found = self.helper(node.func.id, site.file)
            if found is not None:
                return self.helper_return(node, site, *found)
        self.fail(node, site, "call of something that is not a helper function of the wheel")

    def helper(self, name: str, file: str, depth: int = 0) -> Optional[Tuple[str, ast.FunctionDef]]:
        """The top-level ``def name`` of ``file`` or of the wheel module it imports ``name`` from."""
        tree = self.wheel.tree(file)
        if tree is None or depth > 4:
            return None
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return file, node
        for imported in ast.walk(tree):
            if isinstance(imported, ast.ImportFrom):
                for alias in imported.names:
                    if (alias.asname or alias.name) == name:
                        module = imported.module or ""
                        if imported.level:
                            pkg = package_of(file).split(".")
                            pkg = pkg[:len(pkg) - (imported.level - 1)] if imported.level > 1 else pkg
                            module = ".".join(pkg + ([module] if module else []))
                        target = self.wheel.module_file(module)
                        if target is not None:
                            found = self.helper(alias.name, target, depth + 1)
                            if found is not None:
                                return found
        return None

    def helper_return(self, call: ast.Call, site: Site, file: str, fn: ast.FunctionDef):
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        returns = [s for s in body if isinstance(s, ast.Return)]
        others = [s for s in body if not isinstance(s, (ast.Return, ast.Assert, ast.Assign))]
        if len(returns) != 1 or returns[0] is not body[-1] or returns[0].value is None or others:
            self.fail(call, site, f"helper {fn.name} ({file}:{fn.lineno}) is not assignments then one return")
        return self.expr(returns[0].value, Site(file, fn, "helper", self.bind(call, site, fn), {}, site.depth + 1))

    def bind(self, call: ast.Call, site: Site, fn: ast.FunctionDef, skip_self: bool = False) -> dict:
        """The callee's parameters -> ``(argument expression, caller's site)`` (defaults in the callee's)."""
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if skip_self and params and params[0] == "self":
            params = params[1:]
        bound = {}
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            self.fail(call, site, "*args or **kwargs in the call")
        for name, value in zip(params, call.args):
            bound[name] = (value, site)
        for kw in call.keywords:
            assert kw.arg is not None  # **kwargs failed above
            bound[kw.arg] = (kw.value, site)
        callee = Site(site.file, fn, "helper", {}, {}, site.depth + 1)
        defaults = fn.args.defaults
        for name, value in zip(params[len(params) - len(defaults):], defaults):
            bound.setdefault(name, (value, callee))
        return bound
