"""Shipped sizing of plug-in contracts, read from a release's wheel as data (docs/contract.md §9, "Shipped
sizing of the plug-in contracts"). It knows no contract by name.

A contract's release knowledge lists its sites (``kvfence.release.knowledge.ShippedSite``): per SGLang backend,
CUDA-graph mode and forward mode, the expression text of the table's row width and of the tokens the launch adds to each
committed length. ``read(contract, wheel)`` finds each text in the backend's class (and its bases in the wheel)
by ``ast`` equality, never importing or running anything, and evaluates it with ``kvfence.release.wheel_ast``'s
restricted evaluator over the quantities of ``SYMBOLS`` (``ctx``, ``page``, ``d``, ``requests``, ``max_len``):
locals of the enclosing method, ``self`` attributes of ``__init__``, module-level integer constants, wheel
helpers, ``triton.cdiv``. A text that is not in the release, or that does not evaluate, is recorded as such
with its reason and ``file:line``: never a guess.

``admission(wheel)`` reads the scheduler's request-length bound (``max_req_len = min(context_len - K, ...)`` in
the tensor-parallel worker, and the ``max_req_len - input_len - 1`` cap of ``max_new_tokens``): it says how
long a request's committed length can get before its last verify, so whether a length past the table is
reachable. ``assess(site_record, admission, ...)`` is the arithmetic over a domain of contexts, page sizes and
draft tokens; the kernel run on its witness is ``kvfence.release.contract_shipped_matrix``'s.
"""

from __future__ import annotations

import ast
from dataclasses import asdict
from typing import Any, Dict, List, Optional, Tuple

from kvfence.errors import BadInput, require
from kvfence.release import wheel_ast
from kvfence.release.knowledge import ShippedSite
from kvfence.release.knowledge import shipped as knowledge_of

#: Bumped when a record's layout changes (a cached record of another format is read again). 2: the attention
#: registry's builders, the graph runner's eager fallback and each site's guard; 3: the admission bound as
#: 0.5.10 spells it too.
FORMAT = 3
#: Dotted names (or expression texts) -> the quantity they stand for. ``ctx``: the model's context length;
#: ``page``: the page size; ``d``: the draft tokens per request (target verify's num_draft_tokens);
#: ``requests``: the largest capture bucket (graph) or the batch size (eager); ``max_len``: the longest
#: committed length of the batch.
SYMBOLS = {
    "self.max_context_len": "ctx", "self.model_config.context_len": "ctx",
    "model_runner.model_config.context_len": "ctx",
    "self.page_size": "page", "page_size": "page",
    "self.num_draft_tokens": "d", "self.speculative_num_draft_tokens": "d",
    "max_bs": "requests", "bs": "requests", "batch_size": "requests", "forward_batch.batch_size": "requests",
    "seq_lens_cpu.max().item()": "max_len", "forward_batch.seq_lens_cpu.max().item()": "max_len",
}
QUANTITIES = ("ctx", "page", "d", "requests", "max_len")
#: The production domain of ``assess``: contexts (powers of two and not, up to 256k), draft tokens 1-16.
CONTEXTS = (1024, 2048, 4095, 4096, 8192, 32000, 32768, 65536, 100000, 128000, 131072, 163840, 200000, 262144)
DRAFT_TOKENS = tuple(range(1, 17))


class _SiteEvaluator(wheel_ast.Evaluator):
    """``kvfence.release.wheel_ast.Evaluator`` with the contract symbols, the site's own, module constants, the
    ``self`` attributes of the class's ``__init__`` (in its file), ``triton.cdiv`` and conditional
    expressions (their smaller branch: the width a launch may get)."""

    def __init__(self, wheel: wheel_ast.Wheel, symbols: Dict[str, str],
                 inits: Dict[str, Tuple[str, ast.FunctionDef, ast.AST]],
                 mro=()):
        super().__init__(wheel)
        self.symbols, self.inits, self.mro = symbols, inits, mro
        #: The method helpers being evaluated: (their function, their locals as trees). A name is looked up
        #: in a frame only while evaluating that method's own body (a helper it calls has its own scope).
        self.frames: List[Tuple[ast.FunctionDef, Dict[str, list]]] = []

    def symbol(self, name: str, site) -> Optional[str]:
        return self.symbols.get(name)

    def expr(self, node, site):
        if site.depth > wheel_ast.MAX_DEPTH:
            self.fail(node, site, "nested too deep")
        if isinstance(node, ast.Name) and self.frames and site.fn is self.frames[-1][0] \
                and node.id in self.frames[-1][1]:
            return self.frames[-1][1][node.id]
        text = ast.unparse(node)
        if text in self.symbols:
            return ["sym", self.symbols[text]]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return ["%", self.expr(node.left, site), self.expr(node.right, site)]
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            return [_COMPARE[type(node.ops[0])], self.expr(node.left, site), self.expr(node.comparators[0], site)]
        if isinstance(node, ast.Call) and wheel_ast.dotted(node.func) == "math.lcm" and len(node.args) >= 2 \
                and not node.keywords:
            return ["lcm"] + [self.expr(a, site) for a in node.args]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                wheel_ast.dotted(node.func.value) == "self" and not node.keywords:
            return self.method(node, site)
        if isinstance(node, ast.IfExp):
            return ["min", self.expr(node.body, site), self.expr(node.orelse, site)]
        if isinstance(node, ast.Call) and (wheel_ast.dotted(node.func) or "").rsplit(".", 1)[-1] == "cdiv" \
                and len(node.args) == 2 and not node.keywords:
            a, b = (self.expr(x, site) for x in node.args)
            return ["//", ["+", a, ["-", b, ["int", 1]]], b]
        if isinstance(node, ast.Name) and node.id not in site.bound and self._local(node, site) is None:
            constant = _module_constant(self.wheel, site.file, node.id)
            if constant is not None:
                return ["int", constant]
        if isinstance(node, ast.Attribute) and text in self.inits and text not in site.bound:
            file, fn, value = self.inits[text]
            return self.expr(value, wheel_ast.Site(file, fn, "backend", {}, {}, site.depth + 1))
        return super().expr(node, site)

    def method(self, call: ast.Call, site):
        """``self.NAME(args)``: a method of the class (or its bases) whose body is assignments, ``if`` blocks
        of assignments and one final ``return``, evaluated with its parameters bound to the arguments."""
        assert isinstance(call.func, ast.Attribute)  # expr sends only self.NAME(...) calls here
        name = call.func.attr
        found = next(((f, fn) for f, cls in self.mro for fn in cls.body
                      if isinstance(fn, ast.FunctionDef) and fn.name == name), None)
        if found is None:
            self.fail(call, site, f"method {name} is not in the class or its bases in the wheel")
        if site.depth > wheel_ast.MAX_DEPTH or len(self.frames) > 4:
            self.fail(call, site, f"method {name}: helpers nested too deep")
        file, fn = found
        params = [a.arg for a in fn.args.args][1:]
        if len(call.args) != len(params) or any(isinstance(a, ast.Starred) for a in call.args):
            self.fail(call, site, f"method {name} ({file}:{fn.lineno}): arguments do not match its parameters")
        frame = {p: self.expr(a, site) for p, a in zip(params, call.args)}
        inner = wheel_ast.Site(file, fn, "backend", {}, {}, site.depth + 1)
        body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        self.frames.append((fn, frame))
        try:
            for stmt in body[:-1]:
                self._statement(stmt, frame, inner, call, name)
            last = body[-1] if body else None
            if not isinstance(last, ast.Return) or last.value is None:
                self.fail(call, site, f"method {name} ({file}:{fn.lineno}) does not end in one return")
            return self.expr(last.value, inner)
        finally:
            self.frames.pop()

    def _statement(self, stmt, frame: dict, inner, call, name: str) -> None:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            frame[stmt.targets[0].id] = self.expr(stmt.value, inner)
            return
        if isinstance(stmt, ast.If):
            test = self.expr(stmt.test, inner)
            branches = []
            for block in (stmt.body, stmt.orelse):
                local = dict(frame)
                self.frames[-1] = (inner.fn, local)
                for s in block:
                    self._statement(s, local, inner, call, name)
                branches.append(local)
            self.frames[-1] = (inner.fn, frame)
            for var in set(branches[0]) | set(branches[1]):
                then, other = branches[0].get(var), branches[1].get(var)
                if then is None or other is None:
                    self.fail(stmt, inner, f"method {name}: {var} is set on one branch only")
                frame[var] = then if then == other else ["if", test, then, other]
            return
        self.fail(stmt, inner, f"method {name}: {type(stmt).__name__} is not an assignment or if")


_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


def _module_constant(wheel: wheel_ast.Wheel, file: str, name: str) -> Optional[int]:
    tree = wheel.tree(file)
    for node in tree.body if tree else []:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == name and isinstance(node.value, ast.Constant)
                and type(node.value.value) is int):
            return node.value.value
    return None


def _find_class(wheel: wheel_ast.Wheel, name: str) -> Optional[Tuple[str, ast.ClassDef]]:
    needle = f"class {name}"
    # The serving runtime's class first: other packages of the wheel reuse backend class names.
    for file in sorted(wheel.files, key=lambda f: (not f.startswith("sglang/srt/"), f)):
        if needle in wheel.files[file] and file.startswith("sglang/"):
            tree = wheel.tree(file)
            for node in tree.body if tree else []:
                if isinstance(node, ast.ClassDef) and node.name == name:
                    return file, node
    return None


def _mro(wheel: wheel_ast.Wheel, name: str) -> List[Tuple[str, ast.ClassDef]]:
    """The class and its bases that the wheel defines, nearest first (at most 8 deep)."""
    out: List[Tuple[str, ast.ClassDef]] = []
    todo, seen = [name], set()
    while todo and len(out) < 8:
        n = todo.pop(0)
        if n in seen:
            continue
        seen.add(n)
        found = _find_class(wheel, n)
        if found is not None:
            out.append(found)
            todo += [(wheel_ast.dotted(b) or "").rsplit(".", 1)[-1] for b in found[1].bases]
    return out


def _parsed(text: str) -> Tuple[str, type]:
    """``text`` as ``ast`` spells it, and whether it is an expression or a statement."""
    try:
        return ast.unparse(ast.parse(text, mode="eval").body), ast.expr
    except SyntaxError:
        return ast.unparse(ast.parse(text).body[0]), ast.stmt


def _occurrence(scopes, text: str, within: str = ""):
    """``(file, method, node)``: the first (by line) expression or statement that reads as ``text``, in the
    nearest of ``scopes`` (``(file, ClassDef)``, or ``(file, method, node)`` for a subtree) that has one."""
    wanted, kind = _parsed(text)
    for scope in scopes:
        if isinstance(scope[1], ast.ClassDef):
            file, cls = scope
            bodies = [(fn, fn) for fn in cls.body
                      if isinstance(fn, ast.FunctionDef) and (not within or fn.name == within)]
        else:
            file, fn, node = scope
            bodies = [(fn, node)]
        hits = [(n.lineno, fn, n) for fn, root in bodies for n in ast.walk(root)  # kind: ast.expr or ast.stmt
                if isinstance(n, (ast.expr, ast.stmt)) and isinstance(n, kind) and ast.unparse(n) == wanted]
        if hits:
            _, fn, node = min(hits, key=lambda h: h[0])
            return file, fn, node
    return None


def _inits(mro) -> Dict[str, Tuple[str, ast.FunctionDef, ast.AST]]:
    """``self.X`` -> its last plain assignment in ``__init__`` (nearest class first)."""
    out: Dict[str, Tuple[str, ast.FunctionDef, ast.AST]] = {}
    for file, cls in reversed(mro):
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                for node in sorted((n for n in ast.walk(fn) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
                    if len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute):
                        name = wheel_ast.dotted(node.targets[0])
                        if name and name.startswith("self."):
                            out[name] = (file, fn, node.value)
    return out


def read_site(wheel: wheel_ast.Wheel, site: ShippedSite) -> dict:
    """One site's record: the width and delta as text, tree and ``file:line``, or why they are not read."""
    record: Dict[str, Any] = {"site": asdict(site)}
    mro = _mro(wheel, site.cls)
    if not mro:
        record["absent"] = f"no class {site.cls} in this release"
        return record
    if site.fill:  # a table the backend's torch code fills: the site is in a release that has the fill
        found = _occurrence(mro, site.fill)
        if found is None:
            record["absent"] = f"no {site.fill!r} in {site.cls} (or its bases): this release fills the table otherwise"
            return record
        record["fill"] = {"text": site.fill, "source": f"{found[0]}:{found[2].lineno}", "method": found[1].name}
    symbols = dict(SYMBOLS, **dict(site.symbols))
    ev = _SiteEvaluator(wheel, symbols, _inits(mro), mro)
    for key, text in (("width", site.width), ("delta", site.delta)):
        if text == "0":
            record[key] = {"text": "0", "tree": ["int", 0], "formula": "0", "source": None}
            continue
        scopes, where = mro, f"{site.cls} (or its bases)"
        if key == "width" and site.within:
            where = f"{site.cls}.{site.within}"
        if key == "delta" and site.evidence:
            evidence = _occurrence(mro, site.evidence)
            if evidence is None:
                record[key] = {"unreadable": {"text": site.evidence, "source": mro[0][0],
                                              "why": f"not found in {where}"}}
                continue
            scopes, where = [evidence], f"{site.evidence!r} ({evidence[0]}:{evidence[2].lineno})"
        found = _occurrence(scopes, text, site.within if key == "width" else "")
        if found is None:
            record[key] = {"unreadable": {"text": text, "source": mro[0][0], "why": f"not found in {where}"}}
            continue
        file, fn, node = found
        try:
            tree = ev.expr(node, wheel_ast.Site(file, fn, "backend", {}, {}, 0))
            record[key] = {"text": ast.unparse(node), "tree": tree, "formula": wheel_ast.render(tree),
                           "source": f"{file}:{node.lineno}", "method": fn.name}
        except wheel_ast.Unreadable as exc:
            record[key] = {"unreadable": {"text": exc.text, "source": exc.where, "why": exc.why}}
    return record


def admission(wheel: wheel_ast.Wheel) -> dict:
    """The scheduler's bound on a request's tokens: ``max_req_len = min(<ctx> - K, ...)`` and the
    ``max_req_len - input_len - 1`` cap of ``max_new_tokens``. ``max_length`` is the longest length a verify can
    start from, ``ctx - K - 3``, when both are read (see the comment below)."""
    out: dict = {}
    for file in sorted(f for f in wheel.files if f.startswith("sglang/srt/managers/") and "tp_worker" in f):
        tree = wheel.tree(file)
        for node in ast.walk(tree) if tree else []:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and wheel_ast.dotted(node.targets[0]) in ("max_req_len", "self.max_req_len")
                    and isinstance(node.value, ast.Call)
                    and wheel_ast.dotted(node.value.func) == "min" and node.value.args):
                first = node.value.args[0]
                if (isinstance(first, ast.BinOp) and isinstance(first.op, ast.Sub)
                        and (wheel_ast.dotted(first.left) or "").endswith("context_len")
                        and isinstance(first.right, ast.Constant) and type(first.right.value) is int):
                    out["max_req_len"] = {"text": ast.unparse(node.value), "source": f"{file}:{node.lineno}",
                                          "minus": first.right.value}
    # ``self.max_req_len - <the input's length> - 1`` (0.5.23 spells the input ``input_len``, 0.5.10
    # ``len(req.origin_input_ids)``): the first by line in the scheduler's files.
    for file in sorted(f for f in wheel.files if f.startswith("sglang/srt/managers/scheduler")):
        tree = wheel.tree(file)
        hits = sorted((node.lineno, ast.unparse(node)) for node in (ast.walk(tree) if tree else [])
                      if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
                      and isinstance(node.right, ast.Constant) and node.right.value == 1
                      and isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Sub)
                      and wheel_ast.dotted(node.left.left) == "self.max_req_len")
        if hits:
            out["new_tokens_cap"] = {"text": hits[0][1], "source": f"{file}:{hits[0][0]}"}
            break
    if "max_req_len" in out and "new_tokens_cap" in out:
        # input + max_new <= max_req_len - 1, and a request still verifying has fewer outputs than max_new:
        # committed <= ctx - K - 2. One less for the last accepted token, whose KV the verify itself writes.
        out["minus"] = out["max_req_len"]["minus"] + 3
        out["max_length"] = f"ctx - {out['minus']}"
    return out


def registry(wheel: wheel_ast.Wheel) -> dict:
    """Which classes each ``--attention-backend`` name builds: the functions SGLang registers with
    ``@register_attention_backend("NAME")`` and the classes they return (``{"names": {NAME: {"classes": [...],
    "source": file:line}}}``; empty where the release has no such registry: the name is then the site's own)."""
    names: dict = {}
    for file in sorted(f for f in wheel.files if f.startswith("sglang/srt/") and "register_attention_backend(" in
                       wheel.files[f]):
        tree = wheel.tree(file)
        for fn in tree.body if tree else []:
            if not isinstance(fn, ast.FunctionDef):
                continue
            for dec in fn.decorator_list:
                if (isinstance(dec, ast.Call) and wheel_ast.dotted(dec.func) == "register_attention_backend"
                        and dec.args and isinstance(dec.args[0], ast.Constant) and isinstance(dec.args[0].value, str)):
                    classes = sorted({(wheel_ast.dotted(n.value.func) or "").rsplit(".", 1)[-1] for n in ast.walk(fn)
                                      if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)} - {""})
                    names.setdefault(dec.args[0].value, {"classes": classes, "source": f"{file}:{dec.lineno}"})
    return {"names": names}


#: The graph runner's test of whether a batch fits its capture buckets; a batch that does not runs eagerly.
EAGER_FALLBACK = "cuda_graph_bs <= self.max_bs"


def eager_fallback(wheel: wheel_ast.Wheel) -> dict:
    """Where the decode CUDA-graph runner sends a batch above its largest capture bucket to the eager path
    (``{"text", "source"}``; empty when the text is not in this release)."""
    wanted = _parsed(EAGER_FALLBACK)[0]
    for file in sorted(f for f in wheel.files if f.startswith("sglang/srt/model_executor/")
                       and "cuda_graph_runner" in f and "max_bs" in wheel.files[f]):
        tree = wheel.tree(file)
        hits = sorted(n.lineno for n in ast.walk(tree) if tree and isinstance(n, ast.expr)
                      and ast.unparse(n) == wanted) if tree else []
        if hits:
            return {"text": EAGER_FALLBACK, "source": f"{file}:{hits[0]}"}
    return {}


def _guard(wheel: wheel_ast.Wheel, site: ShippedSite, mro) -> Optional[dict]:
    """The line of the site's guard: its text nearest before the evidence in the evidence's method (a site
    without evidence: the first in the class; none found: no line)."""
    if not site.guard or not mro:
        return None
    wanted, _ = _parsed(site.guard)
    evidence = _occurrence(mro, site.evidence) if site.evidence else None
    if evidence is not None:
        file, fn, node = evidence
        hits = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.expr) and ast.unparse(n) == wanted
                and n.lineno <= node.lineno]
        if hits:
            return {"text": site.guard, "source": f"{file}:{max(hits)}"}
    if site.evidence:
        return {"text": site.guard, "source": None}  # the site's path is not in this release
    found = _occurrence(mro, site.guard)
    if found is None:
        return {"text": site.guard, "source": None}
    return {"text": site.guard, "source": f"{found[0]}:{found[2].lineno}"}


def read(contract, wheel_path) -> dict:
    """Every shipped site of ``contract`` in one wheel, the scheduler's admission bound, which classes the
    ``--attention-backend`` names build and where a batch above the capture buckets goes eager."""
    sites = knowledge_of(contract.name).sites
    require(sites, f"contract {contract.name} lists no shipped sites")
    wheel = wheel_ast.Wheel(wheel_path)
    records = []
    for s in sites:
        record = read_site(wheel, s)
        guard = _guard(wheel, s, _mro(wheel, s.cls)) if "absent" not in record else None
        if guard is not None:
            record["guard"] = guard
        records.append(record)
    return {"format": FORMAT, "contract": contract.name, "admission": admission(wheel), "registry": registry(wheel),
            "eager_fallback": eager_fallback(wheel), "sites": records}


def validate(doc: dict) -> dict:
    """``doc`` if every site's width and delta is a well-formed formula over ``QUANTITIES`` (or says why it is
    absent or unreadable, as text) and the admission bound has its types; else ``BadInput``."""
    for s in doc["sites"]:
        if "absent" in s:
            require(isinstance(s["absent"], str), "shipped record: absent must be text")
            continue
        for key in ("width", "delta"):
            v = s.get(key)
            require(isinstance(v, dict), f"shipped record: {key} must be an object")
            if "unreadable" in v:
                u = v["unreadable"]
                require(isinstance(u, dict) and all(isinstance(u.get(k), str) for k in ("text", "source", "why")),
                        f"shipped record: bad unreadable {key}")
                continue
            require(isinstance(v.get("formula"), str) and (v.get("source") is None or isinstance(v["source"], str)),
                    f"shipped record: {key} needs formula and source")
            wheel_ast.check_tree(v.get("tree"), QUANTITIES, f"shipped record {key}")
        guard = s.get("guard")
        require(guard is None or (isinstance(guard, dict) and isinstance(guard.get("text"), str)
                                  and (guard.get("source") is None or isinstance(guard["source"], str))),
                "shipped record: bad guard")
    reg = doc.get("registry")
    require(isinstance(reg, dict) and isinstance(reg.get("names"), dict) and all(
        isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("source"), str)
        and isinstance(v.get("classes"), list) and all(isinstance(c, str) for c in v["classes"])
        for k, v in reg["names"].items()), "shipped record: bad registry")
    fallback = doc.get("eager_fallback")
    require(isinstance(fallback, dict) and all(isinstance(fallback.get(k), str) for k in fallback),
            "shipped record: bad eager_fallback")
    adm = doc.get("admission")
    if not isinstance(adm, dict):
        raise BadInput("shipped record: admission must be an object")
    if "minus" in adm:
        require(type(adm["minus"]) is int and 0 <= adm["minus"] < 1 << 20 and isinstance(adm.get("max_length"), str)
                and all(isinstance(adm.get(k), dict) and isinstance(adm[k].get("text"), str)
                        and isinstance(adm[k].get("source"), str) for k in ("max_req_len", "new_tokens_cap")),
                "shipped record: bad admission bound")
    return doc


# -- the arithmetic ---------------------------------------------------------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def assess(site_record: dict, adm: dict, *, contexts=CONTEXTS, draft_tokens=DRAFT_TOKENS) -> dict:
    """Over every (ctx, page size, d) of the domain, with one request at the longest committed length ``L``
    the scheduler admits before a verify (``ctx - minus``; ``ctx`` when the bound is not read), whether the
    launch's length ``L + delta`` needs more pages than the row's width. ``witness``: the smallest such
    (d, ctx, page); ``fits_at``: the longest launch that fits, for the clean run."""
    if "absent" in site_record:
        return {"status": "absent", "why": site_record["absent"]}
    for key in ("width", "delta"):
        if "unreadable" in site_record[key]:
            u = site_record[key]["unreadable"]
            return {"status": "unreadable", "why": f"{key}: {u['why']}: {u['text']} ({u['source']})"}
    minus = adm.get("minus")
    overflow, total, witness, fits = 0, 0, None, None
    for page in site_record["site"]["page_sizes"]:
        for ctx in contexts:
            for d in draft_tokens:
                committed = ctx - minus if minus is not None else ctx
                if committed < 1:
                    continue
                values = {"ctx": ctx, "page": page, "d": d, "requests": 1, "max_len": committed}
                delta = wheel_ast.evaluate(site_record["delta"]["tree"], values)
                width = wheel_ast.evaluate(site_record["width"]["tree"], values)
                need = _cdiv(committed + delta, page)
                total += 1
                point = {"ctx": ctx, "page_size": page, "d": d, "length": committed, "delta": delta,
                         "width": width, "need": need}
                if need > width:
                    overflow += 1
                    if witness is None or (d, ctx, page) < (witness["d"], witness["ctx"], witness["page_size"]):
                        witness = point
                elif fits is None or (d, -ctx) > (fits["d"], -fits["ctx"]):
                    fits = point
    return {"status": "overflows" if witness else "fits", "overflow": overflow, "points": total,
            "witness": witness, "fits_at": fits,
            "reach": "the scheduler admits that length (its admission bound, read from the wheel)" if minus is not None
            else "admission bound not read: the length is the context length, reachability unknown"}
