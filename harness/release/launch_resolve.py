"""A launch as the release's own argument code resolves it (``kvfence affected``), from the facts
``kvfence.release.launch_args`` reads from its wheel.

``resolve(dep, facts)`` takes a deployment as ``kvfence.release.affected.parse_deployment`` read it from the
flags and returns it as SGLang would run it: the EAGLE handler's automatic choice when no steps are given, its
checks in order after that (a check that compares a flag left unset, ``None > 1``, is a TypeError at startup; a
check whose test holds and whose body raises refuses the launch: both are ``BadInput`` naming the check's
``file:line``), the draft tokens it sets to ``steps + 1`` for topk 1, the graph's largest batch from the GPU's
memory and the TP size (``GPUS``) or the flag, the request limit SGLang sets for speculative decoding, and FA4's
page on SM100. A test kvfence cannot evaluate (it reads something the launch does not say) is skipped, and a value
not read from the command is listed in ``assumed`` with the flag that sets it in that release.

The tests are evaluated by ``LaunchEval``, a reader of a few expression forms (comparisons, ``and``/``or``/``not``,
literals, the launch's fields by attribute name): nothing of the wheel is run.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Dict, List, Optional, Tuple

from kvfence.errors import BadInput
from kvfence.release.deployment import ASSUMED_MAX_BS, DFLASH_FAMILY
from kvfence.release.launch_args import unread_reason

#: GPUs kvfence models: name -> (total memory in MiB as the driver reports it, SM version). SGLang's defaults read
#: the memory (``get_device_memory_capacity``, compared with thresholds such as ``90 * 1024``: only the bucket a
#: GPU falls in matters, and every one here is well inside its bucket) and the SM version (FA4's page).
GPUS: Dict[str, Tuple[int, int]] = {
    "H100": (81559, 90), "H200": (143771, 90), "H20": (97871, 90), "B200": (183359, 100),
    "GB200": (189471, 100), "A100-80GB": (81920, 80), "A100-40GB": (40960, 80), "L40S": (46068, 89),
}
#: The GPU kvfence assumes without ``--gpu``.
DEFAULT_GPU = "H100"
#: What ``LaunchEval`` cannot tell (a field the launch does not say, a call it does not model).
UNKNOWN = object()


class _NoneOrdered(Exception):
    """A comparison such as ``x > 1`` met ``None``: SGLang's TypeError at startup."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


class LaunchEval:
    """Evaluates a recorded test on the launch's ``fields``; ``UNKNOWN`` for anything else."""

    def __init__(self, fields: dict, consts: dict):
        self.fields, self.consts = fields, consts

    def __call__(self, text: str):
        try:
            return self.value(ast.parse(text, mode="eval").body)
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # nested past what kvfence walks
            return UNKNOWN

    def value(self, node):  # noqa: C901 - one branch per expression form
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.consts.get(node.id, UNKNOWN)
        if isinstance(node, ast.Attribute):
            return self.fields.get(node.attr, UNKNOWN)
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func).rsplit(".", 1)[-1]
            return self.fields.get(f"{name}()", UNKNOWN)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = [self.value(e) for e in node.elts]
            return UNKNOWN if any(i is UNKNOWN for i in items) else items
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            v = self.value(node.operand)
            return UNKNOWN if v is UNKNOWN else not v
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.value(node.left), self.value(node.right)
            return a + b if isinstance(a, int) and isinstance(b, int) else UNKNOWN
        if isinstance(node, ast.BoolOp):
            return self._boolop(node)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        return UNKNOWN

    def _boolop(self, node: ast.BoolOp):
        v = UNKNOWN
        for operand in node.values:  # Python's short circuit: what is not reached is not evaluated
            v = self.value(operand)
            if v is UNKNOWN:
                return UNKNOWN
            if (not v) if isinstance(node.op, ast.And) else v:
                return v
        return v

    def _compare(self, node: ast.Compare):
        left = self.value(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.value(right_node)
            if left is UNKNOWN or right is UNKNOWN:
                return UNKNOWN
            if isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
                if left is None or right is None:
                    raise _NoneOrdered(ast.unparse(node))
                if not isinstance(left, (int, float)) or not isinstance(right, (int, float)):
                    return UNKNOWN
            ok = _apply(op, left, right)
            if ok is UNKNOWN or not ok:
                return ok
            left = right
        return True


def _apply(op, a, b):
    if isinstance(op, (ast.In, ast.NotIn)):
        if not isinstance(b, (list, set, tuple)):
            return UNKNOWN
        return (a in b) == isinstance(op, ast.In)
    table = {ast.Eq: lambda: a == b, ast.NotEq: lambda: a != b, ast.Is: lambda: a is b,
             ast.IsNot: lambda: a is not b, ast.Lt: lambda: a < b, ast.LtE: lambda: a <= b,
             ast.Gt: lambda: a > b, ast.GtE: lambda: a >= b}
    return table[type(op)]() if type(op) in table else UNKNOWN


# -- the speculative flags -----------------------------------------------------------------------------------------
def _fields(dep, steps, topk, tokens, sm: Optional[int]) -> dict:
    backends = [dep.backend]
    return {"speculative_eagle_topk": topk, "speculative_num_steps": steps, "speculative_num_draft_tokens": tokens,
            "attention_backend": dep.backend, "decode_attention_backend": None, "prefill_attention_backend": None,
            "attention_backends_of()": backends, "speculative_adaptive": False,
            "speculative_algorithm": dep.algorithm, "page_size": dep.page_size if dep.page_size else UNKNOWN,
            "is_sm100": UNKNOWN if sm is None else sm == 100,
            "is_sm100_supported()": UNKNOWN if sm is None else sm >= 100,
            "use_mla_backend()": {"MLA": True, "MHA": False}.get(dep.model_kind, UNKNOWN)}


def _refuse(version: str, source: str, what: str) -> BadInput:
    return BadInput(f"sglang {version} refuses this launch at startup: {source}: {what}")


def _auto(dep, eagle: dict, notes: List[str]) -> Tuple[int, int, int]:
    auto = eagle["auto"]
    row = next((r for r in auto["by_arch"] if dep.model_arch and dep.model_arch in r["archs"]), None)
    chosen = row or auto["default"]
    steps, topk, tokens = chosen["values"]
    if dep.model_arch:
        notes.append(f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} --speculative-num-draft-tokens "
                     f"{tokens} (SGLang's automatic choice for {dep.model_arch}: {chosen['source']})")
    else:
        others = sorted({a for r in auto["by_arch"] if r["values"] != chosen["values"] for a in r["archs"]})
        notes.append(f"--speculative-num-steps {steps} --speculative-eagle-topk {topk} --speculative-num-draft-tokens "
                     f"{tokens} (SGLang's automatic choice for a model not in {', '.join(others) or 'its lists'}: "
                     f"{chosen['source']}; the model's config.json is not read: give a local --model-path)")
    return steps, topk, tokens


def _walk(version: str, statements: List[dict], ev: LaunchEval, state: dict, notes: List[str]) -> None:
    """The handler's ``if`` statements in order: refusals raise ``BadInput``; ``steps + 1`` is applied."""
    for st in statements:
        try:
            holds = ev(st["test"])
        except _NoneOrdered as exc:
            unset = [n for n in ("speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_num_steps")
                     if n in exc.text and ev.fields.get(n) is None]
            flag = f"--{unset[0].replace('_', '-')}" if unset else "the flag"
            raise _refuse(version, st["orders"].get(exc.text, st["source"]),
                          f"`{exc.text}` with {flag} unset (None) is a TypeError: give {flag}") from None
        if holds is UNKNOWN or not holds:
            continue
        if st["raises"]:
            raise _refuse(version, st["source"], st["raises"])
        if st["steps_plus_one"] and state["tokens"] != state["steps"] + 1:
            if state["tokens"] is not None:
                notes.append(f"--speculative-num-draft-tokens {state['steps'] + 1}, not {state['tokens']}: SGLang "
                             f"sets steps + 1 when topk is 1 ({st['source']})")
            state["tokens"] = ev.fields["speculative_num_draft_tokens"] = state["steps"] + 1
        _walk(version, st["body"], ev, state, notes)


def resolve_eagle(dep, eagle: dict, sm: Optional[int], notes: List[str]) -> Tuple[int, int, int]:
    """``(steps, topk, draft tokens)`` as the release's EAGLE handler resolves the given flags."""
    given = dep.given
    steps, topk, tokens = (given.get("--speculative-num-steps"), given.get("--speculative-eagle-topk"),
                           given.get("--speculative-num-draft-tokens"))
    auto = eagle["auto"]
    ev = LaunchEval(_fields(dep, steps, topk, tokens, sm), eagle.get("consts", {}))
    try:
        guard = ev(auto["guard"])
    except _NoneOrdered:
        guard = UNKNOWN
    if guard is True:
        if auto["assert_test"] and ev(auto["assert_test"]) is False:
            raise _refuse(dep.version, auto["assert_source"],
                          f"assert {auto['assert_test']}: --speculative-eagle-topk or --speculative-num-draft-tokens "
                          "without --speculative-num-steps (give all three, or none for SGLang's choice)")
        steps, topk, tokens = _auto(dep, eagle, notes)
    elif guard is UNKNOWN:
        raise BadInput(f"sglang {dep.version}: kvfence cannot evaluate when the release chooses the speculative "
                       f"flags ({auto['guard_source']}: {auto['guard']}): give --speculative-num-steps, "
                       "--speculative-eagle-topk and --speculative-num-draft-tokens")
    state = {"steps": steps, "topk": topk, "tokens": tokens}
    ev.fields.update(speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=tokens)
    _walk(dep.version, eagle["after"], ev, state, notes)
    if topk is None:
        raise BadInput(f"sglang {dep.version}: --speculative-eagle-topk unset, and kvfence reads no check or default "
                       f"of it in {eagle['handler']}: give --speculative-eagle-topk")
    if state["tokens"] is None:
        raise BadInput(f"sglang {dep.version}: with --speculative-eagle-topk {topk} give "
                       f"--speculative-num-draft-tokens ({eagle['handler']} sets no value for it there)")
    return steps, topk, state["tokens"]


# -- CUDA graphs, the request limit, FA4's page --------------------------------------------------------------------
def graph_default(graph: dict, gpu: str, tp: int) -> Tuple[int, str]:
    """The release's default graph max batch size for ``gpu`` at TP ``tp``, and the line it comes from."""
    mib = GPUS[gpu][0]
    for row in graph["rows"]:
        if row["below_mib"] is None or mib < row["below_mib"]:
            big = "tp_below" in row and tp >= row["tp_below"]
            return (row["max_bs_tp"] if big else row["max_bs"]), row["source"]
    return graph["fallback"]["max_bs"], graph["fallback"]["source"]


def _graph_cap(dep, facts: Optional[dict], gpu: str, notes: List[str]) -> Optional[int]:
    """The graph's largest batch: the flag (refused when the release names it otherwise), else the release's
    default for ``gpu`` ("": ``DEFAULT_GPU``, said to be assumed)."""
    graph = (facts or {}).get("graph")
    given = {k: v for k, v in dep.given.items() if k in ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")
             and v is not None}
    if given:
        flag, value = next(iter(given.items()))
        if graph and flag != graph["flag"]:
            raise _refuse(dep.version, graph["source"], f"it has no {flag} (its flag is {graph['flag']})")
        return value
    if not dep.graphs:
        return None
    if not graph:
        notes.append(f"--cuda-graph-max-bs {ASSUMED_MAX_BS} (kvfence's: the release's default is not read: "
                     f"{unread_reason(facts, 'graph')})")
        return ASSUMED_MAX_BS
    name = gpu or DEFAULT_GPU
    cap, source = graph_default(graph, name, dep.tp_size)
    notes.append(f"{graph['flag']} {cap} (SGLang's default on {name}{'' if gpu else ', assumed: give --gpu'}, "
                 f"{GPUS[name][0]} MiB, TP {dep.tp_size}: {source})")
    return cap


def _running(dep, facts: Optional[dict], notes: List[str]) -> Optional[int]:
    if dep.given.get("--max-running-requests") is not None:
        return dep.given["--max-running-requests"]
    running = ((facts or {}).get("eagle") or {}).get("max_running")
    if running is None:
        return None
    notes.append(f"--max-running-requests {running['value']} (SGLang's for speculative decoding: {running['source']})")
    return running["value"]


def _eager_note(facts: Optional[dict], cap: Optional[int], running: Optional[int]) -> str:
    """Why no batch runs eagerly for its size ("" when one can): SGLang captures every size up to the pool."""
    clamp = ((facts or {}).get("graph") or {}).get("clamp")
    if cap is None or running is None or cap < running or clamp is None:
        return ""
    return (f"no batch exceeds the largest capture bucket: SGLang runs at most {running} requests "
            f"(--max-running-requests) and captures every batch size up to its request pool ({clamp['source']}: "
            f"{clamp['text']}; max batch {cap} >= {running})")


def _fa4_page(dep, facts: Optional[dict], sm: Optional[int], topk: int, notes: List[str]) -> Optional[int]:
    rule = (facts or {}).get("fa4_page")
    if dep.backend != "fa4" or rule is None or dep.page_size == rule["page"]:
        return dep.page_size
    fields = _fields(dataclasses.replace(dep, page_size=None), None, topk, None, sm)
    try:
        holds = LaunchEval(fields, {})(rule["test"])
    except _NoneOrdered:
        holds = UNKNOWN
    if holds is True:
        notes.append(f"--page-size {rule['page']} (SGLang forces it for fa4 here: {rule['source']})")
        return rule["page"]
    if holds is UNKNOWN:
        notes.append(f"the page as given: SGLang forces page {rule['page']} for fa4 when {rule['test']} "
                     f"({rule['source']}); give --gpu and a local --model-path to decide it")
    return dep.page_size


def _model_kind(dep, facts: Optional[dict], notes: List[str]) -> str:
    """MLA or MHA by the release's ``ModelConfig`` list of MLA architectures; "" when the model is not read."""
    mla = (facts or {}).get("mla_archs")
    if not dep.model_arch:
        return ""
    if mla is None:
        notes.append(f"{dep.model_arch}'s attention (MLA or MHA) not read: {unread_reason(facts, 'mla_archs')}")
        return ""
    return "MLA" if dep.model_arch in mla["archs"] else "MHA"


def resolve(dep, facts: Optional[dict], gpu: Optional[str]):
    """``dep`` as the release resolves it (see the module docstring); ``BadInput`` where SGLang refuses it."""
    notes: List[str] = []
    gpu_name = gpu or DEFAULT_GPU
    sm = GPUS[gpu_name][1] if gpu else None
    kind = _model_kind(dep, facts, notes)
    dep = dataclasses.replace(dep, model_kind=kind)
    steps, topk, tokens = dep.num_steps, dep.topk, dep.draft_tokens
    kept = [a for a in dep.assumed if not a.startswith("--cuda-graph-max-bs")]
    eagle = (facts or {}).get("eagle")
    if dep.algorithm not in DFLASH_FAMILY and eagle:
        kept = [a for a in kept if a.startswith("--context-length")]
        steps, topk, tokens = resolve_eagle(dep, eagle, sm, notes)
        if steps >= dep.ctx:
            raise BadInput(f"--context-length {dep.ctx}: must exceed the steps ({steps}, SGLang's choice)")
    elif dep.algorithm not in DFLASH_FAMILY:
        notes.append(f"the speculative flags as kvfence resolves them: the release's handler is not read "
                     f"({unread_reason(facts, 'eagle')})")
    cap = _graph_cap(dep, facts, gpu_name if gpu else "", notes)
    running = _running(dep, facts, notes)
    max_bs = min(cap, running) if cap is not None and running is not None else (cap or running or dep.max_bs)
    eager_note = _eager_note(facts, cap, running) if dep.graphs else ""
    page = _fa4_page(dep, facts, sm, topk, notes)
    return dataclasses.replace(dep, num_steps=steps, topk=topk, draft_tokens=tokens, max_bs=max_bs, graph_cap=cap,
                               max_running=running, eager_note=eager_note, page_size=page, gpu=gpu or "",
                               graph_flag=((facts or {}).get("graph") or {}).get("flag", dep.graph_flag),
                               assumed=tuple(kept + notes))
