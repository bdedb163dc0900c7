"""The engine and the command line name none of the draft kernel's options: a contract declares its own
(``Contract.options``), and the pieces every contract shares take them from there (issue 67, item 3)."""

import ast
from pathlib import Path

from kvfence.engine import registry

ROOT = Path(__file__).resolve().parents[1]
#: The modules every contract shares that a user's flags pass through: the engine, the command line, campaigns and
#: the pytest plugin. The draft's own folder (harness/contracts/draft/) declares them.
SHARED = [*sorted((ROOT / "harness" / "engine").rglob("*.py")), *sorted((ROOT / "harness" / "cli").rglob("*.py")),
          *sorted((ROOT / "harness" / "campaign").rglob("*.py")), ROOT / "harness" / "pytest_plugin.py"]
#: summary.json's schema: the config fields a draft case's record holds (``Config.to_dict``), read from summaries
#: written before contracts described their own cases. A case's field shares the option's word but is not a flag.
SCHEMA = ROOT / "harness" / "engine" / "summary.py"


def _draft_words() -> set:
    options = registry.get("draft").options
    return {o.name for o in options} | {o.key for o in options} | {o.flag for o in options}


def _docstrings(tree: ast.AST) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def names_in(path: Path, words: set, root: Path = ROOT) -> list:
    """Where ``path`` names one of ``words``: as an attribute (``args.topk``), a keyword (``topk=``), a variable or
    parameter, or a string that is the word itself (``"topk"``, ``"--topk"``); prose (help text, docstrings) that
    mentions one is no naming."""
    tree = ast.parse(path.read_text())
    docs, found = _docstrings(tree), []
    for node in ast.walk(tree):
        word = None
        if isinstance(node, ast.Attribute):
            word = node.attr
        elif isinstance(node, ast.keyword):
            word = node.arg
        elif isinstance(node, ast.Name):
            word = node.id
        elif isinstance(node, ast.arg):
            word = node.arg
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            word = node.value if path != SCHEMA else node.value if node.value.startswith("--") else None
        if word in words:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {word}")
    return found


def test_the_engine_and_the_command_line_name_none_of_the_drafts_options():
    words = _draft_words()
    assert {"topk", "num_steps", "ctx", "max_bs", "--topk", "family"} <= words  # the draft still declares them
    assert [hit for path in SHARED for hit in names_in(path, words)] == []


def test_the_check_sees_a_module_that_names_one(tmp_path):
    """The check is not blind: today's fuzz module before this change named them (``PIN_FLAGS``, ``args.topk``)."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""Docs may say topk."""\nPIN_FLAGS = ("topk", "ctx")\n'
                      'def f(args):\n    return dict(num_steps=args.max_bs, help="pin topk")\n'
                      'FLAG = "--seq-len-limit"\n')
    hits = names_in(sample, _draft_words(), root=tmp_path)
    expected = ["topk", "ctx", "num_steps", "max_bs", "--seq-len-limit"]
    assert sorted(h.split(": ", 1)[1] for h in hits) == sorted(expected)
