"""Rates that count new coverage: ``structural_cases`` counts distinct structures (config and lengths:
what changes where the kernel writes), pool-row variants (``read_variant_cases``) and token-table
variants of a structure are counted apart, and a merge of several jobs counts structures, read
variants and configs distinct across all of them (``kvfence.engine.summary.merge``), not summed."""

import pytest

from kvfence.engine import launch as launches
from kvfence.engine import registry, summary
from kvfence.engine import run as runs
from kvfence.engine.loop import fuzz
from kvfence.engine.plan import RunPlan
from kvfence.engine.result import config_key, read_key, structure_key


class CleanStub:
    """A session whose every case is clean, without launching anything (counting is what is tested)."""

    def __init__(self):
        self.stats = {}
        self.checked = []

    def check(self, case):
        self.checked.append(case)
        return []


SMALL = dict(topk=2, num_steps=2, ctx=8, max_bs=2, page_size=1)


def run(seed, **pins):
    """30 examples of up to 8 batches of the draft kernel's launches under ``pins`` (the run's own draws; the
    §6 fields off, so the pins fix the config)."""
    session = CleanStub()
    strategy, _ = runs.draws(RunPlan(contract="draft", pins={"family": "off", **pins}, batches_per_example=8))
    result = fuzz(session, strategy, RunPlan(max_examples=30, seed=seed, shrink_seconds=0.0, targeting=False))
    return result, session.checked


def doc(result):
    return summary.build(result, run={}, case_path=None)


def test_structures_are_counted_once_and_pool_row_and_token_variants_apart():
    result, checked = run(0, **SMALL)
    record = registry.get("draft")
    assert {c.case.config for c in checked} and len({(c.case.config, c.width) for c in checked}) == 1
    # The structure is the lengths alone: two cases that differ only in the pool rows they read are one
    # structure (the kernel stores to the same addresses), counted as read variants.
    lengths = {c.case.batch.seq_lens for c in checked}
    with_rows = {(c.case.batch.seq_lens, c.case.batch.req_pool_indices) for c in checked}
    assert result.structural_cases == len(lengths) < len(with_rows) < result.verified_cases
    assert result.read_variant_cases == len(with_rows) - len(lengths) > 0
    assert result.token_variant_cases == result.verified_cases - len(with_rows)
    assert result.distinct_configs == 1
    # The keys behind the counts: the contract's structure (the lengths) and reads (the pool rows) under the
    # digest of its config, one per distinct structure / read variant.
    found = [launches.keys(record, c) for c in checked]
    assert {k.structure for k in found} == {(c.case.batch.seq_lens, c.width) for c in checked}
    assert result.structure_keys == {structure_key(config_key(k.config), k.structure) for k in found}
    assert result.read_keys == {read_key(record, config_key(k.config), c) for k, c in zip(found, checked)}
    assert len(result.structure_keys) == len(lengths) and len(result.read_keys) == len(with_rows)
    doc = summary.build(result, run={}, case_path=None)
    assert doc["read_variant_cases"] == result.read_variant_cases
    assert doc["examples_per_s"] == round(result.examples / result.elapsed_s, 3)
    assert doc["distinct_configs_per_s"] == round(1 / result.elapsed_s, 3)
    summary.validate(doc, "summary.json")  # the new fields pass the reader's validation


def test_a_merge_counts_what_is_distinct_across_jobs():
    """Two jobs of one pinned config with the same seed cover the same structures: merged, they count
    once (one config, not two); a job of another config adds its own."""
    a, _ = run(0, **SMALL)
    b, _ = run(0, **SMALL)
    c, _ = run(1, topk=1, num_steps=1, ctx=4, max_bs=1, page_size=1)
    same = summary.merge([doc(a), doc(b)], run={}, elapsed_s=1.0)
    assert same["distinct_configs"] == 1 and same["structural_cases"] == a.structural_cases
    assert same["read_variant_cases"] == a.read_variant_cases  # the same pool-row variants, counted once
    assert same["verified_cases"] == a.verified_cases + b.verified_cases  # work done still adds up
    assert same["structural_cases_per_s"] == a.structural_cases
    other = summary.merge([doc(a), doc(c)], run={}, elapsed_s=2.0)
    assert other["distinct_configs"] == 2
    assert (other["structural_cases"] == len(a.structure_keys | c.structure_keys)
            == a.structural_cases + c.structural_cases)
    # Merging merged summaries again (runs of several hosts) keeps counting distinct ones.
    assert summary.merge([same, other], run={}, elapsed_s=1.0)["structural_cases"] == other["structural_cases"]


@pytest.mark.parametrize("case", [
    "launch_of(Case(Config(topk=2, num_steps=2, ctx=8, max_bs=2), Batch((3, 1), (1, 0), 5)))",
    # a table contract's launch without kv_start: its structure must not hold None (hash(None) is the object's
    # address before Python 3.12, so it differs between processes)
    "launches.bind(registry.get('flashmla-page-table'), PageTableCase(16, 64, 2, (65, 3), (1, 0), 2), 'safe')",
])
def test_structure_keys_are_the_same_in_every_process(case):
    import subprocess
    import sys

    code = ("from kvfence.engine import launch as launches, registry; "
            "from kvfence.contracts.draft.case import Batch, Case, Config; "
            "from kvfence.contracts.draft.record import launch_of; "
            "from kvfence.contracts.page_table.record import PageTableCase; "
            "from kvfence.engine.result import config_key, read_key, structure_key; "
            f"x = {case}; r = registry.get(x.contract); k = launches.keys(r, x); "
            "print(structure_key(config_key(k.config), k.structure), read_key(r, config_key(k.config), x))")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": str(seed), "PATH": ""}).stdout for seed in (1, 2)}
    assert len(outs) == 1 and all(key.lstrip("-").isdigit() for key in outs.pop().split())
