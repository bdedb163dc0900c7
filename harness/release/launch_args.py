"""A release's argument facts, read from its wheel as data: how SGLang resolves the speculative flags, which
launches it refuses at startup, and the CUDA-graph defaults it computes (``kvfence affected``).

``load(version)`` parses the release's argument code (``sglang/srt/server_args.py`` and ``sglang/srt/arg_groups/``)
and graph runner with ``ast``, never importing or running it, and caches one record per release. The record holds:

* ``eagle``: the EAGLE-family handler's automatic choice (the ``if ... speculative_num_steps is None`` block that
  calls ``auto_choose_speculative_params``, its assertion, and that function's choices by architecture), the
  ``if`` statements after it in order (each test's text, the message it raises, whether it sets the draft tokens
  to ``steps + 1``), and the ``max_running_requests`` it sets when none is given;
* ``graph``: the graph max batch size's flag (a server-args field), its GPU-memory default table
  (``gpu_mem < N * 1024`` branches, with their ``tp_size < K`` split) and the line where the capture sizes are
  clamped to the request pool;
* ``fa4_page``: the page size SGLang forces for ``fa4`` on SM100 GPUs, the test that decides it;
* ``mla_archs``: the architectures ``ModelConfig`` gives MLA attention.

``kvfence.release.launch_eval`` evaluates the recorded tests on a launch's values. A fact the wheel does not hold
is absent from the record (with ``unread`` saying why), never guessed.
"""

from __future__ import annotations

import ast
import json
import os
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple, Union

from kvfence.release.wheel_ast import Wheel

FORMAT = 2
ARG_FILES = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/")
RUNNER_FILES = ("sglang/srt/model_executor/",)
MODEL_CONFIG = "sglang/srt/configs/model_config.py"
AUTO_CHOOSE = "auto_choose_speculative_params"
#: Comparisons that raise TypeError on None.
ORDERS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
#: The server-args fields that name the decode graph's largest batch, newest first.
GRAPH_FIELDS = ("cuda_graph_max_bs_decode", "cuda_graph_max_bs")


def record_path(version: str) -> Path:
    from kvfence.release.wheels import cache_root

    return cache_root() / "launch" / f"sglang-{version}.json"


def load(version: str, *, announce=None) -> dict:
    """The argument facts of ``sglang==version``: from the cache, else read from the wheel (``BadInput`` when the
    wheel cannot be found or read)."""
    from kvfence.release import upstream, wheels

    wheels.check_version(version)
    path = record_path(version)
    if path.is_file():
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("version") == version:
            return doc
    with tempfile.TemporaryDirectory(prefix="kvfence-wheel-") as tmp:
        wheel = upstream.find_wheel(version, None, wheels.offline_by_env(), Path(tmp), announce)
        doc = read(Wheel(wheel), version)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(staging, path)
    return doc


def read(wheel: Wheel, version: str) -> dict:
    doc: dict = {"format": FORMAT, "version": version, "unread": []}
    for key, reader in (("eagle", _eagle), ("graph", _graph), ("fa4_page", _fa4_page), ("mla_archs", _mla_archs)):
        try:
            value = reader(wheel)
        except (RecursionError, MemoryError):  # a tree nested past what kvfence walks: not read, said so
            value = "nested too deeply to read"
        if isinstance(value, str):
            doc["unread"].append(f"{key}: {value}")
        else:
            doc[key] = value
    return doc


# -- walking the wheel ------------------------------------------------------------------------------------------
def _trees(wheel: Wheel, prefixes: Tuple[str, ...], needle: str) -> Iterator[Tuple[str, ast.Module]]:
    """The parsed files under ``prefixes`` whose text holds ``needle`` (the others are not parsed)."""
    for name in sorted(wheel.files):
        if name.startswith(prefixes) and needle in wheel.files[name]:
            tree = wheel.tree(name)
            if tree is not None:
                yield name, tree


def _functions(tree: ast.AST) -> Iterator[Union[ast.FunctionDef, ast.AsyncFunctionDef]]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _calls(node: ast.AST, suffix: str) -> bool:
    return any(isinstance(n, ast.Call) and ast.unparse(n.func).endswith(suffix) for n in ast.walk(node))


def _src(file: str, node: Union[ast.stmt, ast.expr]) -> str:
    return f"{file}:{node.lineno}"


def _bodies(node: ast.AST) -> Iterator[List[ast.stmt]]:
    """Every statement list under ``node`` (bodies and ``else`` blocks)."""
    for n in ast.walk(node):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(n, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


def _chain(node: ast.If) -> Iterator[Tuple[Optional[ast.expr], List[ast.stmt], ast.stmt]]:
    """``(test, body, node)`` of an ``if / elif / else`` chain (test None for the ``else``)."""
    while True:
        yield node.test, node.body, node
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If) \
                and node.orelse[0].col_offset == node.col_offset:  # an elif (an `else: if` is indented)
            node = node.orelse[0]
            continue
        if node.orelse:
            yield None, node.orelse, node.orelse[0]
        return


def _int(node: ast.expr) -> Optional[int]:
    """An integer constant expression (``20 * 1024``), or None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Sub)):
        a, b = _int(node.left), _int(node.right)
        if a is None or b is None:
            return None
        return a * b if isinstance(node.op, ast.Mult) else a + b if isinstance(node.op, ast.Add) else a - b
    return None


def raise_text(body: List[ast.stmt]) -> str:
    for stmt in body:
        if isinstance(stmt, ast.Raise) and stmt.exc is not None:
            exc = stmt.exc
            if isinstance(exc, ast.Call) and exc.args:
                first = exc.args[0]
                text = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else \
                    ast.unparse(first)
                return " ".join(f"{ast.unparse(exc.func)}: {text}".split())[:300]  # one line
            return " ".join(ast.unparse(exc).split())[:300]
    return ""


# -- the EAGLE family ---------------------------------------------------------------------------------------------
def _sets(body: List[ast.stmt], field: str) -> Optional[ast.expr]:
    """The value a block gives ``field`` (``x.field = V`` or a call's ``field=V`` keyword), directly in it."""
    for stmt in body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == field
                                                for t in stmt.targets):
            return stmt.value
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            for kw in stmt.value.keywords:
                if kw.arg == field:
                    return kw.value
    return None


def _statement(file: str, node: ast.If) -> dict:
    tokens = _sets(node.body, "speculative_num_draft_tokens")
    orders = {ast.unparse(c): f"{file}:{c.lineno}" for c in ast.walk(node.test)
              if isinstance(c, ast.Compare) and any(isinstance(op, ORDERS) for op in c.ops)}
    return {"source": _src(file, node), "test": ast.unparse(node.test), "raises": raise_text(node.body),
            "orders": orders,
            "steps_plus_one": tokens is not None and ast.unparse(tokens).endswith("speculative_num_steps + 1"),
            "body": [_statement(file, s) for s in node.body if isinstance(s, ast.If)]}


def _auto_function(wheel: Wheel) -> Optional[dict]:
    for file, tree in _trees(wheel, ARG_FILES, AUTO_CHOOSE):
        for fn in _functions(tree):
            if fn.name.endswith(AUTO_CHOOSE):
                return _auto_choices(file, fn)
    return None


def _auto_choices(file: str, fn: Union[ast.FunctionDef, ast.AsyncFunctionDef]) -> dict:
    """The function's ``(steps, topk, draft tokens)`` by architecture list, and its default."""
    out: dict = {"source": _src(file, fn), "by_arch": [], "default": None}
    for stmt in fn.body:
        if isinstance(stmt, ast.If):
            for test, body, node in _chain(stmt):
                values = _returned(body)
                if values is None:
                    continue
                if test is None:
                    out["default"] = {"values": values, "source": _src(file, node)}
                elif "speculative_algorithm" not in ast.unparse(test):
                    archs = [c.value for c in ast.walk(test)
                             if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                    out["by_arch"].append({"archs": archs, "values": values, "source": _src(file, node)})
        elif out["default"] is None:
            values = _returned([stmt])
            if values is not None:
                out["default"] = {"values": values, "source": _src(file, stmt)}
    return out


def _returned(body: List[ast.stmt]) -> Optional[List[int]]:
    for stmt in body:
        if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Tuple):
            values = [_int(e) for e in stmt.value.elts]
            if len(values) == 3 and None not in values:
                return [v for v in values if v is not None]
    return None


def _eagle(wheel: Wheel):
    auto = _auto_function(wheel)
    if auto is None or auto["default"] is None:
        return f"no {AUTO_CHOOSE} with a default choice in {', '.join(ARG_FILES)}"
    for file, tree in _trees(wheel, ARG_FILES, AUTO_CHOOSE):
        for fn in _functions(tree):
            for block in _bodies(fn):
                at = [i for i, s in enumerate(block) if isinstance(s, ast.If) and _calls(s, AUTO_CHOOSE)
                      and "speculative_num_steps is None" in ast.unparse(s.test)]
                if at:
                    return _eagle_record(file, fn, block, at[0], auto)
    return f"no `if ... speculative_num_steps is None` block calling {AUTO_CHOOSE}"


def _eagle_record(file: str, fn: Union[ast.FunctionDef, ast.AsyncFunctionDef], block: List[ast.stmt], at: int,
                  auto: dict) -> dict:
    guard = block[at]
    assert isinstance(guard, ast.If)  # at: the index of an if block (_eagle)
    check = next((s for s in guard.body if isinstance(s, ast.Assert)), None)
    consts = {}
    for n in ast.walk(fn):  # local names bound to literal lists (the backends a check allows)
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                and isinstance(n.value, (ast.Tuple, ast.List)) \
                and all(isinstance(e, ast.Constant) for e in n.value.elts):
            consts[n.targets[0].id] = [e.value for e in n.value.elts if isinstance(e, ast.Constant)]  # all are
    running = None
    for n in ast.walk(fn):
        if isinstance(n, ast.If) and ast.unparse(n.test).endswith("max_running_requests is None"):
            value = _sets(n.body, "max_running_requests")
            if value is not None and _int(value) is not None:
                running = {"value": _int(value), "source": _src(file, value)}
                break
    return {"handler": _src(file, fn), "auto": dict(auto, guard=ast.unparse(guard.test), guard_source=_src(file, guard),
                                                     assert_test=ast.unparse(check.test) if check else "",
                                                     assert_source=_src(file, check) if check else ""),
            "after": [_statement(file, s) for s in block[at + 1:] if isinstance(s, ast.If)],
            "consts": consts, "max_running": running}


# -- the CUDA graph's largest batch -------------------------------------------------------------------------------
def _graph(wheel: Wheel):
    flag = None
    for file, tree in _trees(wheel, ARG_FILES, "cuda_graph_max_bs"):
        for n in ast.walk(tree):
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id in GRAPH_FIELDS:
                if flag is None or GRAPH_FIELDS.index(n.target.id) < GRAPH_FIELDS.index(flag["field"]):
                    flag = {"field": n.target.id, "flag": "--" + n.target.id.replace("_", "-"),
                            "source": _src(file, n)}
    if flag is None:
        return f"no server-args field {' or '.join(GRAPH_FIELDS)}"
    table = _memory_table(wheel)
    if isinstance(table, str):
        return table
    return dict(flag, **table, clamp=_clamp(wheel))


def _memory_table(wheel: Wheel):
    for file, tree in _trees(wheel, ARG_FILES, "gpu_mem is not None"):
        for fn in _functions(tree):
            for n in ast.walk(fn):
                if isinstance(n, ast.If) and ast.unparse(n.test) == "gpu_mem is not None" and n.body \
                        and isinstance(n.body[0], ast.If):
                    rows = [_memory_row(file, test, body, node) for test, body, node in _chain(n.body[0])]
                    fallback = _memory_row(file, None, n.orelse, n.orelse[0]) if n.orelse else None
                    if rows and all(rows):
                        return {"function": _src(file, fn), "rows": rows, "fallback": fallback}
    return "no `if gpu_mem is not None:` table of graph batch sizes"


def _memory_row(file: str, test, body: List[ast.stmt], node: ast.AST) -> Optional[dict]:
    below = None
    if test is not None:
        if not (isinstance(test, ast.Compare) and ast.unparse(test.left) == "gpu_mem"
                and isinstance(test.ops[0], ast.Lt)):
            return None
        below = _int(test.comparators[0])
    for block in _bodies(ast.Module(body=body, type_ignores=[])):
        for stmt in block:
            if isinstance(stmt, ast.If) and ast.unparse(stmt.test).endswith("max_bs is None"):
                return _max_bs_rule(file, stmt, below)
    return None


def _max_bs_rule(file: str, guard: ast.If, below: Optional[int]) -> Optional[dict]:
    row = {"below_mib": below, "source": _src(file, guard)}
    value = _sets(guard.body, "max_bs") or _sets(guard.body, "cuda_graph_max_bs")
    if value is not None and _int(value) is not None:
        return dict(row, max_bs=_int(value), source=_src(file, value))
    split = next((s for s in guard.body if isinstance(s, ast.If)), None)
    if split is not None and isinstance(split.test, ast.Compare) and ast.unparse(split.test.left).endswith("tp_size") \
            and isinstance(split.test.ops[0], ast.Lt) and _int(split.test.comparators[0]) is not None:
        small = _sets(split.body, "max_bs") or _sets(split.body, "cuda_graph_max_bs")
        large = _sets(split.orelse, "max_bs") or _sets(split.orelse, "cuda_graph_max_bs")
        if small is not None and large is not None and _int(small) is not None and _int(large) is not None:
            return dict(row, tp_below=_int(split.test.comparators[0]), max_bs=_int(small), max_bs_tp=_int(large),
                        source=_src(file, split))
    return None


def _clamp(wheel: Wheel) -> Optional[dict]:
    """Where the capture sizes are clamped to the request pool (``get_batch_sizes_to_capture``)."""
    # the CUDA runner's first (a CPU graph runner has its own)
    trees = sorted(_trees(wheel, RUNNER_FILES, "def get_batch_sizes_to_capture"), key=lambda ft: "cuda" not in ft[0])
    for file, tree in trees:
        for fn in _functions(tree):
            if fn.name == "get_batch_sizes_to_capture":
                for n in ast.walk(fn):
                    if isinstance(n, ast.Assign) and "req_to_token_pool.size" in ast.unparse(n):
                        return {"source": _src(file, n), "text": ast.unparse(n)[:160]}
    return None


# -- FA4's page on SM100, MLA architectures ----------------------------------------------------------------------
def _fa4_page(wheel: Wheel):
    for file, tree in _trees(wheel, ARG_FILES, "fa4"):
        for n in ast.walk(tree):
            if isinstance(n, ast.If) and "'fa4'" in ast.unparse(n.test) and "sm100" in ast.unparse(n.test):
                page = _page_set(n.body)
                if page is not None:
                    return {"page": page, "test": ast.unparse(n.test), "source": _src(file, n)}
    return "no `fa4 ... sm100` test that sets the page size"


def _page_set(body: List[ast.stmt]) -> Optional[int]:
    value = _sets(body, "page_size")
    if value is not None:
        return _int(value)
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(n, ast.Return) and isinstance(n.value, ast.Dict):
            for k, v in zip(n.value.keys, n.value.values):
                if isinstance(k, ast.Constant) and k.value == "page_size" and (page := _int(v)) is not None \
                        and page > 1:
                    return page
    return None


def _mla_archs(wheel: Wheel):
    tree = wheel.tree(MODEL_CONFIG) if MODEL_CONFIG in wheel.files else None
    if tree is None:
        return f"no {MODEL_CONFIG}"
    archs: Dict[str, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.If):
            for test, body, node in _chain(n):
                sets = _sets(body, "attention_arch")
                if test is not None and sets is not None and ast.unparse(sets).endswith("AttentionArch.MLA"):
                    for c in ast.walk(test):
                        if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.endswith(
                                ("ForCausalLM", "ForConditionalGeneration", "NextN", "MTP")):
                            archs.setdefault(c.value, f"{MODEL_CONFIG}:{node.lineno}")
    return {"archs": archs} if archs else "no architecture given AttentionArch.MLA"


def unread_reason(facts: Optional[dict], key: str) -> str:
    """Why ``facts`` lacks ``key`` (a record's ``unread`` line), for a line's ``assumed``."""
    if facts is None:
        return "the release's argument code is not read"
    return next((u.split(": ", 1)[1] for u in facts.get("unread", []) if u.startswith(key + ":")), "not read")



