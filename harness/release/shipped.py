"""Shipped sizing: how a release sizes the buffer the draft kernel writes, read from its wheel (docs/contract.md,
"Shipped sizing"). ``--sizing sglang==VERSION:BACKEND``.

``read_wheel(path)`` opens an sglang wheel as a zip of text, parses its ``.py`` files with ``ast`` and never
imports, executes or evaluates any of it. It finds the *backends* by what they do: every class with a method
that launches ``generate_draft_decode_kv_indices[...]`` (or the window rail) and every subclass of one. For
each it reads

* the graph-mode row width: the second dimension of ``self.cuda_graph_kv_indices = torch.zeros((steps, W))``
  in ``init_cuda_graph_state``, with that method's parameters bound to what the draft CUDA-graph runner
  (``EAGLEDraftCudaGraphRunner``) passes at its ``draft_attn_backend.init_cuda_graph_state(...)`` call;
* whether a CUDA-graph replay launches the kernel: the backend's replay method (``REPLAY_METHODS``) is
  followed through ``self.`` and ``super()`` calls, leaving out what runs only under ``if in_capture:``;
  where no launch is reached, the graph site says so (``replay``): the kernel then runs only while the
  graph is captured, on the capture batch, never on a real one;
* the eager-mode row width: the per-batch ``torch.zeros((steps, W))`` of ``init_forward_metadata``;
* the host check before the launch: an ``assert USED <= CAPACITY`` (directly or in a helper of the wheel)
  whose capacity is the width of the buffer the kernel writes;
* a constructor refusing ``topk > 1`` (``if ... topk ...: raise``).

Expressions are evaluated by ``Evaluator``: integers, ``+ - * //``, ``min``/``max``, the names of
``SYMBOLS``, local assignments and parameters, ``self`` attributes assigned in ``__init__`` (the runner),
and calls of helper functions defined in the wheel (their ``return`` expression, read the same way).
Anything else raises ``Unreadable`` with the expression text and ``file:line``: never a guess.

The result is data (``shipped.json`` in the release's cache entry, written by ``kvfence.release.upstream``):
formulas as text and as trees over the symbols, and where they came from. Fuzzing reads only that file.
"""

from __future__ import annotations

import ast
import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from kvfence.errors import BadInput, require

#: Bumped when the record's layout changes (kvfence.release.upstream's cache format follows it).
FORMAT = 2  # 2: a graph site says when the replay path launches no kernel (``replay``)
RECORD_FILE = "shipped.json"
DRAFT_KERNEL = "generate_draft_decode_kv_indices"
WINDOW_KERNEL = "generate_draft_decode_window_kv_indices"
LAUNCHED = (DRAFT_KERNEL, WINDOW_KERNEL)
#: The draft CUDA-graph runner class (docs/contract.md §4) and the attribute it reaches the backend through.
RUNNER_CLASS = "EAGLEDraftCudaGraphRunner"
RUNNER_BACKEND_ATTR = "draft_attn_backend"
MODES = ("graph", "eager")
#: The methods the draft CUDA-graph runner calls before each replay: up to 0.5.12.post1 the first; later
#: the second, which capture calls too, with ``in_capture=True``.
REPLAY_METHODS = ("init_forward_metadata_replay_cuda_graph", "init_forward_metadata_out_graph")
CAPTURE_FLAG = "in_capture"

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
_MAX_DEPTH = 12
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


def _too_deep(text: str, where: str) -> "Unreadable":
    return Unreadable(text, where, f"formula nested more than {TREE_MAX_DEPTH} deep")


def _check_tree(tree, symbols, what: str, depth: int = 0) -> None:
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
            _check_tree(a, symbols, what, depth + 1)


def _check_site(site, what: str, symbols, *, check: bool = False) -> None:
    require(isinstance(site, dict), f"{what}: not an object")
    strings = lambda d, keys: all(isinstance(d.get(k), str) for k in keys)  # noqa: E731
    if "absent" in site:
        require(isinstance(site["absent"], str), f"{what}: absent must be a string")
        return
    if "unreadable" in site:
        u = site["unreadable"]
        require(isinstance(u, dict) and strings(u, ("text", "source", "why")), f"{what}: bad unreadable entry")
        return
    require(strings(site, ("formula", "source")) and "tree" in site, f"{what}: needs formula, tree and source")
    require(site.get("replay") is None or isinstance(site["replay"], str), f"{what}: replay must be a string")
    require(check or isinstance(site.get("formula_text"), str), f"{what}: needs formula_text")
    _check_tree(site["tree"], symbols, what)
    params = site.get("params", {})
    require(isinstance(params, dict), f"{what}: params must be an object")
    for p, v in params.items():
        require(isinstance(v, dict) and strings(v, ("formula", "unit", "source", "text")) and "tree" in v,
                f"{what}: bad parameter {p!r}"[:200])
    if check:
        require(type(site.get("strict")) is bool and isinstance(site.get("text"), str),
                f"{what}: a host check needs strict (true/false) and text")


def validate_record(record) -> dict:
    """``record`` if it has the layout ``read_wheel`` writes (types included), else ``BadInput`` naming the
    first thing wrong: a cached record is data a file holds, read only after this."""
    require(isinstance(record, dict) and record.get("format") == FORMAT, "not a shipped-sizing record")
    backends = record.get("backends")
    require(isinstance(backends, dict), "backends must be an object")
    require(record.get("unreadable") is None or isinstance(record["unreadable"], str), "unreadable must be a string")
    skipped = record.get("skipped_members")
    require(skipped is None or (isinstance(skipped, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                  for k, v in skipped.items())),
            "skipped_members must map member names to reasons")
    for name, b in backends.items():
        what = f"backend {name!r}"[:120]
        require(isinstance(b, dict), f"{what}: not an object")
        require(isinstance(b.get("file"), str) and type(b.get("line")) is int and isinstance(b.get("bases"), list)
                and all(isinstance(x, str) for x in b["bases"]), f"{what}: needs file, line and bases")
        for mode in MODES:
            _check_site(b.get(mode), f"{what} {mode}", WIDTH_SYMBOLS)
        if b.get("host_check") is not None:
            _check_site(b["host_check"], f"{what} host_check", CHECK_SYMBOLS, check=True)
        refuses = b.get("refuses")
        require(refuses is None or (isinstance(refuses, dict) and all(isinstance(refuses.get(k), str)
                                                                      for k in ("source", "text", "refuses"))),
                f"{what}: bad refuses entry")
    return record


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


def unread_note(record: dict) -> str:
    """``; ...`` naming what of a wheel could not be read (``unreadable``, ``skipped_members``), or ``""``:
    a release with no backend found says whether one may sit in a member kvfence could not read."""
    parts = [record["unreadable"]] if record.get("unreadable") else []
    skipped = record.get("skipped_members") or {}
    if skipped:
        shown = ", ".join(f"{name} ({why})" for name, why in list(skipped.items())[:3])
        parts.append(f"{len(skipped)} member(s) not read: {shown}" + (", ..." if len(skipped) > 3 else ""))
    return "".join(f"; {p}" for p in parts)


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
        self._trees: Dict[str, ast.Module] = {}

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


def _dotted(node) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _package(file: str) -> str:
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

    def fail(self, node, site: Site, why: str):
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

    def _expr(self, node, site: Site):
        self.steps += 1
        if self.steps > MAX_EVAL_STEPS:
            self.fail(node, site, f"more than {MAX_EVAL_STEPS} evaluation steps (names expanding each other)")
        if site.depth > _MAX_DEPTH:
            self.fail(node, site, "nested too deep")
        if isinstance(node, ast.Constant) and type(node.value) is int:
            if abs(node.value) > MAX_LITERAL:
                self.fail(node, site, f"an integer larger than 2^62")
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
            name = _dotted(node)
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
    def _last(assigns: List[ast.Assign], node) -> ast.Assign:
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
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        module = node.module or ""
                        if node.level:
                            pkg = _package(file).split(".")
                            pkg = pkg[:len(pkg) - (node.level - 1)] if node.level > 1 else pkg
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
            bound[kw.arg] = (kw.value, site)
        callee = Site(site.file, fn, "helper", {}, {}, site.depth + 1)
        defaults = fn.args.defaults
        for name, value in zip(params[len(params) - len(defaults):], defaults):
            bound.setdefault(name, (value, callee))
        return bound


# -- reading a release ------------------------------------------------------------------------------
def _launches(fn: ast.FunctionDef) -> Optional[Tuple[str, ast.Call]]:
    """``(kernel name, call)`` of the first ``...KERNEL[grid](...)`` launch in ``fn``."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            name = _dotted(node.func.value) or ""
            last = name.rsplit(".", 1)[-1]
            if last in LAUNCHED:
                return last, node
    return None


def _replay_nodes(body: list):
    """Every node of ``body`` a replay runs: an ``if in_capture:`` keeps its ``else`` only, an ``if not
    in_capture:`` its body only; nested function and class definitions are left out."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, ast.If):
            test = stmt.test
            if isinstance(test, ast.Name) and test.id == CAPTURE_FLAG:
                yield from _replay_nodes(stmt.orelse)
                continue
            if (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Name)
                    and test.operand.id == CAPTURE_FLAG):
                yield from _replay_nodes(stmt.body)
                continue
            yield from ast.walk(test)
            yield from _replay_nodes(stmt.body)
            yield from _replay_nodes(stmt.orelse)
            continue
        for node in ast.walk(stmt):
            yield node


def _methods(cls: ast.ClassDef) -> Dict[str, ast.FunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _base_names(cls: ast.ClassDef) -> List[str]:
    return [(_dotted(b) or "").rsplit(".", 1)[-1] for b in cls.bases]


def _text_at(node, file: str) -> dict:
    return {"text": ast.unparse(node), "source": f"{file}:{node.lineno}"}


def _unreadable(exc: Unreadable) -> dict:
    return {"unreadable": {"text": exc.text, "source": exc.where, "why": exc.why}}


def _allocation(fn: ast.FunctionDef, target: Optional[str]):
    """The ``torch.zeros/empty/full((A, B), ...)`` assignment of ``fn`` (to ``target``, or to any local):
    its statement and the shape's two elements."""
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)):
            continue
        name = _dotted(node.targets[0])
        func = (_dotted(node.value.func) or "").rsplit(".", 1)[-1]
        if func not in ("zeros", "empty", "full") or not node.value.args:
            continue
        if target is not None and name != target:
            continue
        if target is None and not isinstance(node.targets[0], ast.Name):
            continue
        shape = node.value.args[0]
        if isinstance(shape, ast.Tuple) and len(shape.elts) == 2:
            return node, shape.elts
    return None


class Reader:
    """Reads every backend of one wheel into its record (``read_wheel``)."""

    def __init__(self, wheel: Wheel):
        self.wheel = wheel
        self.ev = Evaluator(wheel)
        self._replay_methods: Optional[List[str]] = None  # runner_replay_methods(), read once
        self.classes: Dict[str, Tuple[str, ast.ClassDef]] = {}
        for needle in LAUNCHED + ("MultiStepDraftBackend",):
            for file, cls in wheel.classes(needle):
                self.classes.setdefault(cls.name, (file, cls))

    def mro(self, name: str) -> List[Tuple[str, ast.ClassDef]]:
        out, seen = [], set()
        todo = [name]
        while todo:
            n = todo.pop(0)
            if n in seen or n not in self.classes:
                continue
            seen.add(n)
            out.append(self.classes[n])
            todo.extend(_base_names(self.classes[n][1]))
        return out

    def method(self, cls_name: str, method: str) -> Optional[Tuple[str, ast.FunctionDef]]:
        found = self._first(cls_name, method)
        return (found[0], found[2]) if found else None

    def backends(self) -> List[str]:
        launching = {name for name, (_, cls) in self.classes.items()
                     if any(_launches(m) for m in _methods(cls).values())}
        # Subclasses of a launching class (found in any file naming the class: backends moved between files).
        for base in sorted(launching):
            for file, cls in self.wheel.classes(base):
                self.classes.setdefault(cls.name, (file, cls))
        changed = True
        while changed:
            changed = False
            for name, (_, cls) in self.classes.items():
                if name not in launching and any(b in launching for b in _base_names(cls)):
                    launching.add(name)
                    changed = True
        return sorted(launching)

    def runner_call(self) -> Optional[Tuple[str, ast.Call, Site]]:
        for file, cls in self.wheel.classes(RUNNER_CLASS):
            if cls.name != RUNNER_CLASS:
                continue
            methods = _methods(cls)
            init = methods.get("__init__")
            attrs: Dict[str, List[ast.Assign]] = {}
            for node in ast.walk(init) if init else []:
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    name = _dotted(node.targets[0])
                    if name and name.startswith("self."):
                        attrs.setdefault(name, []).append(node)
            for fn in methods.values():
                for node in ast.walk(fn):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and node.func.attr == "init_cuda_graph_state"
                            and (_dotted(node.func.value) or "").endswith(RUNNER_BACKEND_ATTR)):
                        return file, node, Site(file, fn, "runner", {}, attrs)
        return None

    def read(self, name: str) -> dict:
        file, cls = self.classes[name]
        record = {"class": name, "file": file, "line": cls.lineno, "bases": _base_names(cls),
                  "kernels": sorted({k for _, c in self.mro(name) for m in _methods(c).values()
                                     for k, _ in [_launches(m) or (None, None)] if k})}
        for key, read in (("graph", self.graph), ("eager", self.eager), ("host_check", self.host_check),
                          ("refuses", self.refusal)):
            self.ev.steps = 0
            try:
                record[key] = read(name)
            except RecursionError:  # a wheel's names that refer to each other: unreadable, not a traceback
                record[key] = _unreadable(Unreadable(key, record["file"], "names refer to each other too deeply"))
        return record

    def graph(self, name: str) -> dict:
        found = self.method(name, "init_cuda_graph_state")
        if found is None:
            return {"absent": "no init_cuda_graph_state"}
        file, fn = found
        alloc = _allocation(fn, "self.cuda_graph_kv_indices")
        if alloc is None:
            return {"absent": f"init_cuda_graph_state ({file}:{fn.lineno}) allocates no self.cuda_graph_kv_indices"}
        stmt, (_, width_node) = alloc
        out = {"formula_text": ast.unparse(width_node), "source": f"{file}:{stmt.lineno}"}
        call = self.runner_call()
        if call is None:
            out.update(_unreadable(Unreadable("init_cuda_graph_state(...)", file,
                                              f"no {RUNNER_CLASS} call of {RUNNER_BACKEND_ATTR}.init_cuda_graph_state")))
            return out
        rfile, rnode, rsite = call
        out["call_site"] = _text_at(rnode, rfile)
        # The backend's formula over its own parameters, then each parameter as the runner passes it.
        try:
            bound = self.ev.bind(rnode, rsite, fn, skip_self=True)
            raw = _ParamEvaluator(self.wheel, set(bound)).expr(width_node, Site(file, fn, "backend", {}, {}))
            bindings = {}
            for p in sorted(symbols_of(raw) & set(bound)):
                value, where = bound[p]
                bindings[p] = self.ev.expr(value, where)
                out.setdefault("params", {})[p] = {"formula": render(bindings[p]), "tree": bindings[p],
                                                   "unit": _unit(bindings[p]), **_text_at(value, rfile)}
            tree = substitute(raw, bindings)
        except Unreadable as exc:
            out.update(_unreadable(exc))
            return out
        out["backend_formula"] = render(raw)
        silent = self.replay_launches_nothing(name)
        if silent:
            out["replay"] = silent
        return self._width(out, tree, stmt, file)

    def _after(self, cls_name: str, defined_in: ast.ClassDef, method: str):
        """The definition of ``method`` that ``super()`` reaches from ``defined_in`` in ``cls_name``'s MRO."""
        chain = self.mro(cls_name)
        start = next((i + 1 for i, (_, c) in enumerate(chain) if c is defined_in), len(chain))
        for file, cls in chain[start:]:
            fn = _methods(cls).get(method)
            if fn is not None:
                return file, cls, fn
        return None

    def _first(self, cls_name: str, method: str):
        """``(file, class, definition)`` of ``method`` first found along ``cls_name``'s bases."""
        for file, cls in self.mro(cls_name):
            fn = _methods(cls).get(method)
            if fn is not None:
                return file, cls, fn
        return None

    def _reaches_launch(self, cls_name: str, found, depth: int = 0) -> bool:
        """Whether ``found`` (file, class, method) launches the kernel at replay: directly, or through
        ``self.M(...)`` / ``super().M(...)``; statements under ``if in_capture:`` (capture only) and nested
        functions (run by whoever calls them) are left out."""
        if depth > _MAX_DEPTH:
            return True  # too deep to follow: assume it launches (the verdict stays the arithmetic's)
        _, cls, fn = found
        for node in _replay_nodes(fn.body):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                if (_dotted(node.func.value) or "").rsplit(".", 1)[-1] in LAUNCHED:
                    return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                target = node.func.value
                if isinstance(target, ast.Name) and target.id == "self":
                    nxt = self._first(cls_name, node.func.attr)
                elif (isinstance(target, ast.Call) and isinstance(target.func, ast.Name)
                      and target.func.id == "super"):
                    nxt = self._after(cls_name, cls, node.func.attr)
                else:
                    continue
                if nxt is not None and self._reaches_launch(cls_name, nxt, depth + 1):
                    return True
        return False

    def runner_replay_methods(self) -> List[str]:
        """The ``REPLAY_METHODS`` the draft CUDA-graph runner calls on its backend (what this release replays)."""
        if self._replay_methods is None:
            called = set()
            for _, cls in self.wheel.classes(RUNNER_CLASS):
                if cls.name == RUNNER_CLASS:
                    for node in ast.walk(cls):
                        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                                and node.func.attr in REPLAY_METHODS
                                and (_dotted(node.func.value) or "").endswith(RUNNER_BACKEND_ATTR)):
                            called.add(node.func.attr)
            self._replay_methods = [m for m in REPLAY_METHODS if m in called]
        return self._replay_methods

    def replay_launches_nothing(self, name: str) -> Optional[str]:
        """Why a replay of ``name``'s CUDA graphs launches no kernel (``None``: it does, or no replay method
        is found, which leaves the verdict to the arithmetic as before)."""
        for method in self.runner_replay_methods():
            found = self._first(name, method)
            if found is None:
                continue
            if self._reaches_launch(name, found):
                return None
            file, cls, fn = found
            return (f"{cls.name}.{method} ({file}:{fn.lineno}) reaches no launch of the kernel outside "
                    f"'if {CAPTURE_FLAG}:': a replay does not run it (at most the capture batch is written)")
        return None

    def _width(self, out: dict, tree, stmt, file: str) -> dict:
        extra = symbols_of(tree) - set(WIDTH_SYMBOLS)
        if extra:
            out.update(_unreadable(Unreadable(out["formula_text"], f"{file}:{stmt.lineno}",
                                              f"width depends on {', '.join(sorted(extra))}")))
            return out
        if tree_depth(tree) > TREE_MAX_DEPTH:  # each part within the limit, the parameters substituted deeper
            out.update(_unreadable(_too_deep(out["formula_text"], f"{file}:{stmt.lineno}")))
            return out
        out["tree"] = tree
        out["formula"] = render(tree)
        return out

    def eager(self, name: str) -> dict:
        found = self.method(name, "init_forward_metadata")
        if found is None:
            return {"absent": "no init_forward_metadata"}
        file, fn = found
        alloc = _allocation(fn, None)
        if alloc is None:
            return {"absent": f"init_forward_metadata ({file}:{fn.lineno}) allocates no (steps, W) buffer"}
        stmt, (_, width_node) = alloc
        out = {"formula_text": ast.unparse(width_node), "source": f"{file}:{stmt.lineno}"}
        try:
            tree = self.ev.expr(width_node, Site(file, fn, "backend", {}, {}))
        except Unreadable as exc:
            out.update(_unreadable(exc))
            return out
        return self._width(out, tree, stmt, file)

    def host_check(self, name: str) -> Optional[dict]:
        for _, cls in self.mro(name):
            for fn in _methods(cls).values():
                launch = _launches(fn)
                if launch is not None:
                    file = self.classes[cls.name][0]
                    return self._check_in(file, fn, launch[1])
        return None

    def _check_in(self, file: str, fn: ast.FunctionDef, launch: ast.Call) -> Optional[dict]:
        buffer_arg = launch.args[3] if len(launch.args) > 3 else None
        buffer = _dotted(buffer_arg) if buffer_arg is not None else None
        for stmt in fn.body:
            if stmt.lineno >= launch.lineno:
                break
            test, site_fn, site_file, bound = None, fn, file, {}
            if isinstance(stmt, ast.Assert):
                test = stmt.test
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name):
                found = self.ev.helper(stmt.value.func.id, file)
                if found is not None:
                    hfile, hfn = found
                    asserts = [s for s in hfn.body if isinstance(s, ast.Assert)]
                    if len(asserts) == 1:
                        caller = Site(file, fn, "backend", {}, {})
                        try:
                            bound = self.ev.bind(stmt.value, caller, hfn)
                        except Unreadable:
                            continue
                        test, site_fn, site_file = asserts[0].test, hfn, hfile
            if not (isinstance(test, ast.Compare) and len(test.ops) == 1
                    and isinstance(test.ops[0], (ast.LtE, ast.Lt, ast.GtE, ast.Gt))):
                continue
            left, right = test.left, test.comparators[0]
            op = type(test.ops[0])
            if op in (ast.GtE, ast.Gt):
                left, right = right, left
            cap_site = Site(site_file, site_fn, "helper" if bound else "backend", bound, {})
            if not self._is_width(right, cap_site, buffer):
                continue
            out = {**_text_at(stmt, file), "strict": op in (ast.Lt, ast.Gt)}
            try:
                tree = self.ev.expr(left, Site(site_file, site_fn, "helper" if bound else "backend", bound, {}))
            except Unreadable as exc:
                out.update(_unreadable(exc))
                return out
            extra = symbols_of(tree) - set(CHECK_SYMBOLS)
            if extra:
                out.update(_unreadable(Unreadable(ast.unparse(left), f"{site_file}:{test.lineno}",
                                                  f"check depends on {', '.join(sorted(extra))}")))
                return out
            if tree_depth(tree) > TREE_MAX_DEPTH:
                out.update(_unreadable(_too_deep(ast.unparse(left), f"{site_file}:{test.lineno}")))
                return out
            out["tree"], out["formula"] = tree, render(tree)
            return out
        return None

    def _is_width(self, node, site: Site, buffer: Optional[str]) -> bool:
        """``BUFFER.shape[1]`` of the buffer the kernel writes (through a helper's parameter)."""
        while isinstance(node, ast.Name) and node.id in site.bound:
            node, site = site.bound[node.id]
        return (buffer is not None and isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "shape" and _dotted(node.value.value) == buffer
                and isinstance(node.slice, ast.Constant) and node.slice.value == 1)

    def refusal(self, name: str) -> Optional[dict]:
        """The first ``if ... topk ...: raise`` of the constructors a ``super().__init__(...)`` chain runs."""
        for file, cls in self.mro(name):
            fn = _methods(cls).get("__init__")
            if fn is None:
                continue
            for stmt in fn.body:
                if (isinstance(stmt, ast.If) and any(isinstance(s, ast.Raise) for s in stmt.body)
                        and re.search(r"\btopk\b|eagle_topk", ast.unparse(stmt.test))):
                    out = _text_at(stmt.test, file)
                    out["refuses"] = _refused_topk(stmt.test)
                    return out
            if "super().__init__(" not in ast.unparse(fn):
                return None
        return None


class _ParamEvaluator(Evaluator):
    """The evaluator with some parameter names kept as symbols of their own (the call-site rule)."""

    def __init__(self, wheel: Wheel, params: set):
        super().__init__(wheel)
        self.params = params

    def expr(self, node, site: Site):
        if isinstance(node, ast.Name) and node.id in self.params and site.role == "backend":
            return ["sym", node.id]
        return super().expr(node, site)


def _refused_topk(test) -> str:
    """``topk > 1`` when the test is exactly that (or ``!= 1`` / ``>= 2``); else the test's text."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant):
        name = (_dotted(test.left) or "").rsplit(".", 1)[-1]
        value = test.comparators[0].value
        op = type(test.ops[0])
        if name in ("topk", "speculative_eagle_topk") and ((op is ast.Gt and value == 1) or (op is ast.NotEq and value == 1)
                                                          or (op is ast.GtE and value == 2)):
            return "topk > 1"
    return ast.unparse(test)


def _unit(tree) -> str:
    """What the runner's argument counts: ``requests``, ``tokens`` (requests x topk) or its formula."""
    probe = [evaluate(tree, {"requests": r, "topk": t, "ctx": 1, "steps": 1}) if symbols_of(tree) <= set(WIDTH_SYMBOLS)
             else None for r, t in ((3, 5), (7, 2))]
    if probe == [3, 7]:
        return "requests"
    if probe == [15, 14]:
        return "tokens"
    return render(tree)


#: Backend classes read from one wheel at most (SGLang has under 20): a wheel with more is read as far as
#: this, in name order, and says so, so a hostile wheel of many classes cannot hold the reader.
MAX_BACKENDS = 64


def read_wheel(path: Path) -> dict:
    """The shipped-sizing record of a wheel: every backend that launches the draft kernel (data only)."""
    reader = Reader(Wheel(Path(path)))
    names = reader.backends()
    record = {"format": FORMAT, "backends": {n: reader.read(n) for n in names[:MAX_BACKENDS]}}
    if len(names) > MAX_BACKENDS:
        record["unreadable"] = f"{len(names)} backend classes, more than {MAX_BACKENDS}: the rest were not read"
    if reader.wheel.skipped:
        record["skipped_members"] = dict(sorted(reader.wheel.skipped.items())[:20])
    return record


def read_wheel_or_note(path: Path) -> dict:
    """``read_wheel``, or a record with no backend and the reason when the wheel's sizing cannot be read at
    all: extracting a release's kernel never depends on reading its sizing."""
    try:
        return read_wheel(path)
    except (BadInput, RecursionError, MemoryError, ValueError) as exc:
        return {"format": FORMAT, "backends": {}, "unreadable": f"the sizing could not be read: {exc}"[:400]}
