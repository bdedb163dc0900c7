"""docs/contract.md is the one statement of the contract: its finding-kind table equals
``kvfence.engine.findings.Kind``, and every ``docs/contract.md §N`` citation in the repository names a section
that exists (no citation points at the old out-of-repo spec file)."""

import os
import re
from pathlib import Path

from kvfence.engine.findings import Kind

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "docs" / "contract.md"
#: The old out-of-repo spec's name, spelled so that grepping the repository for it finds no citation here.
OLD = "SP" + "EC"
SKIP_DIRS = {"build", "dist", "__pycache__", "node_modules"}


def project_files() -> list:
    """Code, docstrings, tests and docs of the project (hidden folders such as .venv and .tox pruned)."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")]
        out += [Path(folder) / f for f in files if f.endswith((".py", ".md", ".ini", ".toml", ".sh"))]
    return out


CITING = project_files()


def sections(text: str) -> set:
    return set(re.findall(r"^## §(\d+) ", text, re.M))


def kinds_table(text: str) -> list:
    """Kinds in the first column of the table under ``## §7``."""
    section = text.split("\n## §7 ", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([A-Z_]+)` \|", section, re.M)


def bad_citations(text: str, known: set) -> list:
    """Citations of the old spec file, or of a contract section that does not exist."""
    bad = re.findall(rf"\b{OLD}(?:\.md| §\d)", text)
    for group in re.findall(r"docs/contract\.md §(\d+(?:/§\d+)*)", text):
        bad += [f"§{n}" for n in re.findall(r"\d+", group) if n not in known]
    return bad


def test_finding_kinds_table_is_the_kind_enum():
    listed = kinds_table(CONTRACT.read_text())
    assert len(listed) == len(set(listed))
    assert set(listed) == {k.value for k in Kind}


def test_citation_checker_catches_stale_references():
    known = {"1", "2"}
    assert bad_citations(f"see {OLD} §2 and {OLD}.md", known) == [f"{OLD} §2", f"{OLD}.md"]
    assert bad_citations("docs/contract.md §2, docs/contract.md §1/§9", known) == ["§9"]
    assert bad_citations(f"docs/contract.md §1/§2 ({OLD}IFIC words are fine)", known) == []


def test_every_contract_citation_names_an_existing_section():
    known = sections(CONTRACT.read_text())
    assert {"1", "2", "3", "4", "5", "6", "7"} <= known  # the stable numbering
    problems = {str(p.relative_to(ROOT)): bad for p in CITING if p.name != "test_docs.py"
                for bad in [bad_citations(p.read_text(errors="replace"), known)] if bad}
    assert problems == {}
    cited = sum("docs/contract.md §" in p.read_text(errors="replace") for p in CITING)
    assert cited >= 10  # code, kernels, mutants, tests and README cite it
