"""The package tree is grouped by feature, and imports point one way between the features.

    base (errors, device, provenance, the contract interface)
      < engine (plan, loop, worker, jobs, campaign, journal, case files, the table check, summaries, repro)
      < reports (rendering) < release (SGLang's wheels, shipped sizing, matrices, affected)
      < each contract's folder (record, case model, oracle, strategies, any checker of its own)
      < strategies (the public façade of the draft kernel's)
    base < engine < reports < release < selftest, sanitizer, campaign < cli < entry
      (kvfence/__init__, __main__, the plugin)

``kernels/`` imports nothing of kvfence but itself. No feature imports a contract's folder but the contract's
own and the public strategies façade: the engine, the reports, the release tooling, the self-test, the
sanitizer and the CLI find contracts by name through the registry (``kvfence.engine.registry``), and no module
outside the contracts' folders, kernels and strategies names a contract. Every folder is covered, no two
folders import each other, no two modules reach each other through imports (counting every import: a function's
own, one under ``TYPE_CHECKING``, an ``importlib.import_module`` of a literal name), no module is over 600 lines
and no function over 100.
"""

import argparse
import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "harness"
#: The package's folders by feature, and which features each may import (besides itself).
ALLOWED = {
    "base": set(),
    "kernels": set(),
    "engine": {"base"},
    "reports": {"base", "engine"},
    "release": {"base", "engine", "reports"},
    "contracts": {"base", "engine", "reports", "release", "kernels"},
    "strategies": {"base", "contracts"},
    "selftest": {"base", "engine", "reports"},
    "sanitizer": {"base", "engine", "reports", "release"},
    "campaign": {"base", "engine", "reports"},
    "cli": {"base", "engine", "reports", "release", "selftest", "sanitizer", "campaign"},
    "entry": {"base", "engine", "reports", "release", "selftest", "sanitizer", "campaign", "cli"},
}
BASE = ("errors", "device", "provenance", "contract", "draws")
#: Modules that start kvfence (the sanitizer's child runs a command of the CLI under compute-sanitizer).
ENTRY = ("__init__", "__main__", "pytest_plugin", "sanitizer_child")
#: Contract folders that build on another's (the FA3 metadata builder reuses the page tables' slot layout).
CONTRACT_USES = {"fa3_metadata": {"page_table"}}
MAX_LINES = 600
#: Lines of a function or method at most, from its ``def`` to the last line of its body.
MAX_FUNCTION_LINES = 100


def modules() -> dict:
    """``{dotted module name: path}`` of every module of the package (harness/ and its sibling folders)."""
    out = {}
    for prefix, folder in (("kvfence", HARNESS), ("kvfence.kernels", ROOT / "kernels"),
                           ("kvfence.strategies", ROOT / "strategies"), ("kvfence.reports", ROOT / "reports")):
        for path in folder.rglob("*.py"):
            if "out" in path.relative_to(folder).parts:
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            out[".".join((prefix,) + (parts[:-1] if parts[-1] == "__init__" else parts))] = path
    return out


def feature(module: str) -> str:
    """The feature folder a module belongs to (``contracts:NAME`` for one contract's folder)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ENTRY:
        return "entry"
    if parts[1] in BASE:
        return "base"
    if parts[1] == "contracts":
        return f"contracts:{parts[2]}" if len(parts) > 3 or (len(parts) == 3 and parts[2] != "tables") else "contracts"
    return parts[1]


def imports(path: Path, known: dict, top_level: bool = False) -> list:
    """``(module, line)`` of every kvfence module a file imports, at top level or (unless ``top_level``) anywhere:
    inside a function, under ``if TYPE_CHECKING:``, or as ``importlib.import_module("kvfence...")`` /
    ``__import__("kvfence...")`` of a literal name or a module-level constant holding one (a name in a string is an
    import all the same).
    ``from P import x`` is the submodule ``P.x`` where there is one, else ``P``; a relative import is resolved
    against the file's package."""
    out = []
    tree = ast.parse(path.read_text())
    package = _package_of(path, known)
    named = {node.targets[0].id: node.value.value for node in tree.body
             if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
             and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    for node in (tree.body if top_level else ast.walk(tree)):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.split(".")[0] != "kvfence":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.append((full if full in known else base, node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "kvfence"]
        elif isinstance(node, ast.Call) and (name := _imported_by_name(node, named)):
            if name.split(".")[0] == "kvfence":
                out.append((name, node.lineno))
    return [(m, line) for m, line in out if m in known]


def _imported_by_name(node: ast.Call, named: dict) -> str:
    """The module ``importlib.import_module(...)``, ``import_module(...)`` or ``__import__(...)`` imports when its
    argument is a literal name or a module-level constant holding one (``KERNEL_MODULE = "kvfence..."``); "" else."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if called not in ("import_module", "__import__") or not node.args:
        return ""
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return named.get(arg.id, "") if isinstance(arg, ast.Name) else ""


def _package_of(path: Path, known: dict) -> str:
    """The package a relative import in ``path`` starts from ("" for a file that is no module of the package)."""
    name = next((m for m, p in known.items() if p == path), "")
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def allowed(src: str, dst: str) -> bool:
    if src == dst:
        return True
    kind, _, name = src.partition(":")
    other_kind, _, other = dst.partition(":")
    if kind == "contracts" and other_kind == "contracts":
        return other in CONTRACT_USES.get(name, set()) or not other or not name
    return other_kind in ALLOWED.get(kind, set())


def test_every_module_belongs_to_a_feature_folder():
    top = sorted(p.stem for p in HARNESS.glob("*.py"))
    assert top == sorted(BASE + ENTRY), top
    # A folder holding no module (a checkout's leftover __pycache__ of a moved one) is no feature.
    folders = sorted(p.name for p in HARNESS.iterdir() if p.is_dir() and any(p.rglob("*.py")))
    assert folders == ["campaign", "cli", "contracts", "engine", "release", "sanitizer", "selftest"], folders
    assert {feature(m).split(":")[0] for m in modules()} <= set(ALLOWED) | {"contracts"}


def test_imports_point_between_features_the_allowed_way():
    known = modules()
    bad = []
    for name, path in known.items():
        src = feature(name)
        for target, line in imports(path, known):
            if not allowed(src, feature(target)):
                bad.append(f"{path.relative_to(ROOT)}:{line} ({src}) imports {target} ({feature(target)})")
    assert not bad, "\n".join(bad)


def test_no_module_outside_the_contracts_names_or_imports_a_contract():
    """The engine, the reports, the release tooling, the self-test, the sanitizer and the CLI know no contract:
    no string spelling a registered contract's name, no import of a contract's folder (its model, record or
    checker); they find a contract by name through the registry."""
    from kvfence.engine import registry

    names = set(registry.names())
    known = modules()
    found = []
    for name, path in known.items():
        kind = feature(name)
        if kind.startswith("contracts") or kind in ("kernels", "strategies"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} spells the contract {node.value!r}")
        for target, line in imports(path, known):
            if feature(target).startswith("contracts") or feature(target) == "strategies":
                found.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not found, "\n".join(found)


def import_graph(known: dict, top_level: bool = False) -> dict:
    """``{module: {module it imports: [lines]}}`` of the whole package (``imports``), a module's self-import left
    out."""
    graph = {}
    for name, path in known.items():
        edges = graph.setdefault(name, {})
        for target, line in imports(path, known, top_level):
            if target != name:
                edges.setdefault(target, []).append(line)
    return graph


def circle_text(members: list, graph: dict, known: dict) -> str:
    """One circle, each import inside it as ``file:line imports module``."""
    inside = set(members)
    lines = [f"{_shown(known[m])}:{','.join(map(str, sorted(set(graph[m][t]))))} imports {t}"
             for m in members for t in sorted(graph[m]) if t in inside]
    return f"{len(members)} modules ({', '.join(members)}):\n    " + "\n    ".join(lines)


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


@functools.lru_cache(maxsize=1)
def _package_graph() -> tuple:
    """``(modules(), import_graph of them)``, read once for the tests below."""
    known = modules()
    return known, import_graph(known)


def test_no_import_circle_between_modules_counting_every_import():
    """No two modules reach each other through imports, counting the imports a function makes when it runs (and
    ``TYPE_CHECKING`` ones, and ``import_module`` of a literal name): a lazy import hides a circle from a reading
    of the top of the files, it does not break it. A circle is named with each import inside it."""
    known, graph = _package_graph()
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(circle_text(c, graph, known) for c in found)


def test_no_import_circle_between_folders():
    """Two features that need each other are one feature: no circle between folders, counting every import."""
    folders = {}
    for name, targets in _package_graph()[1].items():
        folders.setdefault(feature(name), set()).update(feature(t) for t in targets if feature(t) != feature(name))
    found = circles(folders)
    assert not found, "folder circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_module_is_over_600_lines():
    long = [f"{path.relative_to(ROOT)}: {n}" for path in modules().values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES]
    assert not long, "\n".join(long)


def long_functions(source: str, max_lines: int = MAX_FUNCTION_LINES) -> list:
    """``(qualified name, lines)`` of every function or method of ``source`` (nested ones too) longer than
    ``max_lines``, counted from its ``def`` line to the last line of its body (decorators not counted)."""
    out = []

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                if (n := child.end_lineno - child.lineno + 1) > max_lines:
                    out.append((name, n))
                walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return out


def test_no_function_is_over_100_lines():
    long = [f"{path.relative_to(ROOT)}:{name}:{n} lines" for path in modules().values()
            for name, n in long_functions(path.read_text())]
    assert not long, "split these into named steps:\n" + "\n".join(long)


def circles(graph: dict) -> list:
    """The import circles of ``graph``: each strongly connected set of two or more nodes, sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                out.append(sorted(members))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_the_checks_see_what_they_forbid():
    """The rules are not vacuous: a backward import, a circle and a contract's name are each seen."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert not allowed("engine", "contracts:draft") and not allowed("engine", "cli")
    assert allowed("contracts:draft", "engine") and not allowed("contracts:page_table", "contracts:draft")
    assert allowed("contracts:fa3_metadata", "contracts:page_table")
    assert feature("kvfence.contracts.draft.case") == "contracts:draft" and feature("kvfence.engine.loop") == "engine"
    body = "    x = 1\n" * 99
    assert long_functions(f"def f():\n{body}    return x\n") == [("f", 101)]
    assert long_functions(f"@decorated\ndef f():\n{body}") == []  # 100 lines: the limit, not over it
    inner = "".join("        " + line for line in f"def g():\n{body}    return x\n".splitlines(keepends=True))
    assert long_functions(f"class C:\n    def m(self):\n{inner}        return g\n") == [("C.m", 103), ("C.m.g", 101)]
    known = modules()
    assert ("kvfence.contracts.draft.release_kernels", 0) in [
        (t, 0) for t, _ in imports(known["kvfence.contracts.draft.affected"], known)]  # lazy imports are seen


def test_the_import_reading_sees_every_kind_of_import(tmp_path):
    """``imports`` sees an import in a function, under ``TYPE_CHECKING``, a relative one, ``from P import module``
    as the submodule, and ``import_module`` / ``__import__`` of a literal name; a circle made only of such imports
    is found and named with its lines."""
    package = tmp_path / "engine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from kvfence.engine import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import c\n")
    (package / "c.py").write_text("import importlib\n\n\ndef g():\n    importlib.import_module('kvfence.engine.d')\n")
    (package / "d.py").write_text("A = 'kvfence.engine.a'\n\n\ndef h():\n    __import__(A)\n")
    (package / "e.py").write_text("from kvfence.engine.a import f\nimport kvfence.engine.d\n")
    known = {"kvfence.engine": package / "__init__.py",
             **{f"kvfence.engine.{m}": package / f"{m}.py" for m in "abcde"}}
    assert [t for t, _ in imports(package / "a.py", known)] == ["kvfence.engine.b"]
    assert [t for t, _ in imports(package / "a.py", known, top_level=True)] == []
    assert [t for t, _ in imports(package / "b.py", known)] == ["kvfence.engine.c"]
    assert [t for t, _ in imports(package / "c.py", known)] == ["kvfence.engine.d"]
    assert [t for t, _ in imports(package / "d.py", known)] == ["kvfence.engine.a"]
    assert [t for t, _ in imports(package / "e.py", known)] == ["kvfence.engine.a", "kvfence.engine.d"]
    graph = import_graph(known)
    found = circles(graph)
    assert found == [["kvfence.engine.a", "kvfence.engine.b", "kvfence.engine.c", "kvfence.engine.d"]]
    text = circle_text(found[0], graph, known)
    assert "engine/a.py:2 imports kvfence.engine.b" in text and "engine/d.py:5 imports kvfence.engine.a" in text


def test_every_command_has_its_own_module_and_the_cli_assembles_them():
    """One module per subcommand under cli/, each with ``add_parser``; cli/__init__ only assembles them, in the
    order --help lists the commands."""
    from kvfence import cli

    modules_ = sorted(p.stem for p in (HARNESS / "cli").glob("*.py") if p.stem not in ("__init__", "common"))
    assert sorted(m.__name__.rsplit(".", 1)[-1] for m in cli.COMMANDS) == modules_

    def handlers(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from handlers(child)
        if parser.get_default("func") is not None:
            yield parser.get_default("func")

    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert list(commands) == [m.__name__.rsplit(".", 1)[-1].replace("_", "-") for m in cli.COMMANDS]
    for module in cli.COMMANDS:
        found = list(handlers(commands[module.__name__.rsplit(".", 1)[-1].replace("_", "-")]))
        assert found and {f.__module__ for f in found} == {module.__name__}, (module.__name__, found)


def _packaging() -> tuple:
    import tomllib

    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return table["package-dir"], table["packages"]


def test_a_built_install_holds_every_package_of_the_tree():
    """A wheel (``pip install .``, not editable) installs only the packages pyproject.toml lists: a folder left
    out imports in a checkout and fails installed."""
    package_dir, packages = _packaging()
    found = set()
    for name, folder in package_dir.items():
        base = ROOT / folder
        for module in base.rglob("*.py"):
            found.add(".".join((name, *module.parent.relative_to(base).parts)))
    assert found == set(packages)
