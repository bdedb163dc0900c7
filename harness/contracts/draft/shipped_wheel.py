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

Expressions are evaluated by ``kvfence.release.wheel_ast.Evaluator`` over its ``SYMBOLS`` (the runner's
``max_bs`` among them); anything it does not know is ``Unreadable`` with the text and ``file:line``: never a
guess.

The result is data (``shipped.json`` in the release's cache entry, written by the draft's ``release_kernels``):
formulas as text and as trees over the symbols, and where they came from. Fuzzing reads only that file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from kvfence.errors import BadInput, require
from kvfence.release.wheel_ast import (
    CHECK_SYMBOLS,
    MAX_DEPTH,
    TREE_MAX_DEPTH,
    WIDTH_SYMBOLS,
    Evaluator,
    Site,
    Unreadable,
    Wheel,
    check_tree,
    dotted,
    evaluate,
    render,
    substitute,
    symbols_of,
    too_deep,
    tree_depth,
)

#: Bumped when the record's layout changes (``kvfence.contracts.draft.release_kernels``' cache format follows it).
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
    check_tree(site["tree"], symbols, what)
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


def unread_note(record: dict) -> str:
    """``; ...`` naming what of a wheel could not be read (``unreadable``, ``skipped_members``), or ``""``:
    a release with no backend found says whether one may sit in a member kvfence could not read."""
    parts = [record["unreadable"]] if record.get("unreadable") else []
    skipped = record.get("skipped_members") or {}
    if skipped:
        shown = ", ".join(f"{name} ({why})" for name, why in list(skipped.items())[:3])
        parts.append(f"{len(skipped)} member(s) not read: {shown}" + (", ..." if len(skipped) > 3 else ""))
    return "".join(f"; {p}" for p in parts)


# -- reading a release ------------------------------------------------------------------------------
def _launches(fn: ast.FunctionDef) -> Optional[Tuple[str, ast.Call]]:
    """``(kernel name, call)`` of the first ``...KERNEL[grid](...)`` launch in ``fn``."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            name = dotted(node.func.value) or ""
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
    return [(dotted(b) or "").rsplit(".", 1)[-1] for b in cls.bases]


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
        name = dotted(node.targets[0])
        func = (dotted(node.value.func) or "").rsplit(".", 1)[-1]
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
                    name = dotted(node.targets[0])
                    if name and name.startswith("self."):
                        attrs.setdefault(name, []).append(node)
            for fn in methods.values():
                for node in ast.walk(fn):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                            and node.func.attr == "init_cuda_graph_state"
                            and (dotted(node.func.value) or "").endswith(RUNNER_BACKEND_ATTR)):
                        return file, node, Site(file, fn, "runner", {}, attrs)
        return None

    def read(self, name: str) -> dict:
        file, cls = self.classes[name]
        record: Dict[str, Any] = {"class": name, "file": file, "line": cls.lineno, "bases": _base_names(cls),
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
        out: Dict[str, Any] = {"formula_text": ast.unparse(width_node), "source": f"{file}:{stmt.lineno}"}
        call = self.runner_call()
        if call is None:
            out.update(_unreadable(Unreadable("init_cuda_graph_state(...)", file,
                                              f"no {RUNNER_CLASS} call of "
                                              f"{RUNNER_BACKEND_ATTR}.init_cuda_graph_state")))
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
        if depth > MAX_DEPTH:
            return True  # too deep to follow: assume it launches (the verdict stays the arithmetic's)
        _, cls, fn = found
        for node in _replay_nodes(fn.body):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                if (dotted(node.func.value) or "").rsplit(".", 1)[-1] in LAUNCHED:
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
                                and (dotted(node.func.value) or "").endswith(RUNNER_BACKEND_ATTR)):
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
            out.update(_unreadable(too_deep(out["formula_text"], f"{file}:{stmt.lineno}")))
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
        buffer = dotted(buffer_arg) if buffer_arg is not None else None
        for stmt in fn.body:
            if stmt.lineno >= launch.lineno:
                break
            test, site_fn, site_file, bound = None, fn, file, {}
            if isinstance(stmt, ast.Assert):
                test = stmt.test
            elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                  and isinstance(stmt.value.func, ast.Name)):
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
                out.update(_unreadable(too_deep(ast.unparse(left), f"{site_file}:{test.lineno}")))
                return out
            out["tree"], out["formula"] = tree, render(tree)
            return out
        return None

    def _is_width(self, node, site: Site, buffer: Optional[str]) -> bool:
        """``BUFFER.shape[1]`` of the buffer the kernel writes (through a helper's parameter)."""
        while isinstance(node, ast.Name) and node.id in site.bound:
            node, site = site.bound[node.id]
        return (buffer is not None and isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "shape" and dotted(node.value.value) == buffer
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
        name = (dotted(test.left) or "").rsplit(".", 1)[-1]
        value = test.comparators[0].value
        op = type(test.ops[0])
        if name in ("topk", "speculative_eagle_topk") and ((op is ast.Gt and value == 1)
                                                          or (op is ast.NotEq and value == 1)
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
