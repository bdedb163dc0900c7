"""Issue 63's smaller classes, one line each (exit 2) and never a traceback: a release in the cache with one
contract's record missing or damaged says which record, offline; an unwritable output folder or cache names
the path; ``--pin`` values that are not plain integers, a negative case seed, an unknown mutant name across
contracts, and ``affected`` for vLLM with a 400-digit ``--max-model-len`` or a deeply nested speculative config.
Each is paired with the good input beside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]


def _kvfence(*argv, cwd: Path, env: dict = None, timeout: int = 600):
    full = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), KVFENCE_OFFLINE="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=timeout)


def _one_line(proc, *needles) -> str:
    errors = [x for x in proc.stderr.strip().splitlines() if x.startswith("kvfence: error: ")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and all(n in errors[0] for n in needles), errors[0]
    return errors[0]


# -- a release in the cache, one contract's record missing or damaged ---------------------------------------------
@pytest.mark.interpreter
def test_a_missing_or_damaged_contract_record_is_named_offline(tmp_path):
    from test_affected_sites import MHA, release

    wheels, cache = tmp_path / "wheels", tmp_path / "cache"
    release(wheels, "9.8.1")
    argv = ("affected", "--device", "cpu", "--out", str(tmp_path / "out"), "9.8.1", *MHA, "--disable-cuda-graph")
    first = _kvfence(*argv, cwd=tmp_path, env={"KVFENCE_CACHE": str(cache), "KVFENCE_WHEEL_DIR": str(wheels)})
    assert first.returncode in (0, 1), first.stdout + first.stderr  # the cache now holds 9.8.1's records
    offline = {"KVFENCE_CACHE": str(cache), "KVFENCE_WHEEL_DIR": ""}
    again = _kvfence(*argv, cwd=tmp_path, env=offline)
    assert again.returncode == first.returncode and again.stdout == first.stdout, again.stdout + again.stderr
    shipped = cache / "contracts" / "sglang-9.8.1" / "trtllm-mha-page-table.shipped.json"
    shipped.write_text("{")
    line = _one_line(_kvfence(*argv, cwd=tmp_path, env=offline), f"{shipped} is damaged in the cache",
                     "the network is off")
    assert "is not in the cache" not in line
    shipped.unlink()
    _one_line(_kvfence(*argv, cwd=tmp_path, env=offline), f"{shipped} is missing from the cache")
    # A contract's kernel entry, beside a release's others: fetched, then removed.
    fuzz = ("fuzz", "--contract", "trtllm-mha-page-table", "--kernel", "sglang==9.8.1", "--device", "cpu",
            "--max-examples", "2", "--seed", "0", "--out", str(tmp_path / "f"))
    assert _kvfence(*fuzz, cwd=tmp_path, env={"KVFENCE_CACHE": str(cache), "KVFENCE_WHEEL_DIR": str(wheels)}
                    ).returncode in (0, 1)
    kernel = cache / "contracts" / "sglang-9.8.1" / "trtllm-mha-page-table.py"
    kernel.unlink()
    kernel.with_suffix(".json").unlink()
    _one_line(_kvfence(*fuzz, cwd=tmp_path, env=offline), f"{kernel} is missing from the cache")


# -- full or read-only caches and output folders: one line naming the path --------------------------------------
def _cache_under_a_file(tmp_path: Path) -> Path:
    """A cache path no one can create (its parent is a file): what a read-only or full disk gives, even to root."""
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "cache"


def test_a_cache_that_cannot_be_written_is_one_line_naming_it(tmp_path):
    from test_upstream import VERSION, make_wheel

    wheel = make_wheel(tmp_path / "wheels")
    bad = _kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), cwd=tmp_path,
                   env={"KVFENCE_CACHE": str(_cache_under_a_file(tmp_path))})
    _one_line(bad, "cannot write the cache: ", str(tmp_path / "a-file"), "(ENOTDIR)", "KVFENCE_CACHE")
    good = _kvfence("upstream", "fetch", VERSION, "--wheel", str(wheel), cwd=tmp_path,
                    env={"KVFENCE_CACHE": str(tmp_path / "cache")})
    assert good.returncode == 0, good.stderr


@pytest.mark.interpreter
def test_a_contract_kernel_entry_that_cannot_be_written_is_one_line_naming_it(tmp_path):
    from test_affected_sites import release

    release(tmp_path / "wheels", "9.8.1")
    fuzz = ("fuzz", "--contract", "trtllm-mha-page-table", "--kernel", "sglang==9.8.1", "--device", "cpu",
            "--max-examples", "2", "--seed", "0", "--out", str(tmp_path / "out"))
    bad = _kvfence(*fuzz, cwd=tmp_path, env={"KVFENCE_CACHE": str(_cache_under_a_file(tmp_path)),
                                             "KVFENCE_WHEEL_DIR": str(tmp_path / "wheels")})
    _one_line(bad, "cannot write the cache: ", "contracts/sglang-9.8.1", "(ENOTDIR)")


def test_an_os_error_no_command_caught_is_one_line_naming_the_path(monkeypatch, capsys):
    import errno

    from kvfence.cli import main
    from kvfence.contracts.draft import release_kernels

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", "/mnt/ro/kvfence-cache/sglang-0.0.1")

    monkeypatch.setattr(release_kernels, "fetch", read_only)
    assert main(["upstream", "fetch", "0.0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kvfence: error: /mnt/ro/kvfence-cache/sglang-0.0.1: Read-only file system (EROFS)"], err


# -- flags and case fields that are not what they look like -----------------------------------------------------
def test_a_pin_that_is_no_ascii_integer_is_one_line(tmp_path):
    for value, said in (("²", "expected a positive integer, got '²'"),
                        ("--5", "expected a positive integer, got '--5'"),
                        ("5", "must be a power of two, got 5"),  # an integer reaches the contract as one
                        ("9" * 30, "an integer of more than 20 digits")):
        _one_line(_kvfence("check-contract", "draft", "--pin", f"page_size={value}", "--examples", "1",
                           cwd=tmp_path), said)


def test_a_negative_case_seed_is_one_line():
    from kvfence.engine import registry

    case = json.loads((ROOT / "tests" / "fixtures" / "release_6ce69b5" / "flashmla" / "cases" / "b5f2cbb12b14.json")
                      .read_text())["case"]["case"]
    for name in ("flashmla-page-table", "trtllm-mha-page-table"):
        record = registry.get(name)
        assert record.from_json(dict(case, seed=0)) is not None
        with pytest.raises(BadInput, match=r"seed must be in \[0, 2\*\*32\)"):
            record.from_json(dict(case, seed=-1))
    from kvfence.contracts.slot_mapping.case import Group, SlotCase

    good = SlotCase(ctx=8, groups=(Group(4),), req_rows=(0,), starts=(0,), query_lens=(2,), table_rows=1)
    assert good.validate() is good
    with pytest.raises(BadInput, match=r"seed must be in \[0, 2\*\*32\)"):
        SlotCase(ctx=8, groups=(Group(4),), req_rows=(0,), starts=(0,), query_lens=(2,), table_rows=1,
                 seed=-1).validate()


@pytest.mark.interpreter
def test_a_negative_seed_in_a_case_file_is_one_line_on_repro(tmp_path):
    doc = json.loads((ROOT / "tests" / "fixtures" / "release_6ce69b5" / "flashmla" / "cases" / "b5f2cbb12b14.json")
                     .read_text())
    doc["case"]["case"]["seed"] = -1
    (tmp_path / "case.json").write_text(json.dumps(doc))
    _one_line(_kvfence("repro", str(tmp_path / "case.json"), "--device", "cpu", cwd=tmp_path),
              "seed must be in [0, 2**32)")


def test_vllm_flags_past_what_python_reads_are_one_line(tmp_path):
    from kvfence.release.affected_vllm import parse_vllm

    command = ["vllm", "serve", "M", "--block-size", "16"]
    assert parse_vllm("0.34.0", command + ["--max-model-len", "4096"]).max_model_len == 4096
    with pytest.raises(BadInput, match="a number of more than 20 digits"):
        parse_vllm("0.34.0", command + ["--max-model-len", "9" * 400])  # float() of it is inf: OverflowError
    deep = "[" * 100_000 + "]" * 100_000
    assert parse_vllm("0.34.0", command + ["--speculative-config", '{"method": "ngram"}']).spec_method == "ngram"
    for text in (deep, '{"method": "eagle", "x": ' + deep + "}"):
        with pytest.raises(BadInput, match="not JSON \\(or nested too deep\\)"):
            parse_vllm("0.34.0", command + ["--speculative-config", text])
    (tmp_path / "config.json").write_text('{"architectures": ' + deep + "}")
    with pytest.raises(BadInput, match="not a readable config.json \\(RecursionError\\)"):
        parse_vllm("0.34.0", ["vllm", "serve", str(tmp_path)])
    _one_line(_kvfence("affected", "--out", str(tmp_path / "o"), "0.34.0", *command, "--max-model-len", "9" * 400,
                       cwd=tmp_path), "--max-model-len", "more than 20 digits")
