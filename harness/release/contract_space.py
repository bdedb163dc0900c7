"""A shipped site's classes over the whole space of (context length, page size, draft tokens), from the width
formula the wheel spells and the kernel's block arithmetic. It knows no contract by name.

At every point of the space one request sits at the longest committed length the scheduler admits (``ctx - m``,
the admission bound ``kvfence.release.contract_shipped.admission`` reads; ``ctx`` where it is not read) and the
launch adds the site's delta. The point is in one class:

* ``fits``: the length needs at most the row's ``W`` pages;
* ``writes past its row``: it needs more, and the kernel's grid reaches past the row (``Shipped.block_pages``: a
  launch for ``W`` pages covers ``ceil(W / B) * B`` columns), so the pages up to there land past it: the next
  request's row in production's contiguous table;
* ``width formula short``: it needs more, and the launch ends at the row (``W`` a multiple of ``B``, or a kernel
  that clamps its rows): the kernel keeps to its row, and a consumer given the length reads past it.

Which pages past ``W`` the kernel stores is its reach, one of three models: ``blocks`` (the contract's declared
block arithmetic, ``Shipped.block_pages``), ``length`` (one program per request loops over every page the length
needs: every overflow writes past the row; the FlashMLA kernel up to 0.5.12.post1) and ``row`` (the kernel clamps
its rows to ``W``: no overflow writes past it). The declared model comes first; the matrix and ``affected`` keep
the first whose every class the release's kernel confirms.

Each class's condition is derived as text and checked against every point of the space (a condition kvfence
cannot state in closed form says so and gives its count); ``kvfence.release.contract_shipped_matrix`` confirms
each class with a witness launched on the release's kernel, and ``kvfence.release.affected`` evaluates one
deployment's point. Arrays, not loops: the space is 261,121 contexts x 16 draft tokens per page size.
"""

from __future__ import annotations

import json
from typing import Callable, Dict, List, Optional, Tuple

from kvfence.errors import BadInput, require
from kvfence.release import wheel_ast

#: The space the labels are derived over: every context length from 1024 to 256k, draft tokens 1 to 16.
CTX_RANGE = (1024, 262144)
D_RANGE = (1, 16)
FITS, SHORT, PAST = "fits", "width formula short", "writes past its row"
#: The classes, the worst first.
CLASSES = (PAST, SHORT, FITS)
_CODES = {FITS: 0, SHORT: 1, PAST: 2}
#: The kernel's reach past the row, by model (see the module docstring), in words.
REACH = {"blocks": "the launch covers ceil(W / B) blocks of B pages",
         "length": "the kernel writes every page the length needs (one program per request loops over them)",
         "row": "the kernel clamps its rows to W"}


def models(block_pages) -> List[Tuple[str, Optional[Callable[[int], int]]]]:
    """The reach models to try, the declared one first."""
    first: List[Tuple[str, Optional[Callable[[int], int]]]] = (
        [("blocks", block_pages)] if block_pages is not None else [("row", None)])
    return first + [(m, None) for m in ("length", "row") if m != first[0][0]]


def grid(tree, values: dict):
    """``wheel_ast.evaluate`` over numpy arrays (broadcast), the same operations and the same floor semantics."""
    import numpy as np

    head = tree[0]
    if head == "int":
        return np.int64(tree[1])
    if head == "sym":
        require(tree[1] in values, f"shipped formula needs {tree[1]!r}, which this site does not bind")
        return values[tree[1]]
    if head == "if":
        return np.where(grid(tree[1], values) != 0, grid(tree[2], values), grid(tree[3], values))
    args = [grid(a, values) for a in tree[1:]]
    if head in ("min", "max", "lcm"):
        op = {"min": np.minimum, "max": np.maximum, "lcm": np.lcm}[head]
        out = args[0]
        for a in args[1:]:
            out = op(out, a)
        return out
    a, b = args
    if head in ("==", "!=", "<", "<=", ">", ">="):
        op = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
              ">=": np.greater_equal}[head]
        return op(a, b).astype(np.int64)
    if head in ("//", "%"):
        if np.any(np.asarray(b) == 0):
            raise BadInput("shipped formula divides by zero")
        return np.floor_divide(a, b) if head == "//" else np.mod(a, b)
    return {"+": np.add, "-": np.subtract, "*": np.multiply}[head](a, b)


def classify(site_record: dict, adm: dict, model, page: int, ctx, d, length=None) -> dict:
    """Arrays over ``ctx`` x ``d`` (broadcast) at page size ``page``: the committed ``length`` (default the
    longest admitted), the delta, the width, the need, the pages past the row and the class code."""
    import numpy as np

    minus = adm.get("minus")
    committed = length if length is not None else (ctx - minus if minus is not None else ctx)
    values = {"ctx": ctx, "page": np.int64(page), "d": d, "requests": np.int64(1), "max_len": committed}
    delta = grid(site_record["delta"]["tree"], values)
    width = grid(site_record["width"]["tree"], values)
    need = -(-(committed + delta) // page)
    shape = np.broadcast(ctx, d, committed, delta, width).shape
    need, width, delta = (np.broadcast_to(x, shape) for x in (need, width, delta))
    over = need > width
    name, block_pages = _model(model)
    if name == "row":
        past = np.zeros(shape, dtype=np.int64)
    elif name == "length":
        past = np.where(over, need - width, 0)
    else:
        assert block_pages is not None  # the blocks model carries its block size
        b = block_pages(page)
        reach = -(-width // b) * b
        past = np.where(over, np.maximum(np.minimum(need, reach) - width, 0), 0)
    code = np.where(~over, _CODES[FITS], np.where(past > 0, _CODES[PAST], _CODES[SHORT]))
    return {"length": np.broadcast_to(committed, shape), "delta": delta, "width": width, "need": need,
            "past": past, "code": code}


def _model(model) -> Tuple[str, Optional[Callable[[int], int]]]:
    """``(name, block_pages)`` of a model given as a pair, or as ``block_pages`` alone (None: ``row``)."""
    if isinstance(model, tuple):
        return model
    return ("blocks", model) if model is not None else ("row", None)


def _residues(ctx, moduli) -> List[Tuple[str, object, int]]:
    """Candidate residue forms of ``ctx``: ``(text, values, modulus)``."""
    out = []
    for t in sorted(set(moduli)):
        out.append((f"ctx mod {t}", ctx % t, t))
        out.append((f"(ctx - 1) mod {t} + 1", (ctx - 1) % t + 1, t))
    return out


def threshold_condition(mask, ctx, d, moduli) -> str:
    """A closed form of the boolean ``mask`` over ``ctx`` (column) x ``d`` (row), checked at every point:
    ``never``, ``always``, ``d >= c``, or ``R + d >= c`` for a residue ``R`` of the context; else its count."""
    import numpy as np

    if not mask.any():
        return "never"
    if mask.all():
        return "always"
    dd = np.broadcast_to(d, mask.shape)
    c = int(dd[mask].min())
    if np.array_equal(mask, dd >= c):
        return f"d >= {c}"
    for text, r, _ in _residues(ctx, moduli):
        s = np.asarray(r)[:, None] + dd
        c = int(s[mask].min())
        if np.array_equal(mask, s >= c):
            return f"{text} + d >= {c}"
    return f"no closed form kvfence derives ({int(mask.sum())} of {mask.size} points)"


def _intervals(values: List[int]) -> List[Tuple[int, int]]:
    runs: List[Tuple[int, int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], v)
        else:
            runs.append((v, v))
    return runs


def residue_set(column, ctx, moduli) -> Optional[str]:
    """``column`` (a boolean per context) as a set of residues of the context, when it is periodic in one of
    ``moduli`` over the whole range: ``ctx mod 4096 >= 4032``, ``(ctx - 1) mod 4096 + 1 in [4081, 4096]``."""
    import numpy as np

    if column.all() or not column.any():
        return "always" if column.all() else "never"
    best = None
    for text, r, t in _residues(ctx, moduli):
        if len(column) <= t or not np.array_equal(column[t:], column[:-t]):
            continue
        residues = sorted({int(x) for x in np.asarray(r)[column]})
        runs = _intervals(residues)
        top = t - 1 if text.startswith("ctx mod") else t
        parts = [f"{text} >= {a}" if b == top and len(runs) == 1 else
                 f"{text} = {a}" if a == b else f"{text} in [{a}, {b}]" for a, b in runs]
        if best is None or len(runs) < best[0]:
            best = (len(runs), " or ".join(parts))
    return best[1] if best else None


def _witness(res: dict, mask, ctx, d, page: int, fits: bool = False) -> Optional[dict]:
    """The smallest point (by d, then ctx) of ``mask``; for ``fits`` the largest d, then the smallest ctx."""
    import numpy as np

    if not mask.any():
        return None
    cols = range(mask.shape[1] - 1, -1, -1) if fits else range(mask.shape[1])
    for j in cols:
        rows = np.flatnonzero(mask[:, j])
        if rows.size:
            i = int(rows[0])
            return {"ctx": int(ctx[i, 0]), "page_size": page, "d": int(d[0, j]), "length": int(res["length"][i, j]),
                    "delta": int(res["delta"][i, j]), "width": int(res["width"][i, j]),
                    "need": int(res["need"][i, j]), "past": int(res["past"][i, j])}
    return None


def page_space(site_record: dict, adm: dict, model, page: int, ctx_range=CTX_RANGE, d_range=D_RANGE) -> dict:
    """One page size's classes over the space under a reach ``model`` (``models``; or ``block_pages`` alone):
    each class's points, condition and smallest witness."""
    import numpy as np

    name, block_pages = _model(model)
    if name != "blocks":
        block_pages = None
    ctx = np.arange(ctx_range[0], ctx_range[1] + 1, dtype=np.int64)[:, None]
    d = np.arange(d_range[0], d_range[1] + 1, dtype=np.int64)[None, :]
    res = classify(site_record, adm, (name, block_pages), page, ctx, d)
    code = res["code"]
    over = code != _CODES[FITS]
    moduli = [page, 4096] + ([page * block_pages(page)] if block_pages else [])
    minus = adm.get("minus")
    exact = (f"ctx - {minus} + delta > {page} * W" if minus is not None else f"ctx + delta > {page} * W")
    overflow = threshold_condition(over, ctx[:, 0], d, moduli)
    out = {"page_size": page, "points": int(code.size), "overflow": overflow, "exact": exact, "reach": name,
           "width": wheel_ast.render(wheel_ast.substitute(site_record["width"]["tree"], {"page": ["int", page]})),
           "delta": site_record["delta"]["formula"], "classes": {}}
    if over.any():
        out["d_min"] = int(np.broadcast_to(d, code.shape)[over].min())
    ends = None
    if block_pages is not None and over.any():
        b = block_pages(page)
        at_end = (res["width"] % b) == 0
        same = at_end[:, :1]
        if np.array_equal(np.broadcast_to(same, at_end.shape), at_end):
            ends = residue_set(same[:, 0], ctx[:, 0], moduli)
        ends = ends or f"W mod {b} = 0"
        out["block_pages"] = b
    for cls in CLASSES:
        mask = code == _CODES[cls]
        if not mask.any():
            continue
        if cls == FITS:
            cond = "never overflows" if overflow == "never" else f"not ({overflow})"
        elif name == "row":
            cond = f"{overflow} (the kernel clamps its rows to W)"
        elif name == "length":
            cond = f"{overflow} ({REACH['length']})"
        else:
            b = out["block_pages"]
            if cls == PAST:
                cond = (f"{overflow}, and W is not a multiple of {b} (the launch's last block of {b} pages reaches "
                        f"past the row" + (f"; it ends at the row when {ends})" if ends != "never" else ")"))
            elif ends == "always":
                cond = f"{overflow}; W is always a multiple of {b}: the launch ends at the row"
            else:
                cond = f"{overflow}, and W is a multiple of {b} ({ends}): the launch ends at the row"
        out["classes"][cls] = {"points": int(mask.sum()), "condition": cond,
                               "witness": _witness(res, mask, ctx, d, page, fits=cls == FITS)}
    return out


_MEMO: Dict[str, dict] = {}


def space(site_record: dict, adm: dict, model, ctx_range=CTX_RANGE, d_range=D_RANGE) -> dict:
    """Every page size of the site under a reach ``model``: ``page_space`` each, memoized on the formulas
    (releases share them)."""
    name, block_pages = _model(model)
    key = json.dumps([site_record["width"].get("tree"), site_record["delta"].get("tree"), adm.get("minus"),
                      site_record["site"]["page_sizes"], ctx_range, d_range, name,
                      [block_pages(p) for p in site_record["site"]["page_sizes"]]
                      if name == "blocks" and block_pages is not None else None])
    if key not in _MEMO:
        pages = [page_space(site_record, adm, (name, block_pages), p, ctx_range, d_range)
                 for p in site_record["site"]["page_sizes"]]
        _MEMO[key] = {"ctx": list(ctx_range), "d": list(d_range), "pages": pages, "reach": name,
                      "classes": [c for c in CLASSES if any(c in p["classes"] for p in pages)]}
    return json.loads(json.dumps(_MEMO[key]))


def point(site_record: dict, adm: dict, model, page: int, ctx: int, d: int) -> dict:
    """One deployment's point: its worst class over every admitted committed length, the smallest length that
    overflows (``first_length``, None when none up to the admitted one does), and the numbers there and at the
    longest admitted length."""
    import numpy as np

    minus = adm.get("minus")
    top = ctx - minus if minus is not None else ctx
    require(top >= 1, f"--context-length {ctx}: no committed length fits the admission bound ctx - {minus}")
    lengths = np.arange(1, top + 1, dtype=np.int64)[:, None]
    res = classify(site_record, adm, model, page, np.int64(ctx), np.array([[d]], dtype=np.int64), lengths)
    over = np.flatnonzero(res["code"][:, 0] != _CODES[FITS])
    last = {k: int(v[-1, 0]) for k, v in res.items()}
    first = int(lengths[over[0], 0]) if over.size else None
    at_first = {k: int(v[over[0], 0]) for k, v in res.items()} if over.size else None
    worst = int(res["code"][:, 0].max())
    cls = next(n for n, c in _CODES.items() if c == worst)
    return {"class": cls, "ctx": ctx, "page_size": page, "d": d, "admitted": top, "first_length": first,
            "at_first": at_first, "at_admitted": last}
