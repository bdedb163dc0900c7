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
    assert len(MEMBERS) <= 20


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
            result = fuzz(pipeline.checker(plan), pipeline.draws(plan)[0], max_examples=10, seed=0,
                          shrink_seconds=0, targeting=False)
            assert bool(result.findings) is found, result.findings
            if found:
                assert "SIZING_VIOLATION" in damage_kinds(result.findings) and result.examples_to_failure <= 10
