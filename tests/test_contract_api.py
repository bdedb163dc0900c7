"""The contract author's reference (docs/contract-api.md) against the typed interface it documents, and every
record kvfence ships or tests against that interface."""

import inspect
import re
from pathlib import Path

import pytest

from kvfence.contract import MEMBERS, REQUIRED, Contract
from kvfence.engine import registry
from kvfence.engine.record_check import static_problems

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "contract-api.md").read_text()
FIXTURES = ROOT / "tests" / "fixtures"


def _rows(section: str) -> dict:
    """``{member: the row's text}`` of the table under a ``## section`` heading."""
    body = DOC.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): line for line in body.splitlines() if (m := re.match(r"\| `(\w+)[`(]", line))}


def test_the_page_documents_every_member_and_no_other():
    data, required, hooks = _rows("Data members"), _rows("Required methods"), _rows("Optional hooks")
    assert set(data) | set(required) | set(hooks) == set(MEMBERS)
    assert set(required) == set(REQUIRED) and len(data) + len(required) + len(hooks) == len(MEMBERS)  # disjoint
    assert f"{len(MEMBERS)} members, {len(REQUIRED)} of them\nrequired" in DOC or \
        f"{len(MEMBERS)} members, {len(REQUIRED)} of them required" in " ".join(DOC.split())
    assert len(MEMBERS) <= 21


@pytest.mark.parametrize("name", [m for m in MEMBERS if callable(getattr(Contract, m))])
def test_each_methods_signature_is_the_one_on_the_page(name):
    params = [p for p in inspect.signature(getattr(Contract, name)).parameters]
    row = {**_rows("Required methods"), **_rows("Optional hooks")}[name]
    shown = re.match(r"\| `\w+\(([^)]*)\)", row).group(1)
    assert [p.split(":")[0].strip() for p in shown.split(",")] == params, (shown, params)


def test_the_worked_example_is_the_fixture_verbatim():
    blocks = re.findall(r"```python\n(.*?)```", DOC, re.S)
    for path in (FIXTURES / "csr_contract" / "csr_kernel.py", FIXTURES / "csr_contract" / "csr_contract.py",
                 FIXTURES / "csr_contract" / "own_given_example.py"):
        assert path.read_text() in blocks, path


@pytest.mark.parametrize("name, spec, folder", [
    *[(n, registry.entry(n), None) for n in registry.names()],
    ("toy-copy", "toy_contract:TOY", "toy_contract"),
    ("csr-kv-indices", "csr_contract:CSR", "csr_contract"),
])
def test_every_record_implements_the_interface(monkeypatch, name, spec, folder):
    if folder:
        monkeypatch.syspath_prepend(str(FIXTURES / folder))
    with registry.registered(name, spec):
        record = registry.get(name)
        assert isinstance(record, Contract) and static_problems(name, spec, record) == []
        assert all(getattr(type(record), m) is not getattr(Contract, m) for m in REQUIRED)


@pytest.mark.interpreter
@pytest.mark.cpu_only
def test_the_worked_examples_buggy_sizing_is_found_in_its_first_examples(monkeypatch):
    from kvfence.engine import run as pipeline
    from kvfence.engine.loop import damage_kinds, fuzz
    from kvfence.engine.plan import RunPlan

    monkeypatch.syspath_prepend(str(FIXTURES / "csr_contract"))
    with registry.registered("csr-kv-indices", "csr_contract:CSR"):
        for sizing, found in (("short", True), ("safe", False)):
            plan = RunPlan(contract="csr-kv-indices", sizing=sizing, isolate=False, shrink_seconds=0.0)
            result = fuzz(pipeline.checker(plan), pipeline.draws(plan)[0],
                          plan.with_(max_examples=10, seed=0, targeting=False))
            assert bool(result.findings) is found, result.findings
            if found:
                assert "SIZING_VIOLATION" in damage_kinds(result.findings) and result.examples_to_failure <= 10


def _section(title: str) -> str:
    return DOC.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_kinds_table_lists_every_kind_with_whether_it_is_arithmetic():
    """A plug-in author picks ``Mutant.detects`` from this table: it holds every kind kvfence reports, each marked
    seen or arithmetic as ``kvfence.engine.findings`` decides."""
    from kvfence.engine.findings import ARITHMETIC_KINDS, Kind

    rows = {}
    for line in _section("Finding kinds a mutant may name").splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 3 and cells[0].startswith("`"):
            for name in re.findall(r"`(\w+)`", cells[0]):
                rows[name] = cells[1]
    assert set(rows) == set(Kind.__members__)
    assert {k for k, v in rows.items() if v == "arithmetic"} == set(ARITHMETIC_KINDS)


def test_the_entry_point_groups_table_is_every_group_kvfence_registers():
    import tomllib

    groups = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"])
    listed = set(re.findall(r"^\| `([\w.]+)` \|", _section("Entry-point groups"), re.M))
    assert listed == groups


def test_a_guessed_kind_name_gets_the_kind_it_means():
    """A newcomer guessed ``WRONG_VALUE`` for ``VALUE_MISMATCH``: the record check names the kind it means."""
    import sys

    from kvfence.contract import Mutant

    sys.path.insert(0, str(FIXTURES / "csr_contract"))
    try:
        from csr_contract import CSR, CsrKvIndices

        class Guessed(CsrKvIndices):
            mutants = (Mutant("one_more", "one token more", ("WRONG_VALUE",), CSR.mutants[0].patch),)

        problems = static_problems("csr-kv-indices", "csr_contract:Guessed", Guessed())
    finally:
        sys.path.remove(str(FIXTURES / "csr_contract"))
    assert problems == ["mutant one_more detects WRONG_VALUE, which no kind declares: did you mean VALUE_MISMATCH?"]


def test_every_interface_member_a_docstring_names_exists():
    """A docstring that names ``Contract.X``, ``Shipped.X``, ``ShippedSite.X``, ``ReleaseTool.X``, ``Launch.X`` or
    ``RunPlan.X`` names a member that exists (docstrings outlived members before)."""
    from kvfence.contract import Launch
    from kvfence.engine.plan import RunPlan
    from kvfence.release.knowledge import ReleaseTool, Shipped, ShippedSite

    classes = {"Contract": Contract, "Shipped": Shipped, "ShippedSite": ShippedSite, "ReleaseTool": ReleaseTool,
               "Launch": Launch, "RunPlan": RunPlan}
    missing = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        for name, member in re.findall(r"\b(Contract|Shipped|ShippedSite|ReleaseTool|Launch|RunPlan)\.(\w+)",
                                       path.read_text()):
            cls = classes[name]
            fields = getattr(cls, "__dataclass_fields__", {})
            if not (hasattr(cls, member) or member in fields):
                missing.append(f"{path.relative_to(ROOT)}: {name}.{member}")
    assert missing == []
