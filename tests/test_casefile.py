"""Case files: round trip, content-hash names, atomic concurrent writes, validation, pytest integration."""

import json
import multiprocessing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvfence.contracts.draft.case import Batch, Case, Config
from kvfence.contracts.draft.record import DRAFT, launch_of
from kvfence.engine import casefile
from kvfence.engine.findings import Kind
from kvfence.errors import BadInput


def prefix_case(seq_lens=(3,), rows=(1,), token_seed=5, **kw):
    """A launch the pre-fix sizing overflows (topk 2, ctx 4, max_bs 1: width 4)."""
    cfg = dict(topk=2, num_steps=1, page_size=1, ctx=4, max_bs=1, sizing="prefix")
    cfg.update(kw)
    return launch_of(Case(Config(**cfg), Batch(seq_lens, rows, token_seed)))


def test_round_trip_reruns_to_the_same_findings(tmp_path, make_session):
    case = prefix_case()
    findings = make_session().check(case)
    assert {f.kind for f in findings} >= {Kind.SIZING_VIOLATION, Kind.GUARD_OVERWRITE}
    path = casefile.write_case(case, findings, out_dir=tmp_path, device="cpu", source="test",
                               extras={"hypothesis": {"unavailable": "test"}})
    assert path.parent == tmp_path / "cases" and path.name == f"{casefile.case_hash(case)}.json"
    loaded = casefile.load_case(path)
    assert loaded.case == case and loaded.case.case.batch.token_seed == 5
    assert [f.to_dict() for f in loaded.findings] == [f.to_dict() for f in findings]
    runtime = DRAFT.runtime(case).sizing_summary()  # the runner's own need vs width arithmetic
    assert loaded.sizing == {k: runtime[k] for k in ("need", "width", "num_seqs")}
    assert loaded.sizing["need"] > loaded.sizing["width"]
    assert set(loaded.versions) == {"python", "torch", "triton", "hypothesis", "kvfence"}
    # Re-running the loaded case (req_to_token regenerated from the seed) gives the same findings.
    assert [f.to_dict() for f in make_session().check(loaded.case)] == [f.to_dict() for f in findings]
    doc = json.loads(path.read_text())
    assert doc[casefile.MARKER] == casefile.SCHEMA_VERSION


def test_same_case_same_file_byte_identical_and_different_case_different_file(tmp_path):
    case = prefix_case()
    a = casefile.write_case(case, [], out_dir=tmp_path)
    first = a.read_bytes()
    b = casefile.write_case(prefix_case(), [], out_dir=tmp_path)
    assert a == b and b.read_bytes() == first
    c = casefile.write_case(prefix_case(token_seed=6), [], out_dir=tmp_path)
    assert c != a
    assert sorted(p.name for p in (tmp_path / "cases").iterdir()) == sorted([a.name, c.name])  # no temp files left


def _hammer(args):
    out_dir, worker = args
    for i in range(40):
        # Every worker writes the same 4 cases over and over, as xdist workers re-finding one bug would.
        casefile.write_case(prefix_case(token_seed=i % 4), [], out_dir=out_dir, source=f"worker{worker}")
    return worker


def test_concurrent_writers_never_leave_a_torn_or_temp_file(tmp_path):
    # spawn, not fork: a forked child inherits the xdist worker's threads' held locks and can deadlock.
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        assert sorted(pool.map(_hammer, [(str(tmp_path), w) for w in range(4)])) == [0, 1, 2, 3]
    files = sorted((tmp_path / "cases").iterdir())
    assert len(files) == 4 and all(f.suffix == ".json" for f in files)
    assert {casefile.load_case(f).case.case.batch.token_seed for f in files} == {0, 1, 2, 3}


def test_validation_names_the_problem(tmp_path):
    good = casefile.document(prefix_case(), [], device="cpu", source="test")
    casefile.from_document(good)

    def bad(mutate, needle):
        doc = json.loads(json.dumps(good))
        mutate(doc)
        with pytest.raises(BadInput, match=needle):
            casefile.from_document(doc)

    bad(lambda d: d.update({casefile.MARKER: 2}), "schema version 2 is not supported")
    # The file's "case" is the launch's record: the contract's case JSON under "case", the settings beside it.
    bad(lambda d: d["case"]["case"]["config"].update(topk="2"), "config.topk must be a positive integer")
    bad(lambda d: d["case"]["case"]["config"].update(ctx=0), "config.ctx must be a positive integer")
    bad(lambda d: d["case"].update(sizing="nope"), "unknown sizing 'nope'")
    bad(lambda d: d["case"].update(kernel="nope"), "unknown kernel 'nope'")
    bad(lambda d: d["case"]["case"]["config"].update(topk=64, ctx=2**25, max_bs=1, buckets=[1]), "overflows int32")
    bad(lambda d: d.update(findings=[{"kind": "WHAT", "buffer": "x", "region": "y"}]), "findings\\[0\\].kind")
    bad(lambda d: d.update(extra=1), "unknown fields \\['extra'\\]")
    bad(lambda d: d["case"]["case"]["batch"].update(seq_lens=[True]), "seq_lens must be positive integers")
    truncated = tmp_path / "t.json"
    truncated.write_text(json.dumps(good)[:60])
    with pytest.raises(BadInput, match="malformed JSON at line 1") as info:
        casefile.load_case(truncated)
    assert "\n" not in str(info.value)


def test_raise_on_findings_writes_the_case_and_ends_with_the_repro_command(tmp_path, make_session):
    case = prefix_case()
    casefile.raise_on_findings(case, [], out_dir=tmp_path)  # no findings: no file, no error
    assert not (tmp_path / "cases").exists()
    with pytest.raises(AssertionError) as info:
        casefile.raise_on_findings(case, make_session().check(case), out_dir=tmp_path)
    message = str(info.value)
    path = tmp_path / "cases" / f"{casefile.case_hash(case)}.json"
    assert message.endswith(f"python -m kvfence repro {path}")
    assert "SIZING_VIOLATION" in message and path.is_file()
    assert casefile.load_case(path).extras["hypothesis"]["unavailable"].startswith("not found by Hypothesis")


def test_inside_hypothesis_only_the_shrunk_case_is_written_with_its_blob(tmp_path, make_session):
    session = make_session()

    @settings(max_examples=30, database=None, derandomize=True, print_blob=False)
    @given(st.integers(1, 4), st.integers(0, 3))
    def prop(length, seed):
        case = prefix_case(seq_lens=(length,), token_seed=seed)
        casefile.raise_on_findings(case, session.check(case), out_dir=tmp_path)

    with pytest.raises(AssertionError) as info:
        prop()
    files = list((tmp_path / "cases").iterdir())
    assert len(files) == 1  # intermediate shrink steps were not written
    loaded = casefile.load_case(files[0])
    # topk*L + topk*1 > 4 first holds at L = 2; shrinking goes to the smallest such case, seed 0.
    assert loaded.case.case.batch.seq_lens == (2,) and loaded.case.case.batch.token_seed == 0
    assert loaded.extras["hypothesis"]["blob"].startswith("@reproduce_failure(")
    assert str(info.value).endswith(f"python -m kvfence repro {files[0]}")


def test_a_case_file_naming_the_retired_indptr_kind_loads_as_a_value_mismatch(tmp_path):
    """A draft case file written before the draft's verdict became the engine's names kv_indptr damage
    ``INDPTR_MISMATCH``, a kind kvfence no longer has: it loads (its recorded finding read as ``VALUE_MISMATCH``,
    ``casefile.RETIRED_KINDS``), while a kind that never existed is still one line naming it."""
    case = prefix_case()
    path = casefile.write_case(case, [], out_dir=tmp_path)
    doc = json.loads(path.read_text())
    doc["findings"] = [{"kind": "INDPTR_MISMATCH", "buffer": "kv_indptr", "region": "row 0", "start": 1, "stop": 2}]
    path.write_text(json.dumps(doc))
    (finding,) = casefile.load_case(path).findings
    assert (finding.kind, finding.buffer, finding.region) == (Kind.VALUE_MISMATCH, "kv_indptr", "row 0")
    doc["findings"][0]["kind"] = "INDPTR_WRONG"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadInput, match="findings\\[0\\].kind must be one of .*got 'INDPTR_WRONG'"):
        casefile.load_case(path)
