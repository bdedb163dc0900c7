"""What an SGLang release sizes the request rows to, and what its decode step writes into them, read from its
wheel as data (docs/contract.md §10, "Shipped sizing").

``extract(wheel)`` copies out of the wheel the few function bodies that decide it (as text, with their file and
first line): the row-width helper ``get_req_to_token_extra_context_len`` and the pool builder that adds it to
the context length; the per-step reservation helpers ``get_alloc_len_per_decode`` /
``get_alloc_reserve_per_decode`` and the page alignment ``page_aligned_decode_alloc_lens``; the decode
dispatcher ``spec_prepare_for_decode`` and the three decode preparations it routes to (the DFlash family's
``DFlashDraftInputV2.prepare_for_decode``, UNO's, EAGLE's ``eagle_prepare_for_decode``); the algorithm
predicates of ``SpeculativeAlgorithm``; the writer's call in ``alloc_for_spec_decode``; the allocator page
``get_alloc_page_size`` (0.5.19 on) and the KV allocator's builder ``_build_token_to_kv_pool_allocator`` (whose
paged allocator under decode context parallelism pages at ``page_size * attn_dcp_size``: what the decode step's
end is aligned to); and the scheduler's admission bound (``kvfence.release.contract_shipped.admission``). The
record is cached per release (``CACHE/contracts/sglang-V/req-to-token.rows.json``), so an offline host reads the
same.

``Interpreter`` evaluates those bodies for one algorithm and config (draft tokens ``D``, steps, topk, page size
``P``, DCP size ``dcp``) with a small evaluator of ``ast`` nodes (integers, ``+ - * //``, ``min``/``max``/``int``,
comparisons, ``and``/``or``/``not``, ``if``/``return``, locals, the algorithm predicates, the settings
``get_spec().X``, ``get_schedule().page_size`` (``P``), ``get_parallel().attn_dcp_size`` (``dcp``) and
``.dcp_enabled``, and ``batch.token_to_kv_pool_allocator.page_size``, the allocator's page read from its
builder); nothing of the wheel is imported or run. Whatever it does not know is ``Unreadable`` with the
text and ``file:line``, never a guess. Each answer names the lines it went through.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple

from kvfence.errors import BadInput, require
from kvfence.release.wheels import cache_writes

FORMAT = 2
#: What the record holds: key -> (function, class or "", text that picks the file when several define it).
FUNCTIONS = {
    "extra": ("get_req_to_token_extra_context_len", "", ""),
    "pool": ("_build_default_req_pool", "KVCacheConfigurator", ""),
    "alloc_len": ("get_alloc_len_per_decode", "", ""),
    "reserve_row": ("get_alloc_reserve_per_decode", "", ""),
    "align": ("page_aligned_decode_alloc_lens", "", ""),
    "dispatch": ("spec_prepare_for_decode", "", ""),
    "dflash": ("prepare_for_decode", "DFlashDraftInputV2", ""),
    "uno": ("prepare_for_decode", "UnoDraftInput", ""),
    "eagle": ("eagle_prepare_for_decode", "", ""),
    "writer": ("alloc_for_spec_decode", "", ""),
    "algorithm": ("", "SpeculativeAlgorithm", ""),
    "alloc_page": ("get_alloc_page_size", "", ""),
    "allocator": ("_build_token_to_kv_pool_allocator", "KVCacheConfigurator", ""),
}
#: The algorithms kvfence reads (SGLang's --speculative-algorithm names).
ALGORITHMS = ("EAGLE", "EAGLE3", "DFLASH", "DSPARK", "UNO")
#: The settings ``get_spec()`` answers, as the config's quantities.
SPEC_FIELDS = {"speculative_num_draft_tokens": "D", "max_speculative_num_draft_tokens": None,
               "speculative_num_steps": "steps", "speculative_eagle_topk": "topk"}
#: Where DSPARK's decode state is the DFlash family's (its worker builds DFlashDraftInputV2).
DSPARK_EVIDENCE = "DFlashDraftInputV2.create_idle_input(device=self.device)"


class Unreadable(BadInput):
    """A text of the release the interpreter does not know (its text, ``file:line`` and why)."""


# -- extracting the bodies ------------------------------------------------------------------------------------
def _find(wheel, function: str, cls: str):
    """``(file, node)``: the serving runtime's definition (``sglang/srt/`` first) of ``cls.function``, ``function``
    or the class ``cls`` itself (``function`` empty)."""
    needle = f"class {cls}" if cls else f"def {function}("
    for file in sorted(wheel.files, key=lambda f: (not f.startswith("sglang/srt/"), f)):
        if needle not in wheel.files[file] or not file.startswith("sglang/"):
            continue
        tree = wheel.tree(file)
        for node in tree.body if tree else []:
            if cls and isinstance(node, ast.ClassDef) and node.name == cls:
                if not function:
                    return file, node
                for fn in node.body:
                    if isinstance(fn, ast.FunctionDef) and fn.name == function:
                        return file, fn
            elif not cls and isinstance(node, ast.FunctionDef) and node.name == function:
                return file, node
    return None


def extract(wheel) -> dict:
    """The record of one wheel (``kvfence.release.wheel_ast.Wheel``): each body as text, and the admission bound."""
    from kvfence.release.contract_shipped import admission

    out: dict = {"format": FORMAT, "functions": {}}
    for key, (function, cls, _) in FUNCTIONS.items():
        found = _find(wheel, function, cls)
        if found is None:
            out["functions"][key] = {"absent": f"no {cls + '.' if cls and function else cls}{function} in this release"}
            continue
        file, node = found
        lines = wheel.files[file].splitlines(keepends=True)
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        out["functions"][key] = {"file": file, "line": start, "source": "".join(lines[start - 1:node.end_lineno])}
    out["dspark"] = None
    for file in sorted(f for f in wheel.files if "dspark" in f and f.startswith("sglang/srt/speculative/")):
        tree = wheel.tree(file)
        for node in ast.walk(tree) if tree else []:
            if isinstance(node, ast.expr) and ast.unparse(node) == DSPARK_EVIDENCE:
                out["dspark"] = {"file": file, "line": node.lineno, "text": DSPARK_EVIDENCE}
                break
        if out["dspark"]:
            break
    out["admission"] = admission(wheel)
    return out


def validate(doc) -> dict:
    require(isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(doc.get("functions"), dict),
            "release record: another format")
    for key in FUNCTIONS:
        v = doc["functions"].get(key)
        require(isinstance(v, dict) and (isinstance(v.get("absent"), str) or (
            isinstance(v.get("file"), str) and type(v.get("line")) is int and isinstance(v.get("source"), str))),
            f"release record: bad entry {key}")
    require(doc.get("dspark") is None or isinstance(doc["dspark"], dict), "release record: bad dspark")
    require(isinstance(doc.get("admission"), dict), "release record: bad admission")
    return doc


_LOADED: Dict[str, dict] = {}


def record_path(version: str) -> Path:
    from kvfence.release.contract_kernels import contract_entry

    return contract_entry(version, "req-to-token")[0].with_suffix(".rows.json")


def load(version: str, announce=None) -> dict:
    """The record of ``sglang==version``: from this process, the cache, else read from the wheel (which
    ``kvfence.release.upstream.find_wheel`` finds or downloads; offline: one line)."""
    from kvfence.release import upstream, wheels
    from kvfence.release.wheel_ast import Wheel

    if version in _LOADED:
        return _LOADED[version]
    wheels.check_version(version)
    path = record_path(version)
    doc, why = None, "missing from the cache"
    if path.is_file():
        try:
            doc = validate(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, BadInput) as exc:
            doc, why = None, f"damaged in the cache ({type(exc).__name__})"  # read again from the wheel
    if doc is None:
        with tempfile.TemporaryDirectory(prefix="kvfence-wheel-") as tmp:
            wheel = upstream.find_wheel(version, None, wheels.offline_by_env(), Path(tmp), announce, (path, why))
            doc = validate(extract(Wheel(wheel)))
        with cache_writes(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            staging.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
            os.replace(staging, path)
    _LOADED[version] = doc
    return doc


# -- the interpreter ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Algo:
    name: str


class _Spec:
    """What ``get_spec()`` stands for: the server's speculative settings."""


class _Schedule:
    """What ``get_schedule()`` stands for: the scheduler's settings (its ``page_size`` is ``P``)."""


class _Parallel:
    """What ``get_parallel()`` stands for: the parallel widths (``attn_dcp_size``, ``dcp_enabled``)."""


_SPEC, _SCHEDULE, _PARALLEL = _Spec(), _Schedule(), _Parallel()
#: The allocator's page as the decode preparations read it.
ALLOCATOR_PAGE = "batch.token_to_kv_pool_allocator.page_size"


@dataclass
class Config:
    algorithm: str
    D: int
    steps: int
    topk: int
    P: int
    dcp: int = 1


@dataclass
class Answer:
    value: int
    lines: List[str] = field(default_factory=list)


@functools.lru_cache(maxsize=64)
def _parsed(source: str, line: int) -> Any:  # the body's FunctionDef or ClassDef node
    """One body's tree at its lines in the wheel (parsed once: the interpreter only reads the trees)."""
    tree = ast.parse(textwrap.dedent(source))
    ast.increment_lineno(tree, line - 1)
    return tree.body[0]


class _Return(Exception):
    def __init__(self, value):
        self.value = value


class Interpreter:
    """Evaluates the record's bodies for one config (see the module docstring)."""

    def __init__(self, doc: dict, config: Config):
        self.doc, self.config = doc, config
        self.lines: Dict[str, set] = {}
        self.depth = 0

    # -- where things are
    def body(self, key: str) -> Tuple[str, Any]:  # (file, its FunctionDef or ClassDef node)
        entry = self.doc["functions"][key]
        if "absent" in entry:
            raise Unreadable(entry["absent"])
        return entry["file"], _parsed(entry["source"], entry["line"])

    def cite(self, file: str, node) -> None:
        self.lines.setdefault(file, set()).add(node.lineno)

    def cited(self) -> List[str]:
        return [f"{file}:{','.join(map(str, sorted(lines)))}" for file, lines in sorted(self.lines.items())]

    def fail(self, file: str, node, why: str) -> NoReturn:
        raise Unreadable(f"{why}: {ast.unparse(node)[:200]} ({file}:{getattr(node, 'lineno', '?')})")

    # -- functions
    def call_function(self, key: str, env: Optional[dict] = None):
        file, fn = self.body(key)
        self.depth += 1
        if self.depth > 16:
            self.fail(file, fn, "helpers nested too deep")
        try:
            self.block(fn.body, dict(env or {}), file)
        except _Return as r:
            return r.value
        finally:
            self.depth -= 1
        self.fail(file, fn, "ends without a return")

    def method(self, name: str, algo: Algo):
        file, cls = self.body("algorithm")
        fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if fn is None:
            self.fail(file, cls, f"SpeculativeAlgorithm has no method {name}")
        try:
            self.block(fn.body, {"self": algo}, file)
        except _Return as r:
            return r.value
        self.fail(file, fn, "ends without a return")

    def block(self, body, env: dict, file: str) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                continue
            self.cite(file, stmt)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                env[stmt.targets[0].id] = self.expr(stmt.value, env, file)
            elif isinstance(stmt, ast.If):
                self.block(stmt.body if self.expr(stmt.test, env, file) else stmt.orelse, env, file)
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                raise _Return(self.expr(stmt.value, env, file))
            elif isinstance(stmt, ast.Raise):
                self.fail(file, stmt, "raises for this config")
            else:
                self.fail(file, stmt, f"{type(stmt).__name__} is not an assignment, if or return")

    # -- expressions
    def expr(self, node, env: dict, file: str):
        if isinstance(node, ast.Constant) and (type(node.value) in (int, bool) or node.value is None):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            self.fail(file, node, "unknown name")
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = self.expr(node.left, env, file), self.expr(node.right, env, file)
            if not (type(a) is int and type(b) is int) or (isinstance(node.op, ast.FloorDiv) and b == 0):
                self.fail(file, node, "not integer arithmetic")
            return _BINOPS[type(node.op)](a, b)
        if isinstance(node, ast.BoolOp):
            value = None
            for v in node.values:
                value = self.expr(v, env, file)
                if isinstance(node.op, ast.Or) == bool(value):
                    return value
            return value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not self.expr(node.operand, env, file)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            a = self.expr(node.left, env, file)
            b = self.expr(node.comparators[0], env, file)
            return _COMPARE[type(node.ops[0])](a, b)
        if isinstance(node, ast.Tuple):
            return tuple(self.expr(e, env, file) for e in node.elts)
        if isinstance(node, ast.Attribute):
            return self.attribute(node, env, file)
        if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred) for a in node.args):
            return self.call(node, env, file)
        self.fail(file, node, f"{type(node).__name__} is not read")

    def attribute(self, node: ast.Attribute, env: dict, file: str):
        if isinstance(node.value, ast.Name) and node.value.id == "SpeculativeAlgorithm":
            return Algo(node.attr)
        if ast.unparse(node) == ALLOCATOR_PAGE:
            answer = alloc_page(self.doc, self.config)
            for text in answer.lines:
                where, _, numbers = text.rpartition(":")
                self.lines.setdefault(where, set()).update(int(n) for n in numbers.split(","))
            return answer.value
        base = self.expr(node.value, env, file)
        if base is _SCHEDULE and node.attr == "page_size":
            return self.config.P
        if base is _PARALLEL and node.attr == "attn_dcp_size":
            return self.config.dcp
        if base is _PARALLEL and node.attr == "dcp_enabled":
            return self.config.dcp > 1
        if base is _SPEC:
            if node.attr == "speculative_algorithm":
                return self.config.algorithm
            if node.attr in SPEC_FIELDS:
                quantity = SPEC_FIELDS[node.attr]
                return None if quantity is None else getattr(self.config, quantity)
        self.fail(file, node, "unknown attribute")

    def call(self, node: ast.Call, env: dict, file: str):
        func, c = node.func, self.config
        if isinstance(func, ast.Name):
            name = func.id
            if name in ("max", "min", "int") and not node.keywords:
                args = [self.expr(a, env, file) for a in node.args]
                if not all(type(a) is int for a in args) or (name == "int") != (len(args) == 1):
                    self.fail(file, node, f"{name} of non-integers")
                builtin: Dict[str, Callable[..., int]] = {"max": max, "min": min, "int": lambda x: x}
                return builtin[name](*args)
            if name == "get_spec" and not node.args:
                return _SPEC
            if name == "get_schedule" and not node.args:
                return _SCHEDULE
            if name == "get_parallel" and not node.args:
                return _PARALLEL
            if name == "max_speculative_num_draft_tokens" and not node.args:
                return c.D
            keys = {spec[0]: key for key, spec in FUNCTIONS.items() if not spec[1]}
            if name in keys and not node.args and not node.keywords:
                return self.call_function(keys[name])
        if isinstance(func, ast.Attribute):
            if ast.unparse(func) == "SpeculativeAlgorithm.from_string" and len(node.args) == 1:
                value = self.expr(node.args[0], env, file)
                if not isinstance(value, str):
                    self.fail(file, node, "the algorithm is not a name")
                return Algo(value.upper())
            if not node.args and not node.keywords:
                target = self.expr(func.value, env, file)
                if isinstance(target, Algo):
                    return self.method(func.attr, target)
        self.fail(file, node, "call of something kvfence does not read")


_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: a // b}
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
            ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
            ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def merge(*cited: List[str]) -> List[str]:
    """``file:l1,l2`` citations of several answers as one list, a file once."""
    lines: Dict[str, set] = {}
    for group in cited:
        for text in group:
            file, _, numbers = text.rpartition(":")
            lines.setdefault(file, set()).update(int(n) for n in numbers.split(","))
    return [f"{file}:{','.join(map(str, sorted(n)))}" for file, n in sorted(lines.items())]


# -- the questions --------------------------------------------------------------------------------------------
def _local(fn: ast.AST, name: str, before: int) -> Optional[ast.Assign]:
    """The last plain ``name = ...`` of ``fn`` before line ``before``."""
    found: Optional[ast.Assign] = None
    for stmt in ast.walk(fn):
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and stmt.targets[0].id == name and stmt.lineno < before):
            if found is None or stmt.lineno > found.lineno:
                found = stmt
    return found


def _local_expr(it: Interpreter, file: str, fn, node, env: dict):
    """``node`` of ``fn``'s body evaluated with its locals taken as their last assignment before it."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - set(env) - {"SpeculativeAlgorithm"}
    local = dict(env)
    for name in sorted(names):
        assign = _local(fn, name, node.lineno)
        if assign is not None:
            it.cite(file, assign)
            local[name] = _local_expr(it, file, fn, assign.value, env)
    return it.expr(node, local, file)


def row_width_extra(doc: dict, config: Config) -> Answer:
    """The row's headroom past the context length: the pool builder's ``max_context_len`` keyword minus the
    context length, with ``get_req_to_token_extra_context_len`` evaluated for the config."""
    it = Interpreter(doc, config)
    file, fn = it.body("pool")
    kw = next((k for n in ast.walk(fn) if isinstance(n, ast.Call) for k in n.keywords
               if k.arg == "max_context_len"), None)
    if kw is None:
        it.fail(file, fn, "the pool is built without max_context_len")
    it.cite(file, kw.value)
    extra = it.call_function("extra")
    ctx = 1 << 20  # any context: the keyword must be the context plus the headroom
    env = {p.arg: extra for p in fn.args.args + fn.args.kwonlyargs if p.arg == "extra_max_context_len"}
    width = _with_context(it, file, kw.value, env, ctx)
    if width - ctx != extra or _with_context(it, file, kw.value, env, ctx + 7) != width + 7:
        it.fail(file, kw.value, "the row width is not the context length plus the headroom")
    return Answer(extra, it.cited())


def _with_context(it: Interpreter, file: str, node, env: dict, ctx: int):
    text = ast.unparse(node)
    if "self.model_config.context_len" not in text:
        it.fail(file, node, "the row width does not read the model's context length")
    tree = ast.parse(text.replace("self.model_config.context_len", str(ctx)), mode="eval").body
    ast.copy_location(tree, node)
    return it.expr(tree, env, file)


def path_of(doc: dict, config: Config) -> Tuple[str, List[str]]:
    """Which decode preparation ``spec_prepare_for_decode`` routes the algorithm to: ``dflash``, ``uno`` or
    ``eagle``, and the lines that say so."""
    it = Interpreter(doc, config)
    cls_file, cls = it.body("algorithm")
    if not any(isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == config.algorithm
                                                 for t in s.targets) for s in cls.body):
        raise Unreadable(f"no {config.algorithm} in this release's SpeculativeAlgorithm ({cls_file}:{cls.lineno})")
    file, fn = it.body("dispatch")
    algo = Algo(config.algorithm)
    for node in ast.walk(fn):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Call)
                and ast.unparse(node.test.func).startswith("batch.spec_algorithm.")):
            continue
        it.cite(file, node)
        chain = node
        while True:
            test = chain.test
            if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute)
                    and ast.unparse(test.func.value) == "batch.spec_algorithm"):
                it.fail(file, test, "a branch that is no predicate of the algorithm")
            if it.method(test.func.attr, algo):
                return _branch(it, file, chain.body, config), it.cited()
            if len(chain.orelse) == 1 and isinstance(chain.orelse[0], ast.If):
                chain = chain.orelse[0]
                continue
            return _branch(it, file, chain.orelse, config), it.cited()
    it.fail(file, fn, "no branch on the algorithm")


def _branch(it: Interpreter, file: str, body, config: Config) -> str:
    text = "\n".join(ast.unparse(s) for s in body)
    for s in body:
        it.cite(file, s)
    if "eagle_prepare_for_decode(" in text:
        return "eagle"
    if "UnoDraftInput" in text:
        return "uno"
    if "batch.spec_info.prepare_for_decode(batch)" in text and config.algorithm in ("DFLASH", "DSPARK"):
        if config.algorithm == "DSPARK" and it.doc.get("dspark") is None:
            raise Unreadable("DSPARK: no evidence in this release that its decode state is DFlashDraftInputV2")
        return "dflash"
    raise Unreadable(f"{config.algorithm}: the decode preparation it reaches is not one kvfence reads "
                     f"({text[:120]})")


def alloc_page(doc: dict, config: Config) -> Answer:
    """The page the KV allocator hands out, which the decode step aligns its end to: the ``page_size=`` of the
    allocators ``_build_token_to_kv_pool_allocator`` builds by ``attn_dcp_size`` (the paged allocator of decode
    context parallelism), evaluated for the config; without DCP (``dcp`` 1) every allocator pages at ``P``."""
    it, entry, sites = Interpreter(doc, config), doc["functions"]["allocator"], []
    if "absent" not in entry:
        file, fn = it.body("allocator")
        sites = [(file, k.value) for n in ast.walk(fn) if isinstance(n, ast.Call) for k in n.keywords
                 if k.arg == "page_size" and "attn_dcp_size" in ast.unparse(k.value)]
    if not sites:
        if config.dcp == 1:
            return Answer(config.P, [])
        raise Unreadable(f"no KV allocator of this release pages by attn_dcp_size "
                         f"({entry.get('absent') or 'KVCacheConfigurator._build_token_to_kv_pool_allocator'}): "
                         f"its page under --dcp-size {config.dcp} is not read")
    for file, node in sites:
        it.cite(file, node)
    values = {it.expr(node, {}, file) for file, node in sites}
    if len(values) != 1 or type(next(iter(values))) is not int:
        it.fail(sites[0][0], sites[0][1], "the allocators page differently")
    return Answer(values.pop(), it.cited())


def reservation(doc: dict, config: Config) -> Answer:
    """The tokens one decode step reserves past the committed length: the ``reserve`` the algorithm's decode
    preparation passes to ``page_aligned_decode_alloc_lens``, or (0.5.18's EAGLE) the reservation of its inline
    ``nxt = max(cur, ceil((committed + R) / page_size) * page_size)``, evaluated for the config."""
    path, lines = path_of(doc, config)
    it = Interpreter(doc, config)
    file, fn = it.body(path)
    call = next((n for n in ast.walk(fn) if isinstance(n, ast.Call)
                 and ast.unparse(n.func) == "page_aligned_decode_alloc_lens"), None)
    kw = next((k for k in call.keywords if k.arg == "reserve"), None) if call is not None else None
    if kw is None:
        inline = _nxt_assign(fn)
        if inline is None:
            it.fail(file, fn, "no page_aligned_decode_alloc_lens(..., reserve=...) in the decode preparation")
        return Answer(_inline_reserve(it, file, fn, inline), merge(lines, it.cited()))
    it.cite(file, call)
    value = _local_expr(it, file, fn, kw.value, {})
    if type(value) is not int:
        it.fail(file, kw.value, "the reservation is not an integer")
    return Answer(value, merge(lines, it.cited()))


def _nxt_assign(fn) -> Optional[ast.Assign]:  # the page alignment's ``nxt = ...``
    return next((n for n in ast.walk(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
                 and isinstance(n.targets[0], ast.Name) and n.targets[0].id == "nxt"), None)


def _nxt_value(it: Interpreter, file: str, fn, assign: ast.Assign, committed: int, allocated: int, page: int):
    """``nxt`` of ``assign`` for one request (its committed and allocated lengths) at an alignment ``page``."""
    text = ast.unparse(assign.value)
    for old, new in (("r.kv.kv_committed_len", str(committed)), ("r.kv_committed_len", str(committed)),
                     ("r.kv.kv_allocated_len", str(allocated))):
        text = text.replace(old, new)
    tree = ast.copy_location(ast.parse(text, mode="eval").body, assign.value)
    return _local_expr(it, file, fn, tree, {"page_size": page, "cur": allocated})


def _inline_reserve(it: Interpreter, file: str, fn, assign: ast.Assign) -> int:
    """``R`` of an inline page alignment: ``nxt`` at page 1 from nothing, checked at other pages and lengths."""
    it.cite(file, assign)
    reserve = _nxt_value(it, file, fn, assign, 0, 0, 1)
    if type(reserve) is not int:
        it.fail(file, assign, "the reservation is not an integer")
    for committed, page in ((5, 16), (17, 8), (100, 64)):
        if _nxt_value(it, file, fn, assign, committed, 0, page) != -(-(committed + reserve) // page) * page:
            it.fail(file, assign, "nxt is not the committed length plus a reservation aligned up to the page")
    return reserve


def host_checks(doc: dict, config: Config) -> List[dict]:
    """The checks of the row width in the algorithm's decode preparation (an ``assert`` or ``raise`` that reads
    ``req_to_token.shape[1]``): their text and line, and whether they run for the config (``None``: unknown)."""
    path, _ = path_of(doc, config)
    it = Interpreter(doc, config)
    file, fn = it.body(path)
    out = []
    parents = {child: node for node in ast.walk(fn) for child in ast.iter_child_nodes(node)}
    width_names = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and "shape[1]" in ast.unparse(n.value)
                   for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(fn):
        if not isinstance(node, (ast.Assert, ast.If)):
            continue
        test = ast.unparse(node.test)
        if not ("shape[1]" in test or any(name in test for name in width_names)):
            continue
        guard = parents.get(node)
        runs: Optional[bool] = True
        while guard is not None and guard is not fn:
            if isinstance(guard, ast.If):
                try:
                    page = alloc_page(doc, config).value
                    runs = runs and bool(_local_expr(it, file, fn, guard.test, {"page_size": page}))
                except Unreadable:
                    runs = None
                    break
            guard = parents.get(guard)
        out.append({"text": test, "where": f"{file}:{node.lineno}", "runs": runs})
    return out
