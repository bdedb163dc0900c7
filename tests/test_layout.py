"""The package tree shows the data flow: ``harness/`` (the package ``kvfence``) is grouped by stage, and imports only point from a
later stage to an earlier one (or within a stage), so each stage can be read without the ones after it.

    base (errors, device, provenance) < cases < running < verifying < contracts < workflow < tools < entry (cli, __main__, commands/)

``commands/`` (one module per subcommand, its parser beside its handler) belongs to the entry stage: it may
import every earlier stage, and nothing before the entry stage imports it. ``contracts/`` holds kvfence's own
contract records (``kvfence.contract``): nothing imports them by name; the engine loads each by its
entry point, as it loads another package's.
"""

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "harness"
ORDER = ("base", "cases", "running", "verifying", "contracts", "workflow", "tools", "entry")
BASE = ("errors", "device", "provenance")
#: Folders of harness/ that belong to the entry stage (``kvfence.cli`` assembles them).
ENTRY_FOLDERS = ("commands",)


#: kvfence's other folders, mapped under kvfence by the packaging; not stages of harness/.
SIBLINGS = ("kernels", "strategies", "reports")


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ENTRY_FOLDERS:
        return "entry"
    if len(parts) >= 3 and parts[1] in ORDER:
        return parts[1]
    return "base" if parts[-1] in BASE else "entry"


def imported(tree: ast.AST):
    """Every module of harness/ (``kvfence...``, not its sibling folders) a file imports, at top level or
    inside a function, with its line."""
    def ours(name):
        parts = name.split(".")
        return parts[0] == "kvfence" and (len(parts) == 1 or parts[1] not in SIBLINGS)

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and ours(node.module):
            if node.module == "kvfence" or node.module in {f"kvfence.{s}" for s in ORDER + ENTRY_FOLDERS}:
                yield from ((f"{node.module}.{a.name}", node.lineno) for a in node.names if ours(f"kvfence.{a.name}"))
            else:
                yield node.module, node.lineno
        elif isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names if ours(a.name))


def test_every_module_lives_in_a_stage_folder_or_is_a_base_or_entry_module():
    top = sorted(p.stem for p in ROOT.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert top == ["cli", "device", "errors", "provenance", "sanitizer_child"], top
    folders = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(ORDER[1:7] + ENTRY_FOLDERS), folders


def test_every_command_has_its_own_module_and_the_cli_assembles_them():
    """One module per subcommand under commands/, each with ``add_parser``; cli.py only assembles them, in
    the order --help lists the commands."""
    from kvfence import cli

    modules = sorted(p.stem for p in (ROOT / "commands").glob("*.py") if p.stem not in ("__init__", "common"))
    assert sorted(m.__name__.rsplit(".", 1)[-1] for m in cli.COMMANDS) == modules
    assert all(callable(getattr(m, "add_parser", None)) for m in cli.COMMANDS)

    def handlers(parser):  # every func a parser or its nested subcommands (upstream fetch, ...) set
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    yield from handlers(child)
        if parser.get_default("func") is not None:
            yield parser.get_default("func")

    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert list(commands) == [m.__name__.rsplit(".", 1)[-1] for m in cli.COMMANDS]
    for module in cli.COMMANDS:  # each command's parser comes from its own module, and so do its handlers
        found = list(handlers(commands[module.__name__.rsplit(".", 1)[-1]]))
        assert found and {f.__module__ for f in found} == {module.__name__}, (module.__name__, found)
    top = {n.name for n in ast.parse((ROOT / "cli.py").read_text()).body if isinstance(n, ast.FunctionDef)}
    assert top == {"build_parser", "main", "_run"}, top


def test_imports_point_from_later_stages_to_earlier_ones():
    backward = []
    for path in ROOT.rglob("*.py"):
        module = ".".join(("kvfence",) + path.relative_to(ROOT).with_suffix("").parts)
        here = ORDER.index(stage_of(module))
        for target, line in imported(ast.parse(path.read_text())):
            if ORDER.index(stage_of(target)) > here:
                backward.append(f"{path.relative_to(ROOT.parent)}:{line} imports {target}")
    assert not backward, "\n".join(backward)


def test_no_module_imports_a_contract_record_the_registry_loads_them():
    """The engine (and everything else of kvfence) knows no contract by name: a record is loaded through the
    entry-point group ``kvfence.contracts`` (``kvfence.contract.get``), never imported, so adding a
    contract is its own files plus an entry point, and no other module changes."""
    records = ROOT / "contracts"
    found = []
    for path in list(ROOT.rglob("*.py")) + list((ROOT.parent / "reports").rglob("*.py")) \
            + list((ROOT.parent / "strategies").rglob("*.py")):
        if records in path.parents:
            continue
        for target, line in imported(ast.parse(path.read_text())):
            if target.startswith("kvfence.contracts"):
                found.append(f"{path.relative_to(ROOT.parent)}:{line} imports {target}")
    assert not found, "\n".join(found)


def test_the_checker_sees_a_backward_import():
    """The rule above is not vacuous: an import from a later stage is reported."""
    tree = ast.parse("def f():\n    from kvfence.engine.loop import fuzz\n")
    targets = [t for t, _ in imported(tree)]
    assert targets == ["kvfence.engine.loop"]
    assert ORDER.index(stage_of(targets[0])) > ORDER.index(stage_of("kvfence.engine.casefile"))
    # commands/ is the entry stage: a tool importing a command module is backward, a command importing a tool is not
    for text in ("from kvfence.cli.common import _stderr\n", "from kvfence.cli import fuzz\n"):
        (target,) = [t for t, _ in imported(ast.parse(text))]
        assert stage_of(target) == "entry" and ORDER.index(stage_of(target)) > ORDER.index(stage_of("kvfence.sanitizer.sweep"))
    assert ORDER.index(stage_of("kvfence.sanitizer.sweep")) < ORDER.index(stage_of("kvfence.cli.sweep"))


#: Every folder of the package kvfence, with the module prefix the packaging maps it to.
PACKAGE_DIRS = {"kvfence": ROOT, **{f"kvfence.{s}": ROOT.parent / s for s in SIBLINGS}}


def module_imports() -> dict:
    """``{module: {kvfence modules it imports}}`` over the whole package (harness/ and its sibling folders),
    imports inside functions included: a lazy import closes a circle as surely as a top-level one."""
    modules = {}
    for prefix, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            if "out" in path.relative_to(folder).parts:
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((prefix,) + (parts[:-1] if parts[-1] == "__init__" else parts))
            modules[name] = path
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvfence"):
                for alias in node.names:  # ``from kvfence.cases import upstream`` imports a module
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in modules)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict) -> list:
    """The import circles of ``graph``: each strongly connected set of two or more modules, sorted."""
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


def test_no_import_circles():
    found = circles(module_imports())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_circle_check_sees_a_circle_and_a_chain_is_none():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    graph = module_imports()
    assert "kvfence.release.upstream" in graph["kvfence.contracts.draft.targets"]  # the walk sees lazy imports


def _packaging() -> tuple:
    """``(package-dir, packages)`` of pyproject.toml's ``[tool.setuptools]``."""
    import tomllib

    table = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    return table["package-dir"], table["packages"]


def _folder_packages(package_dir: dict) -> set:
    """Every dotted package the mapped folders hold (a folder with Python files: ``kernels/mutants`` has
    no ``__init__.py``, its files are data the mutation test builds from)."""
    found = set()
    for name, folder in package_dir.items():
        base = ROOT.parent / folder
        for module in base.rglob("*.py"):
            found.add(".".join((name, *module.parent.relative_to(base).parts)))
    return found


def test_a_built_install_holds_every_package_of_the_tree():
    """A wheel (``pip install .``, not editable) installs only the packages pyproject.toml lists: a folder
    left out imports in a checkout and fails installed (``kvfence.cli`` once did)."""
    package_dir, packages = _packaging()
    assert _folder_packages(package_dir) == set(packages)
    assert "kvfence.cli" in _folder_packages(package_dir)
