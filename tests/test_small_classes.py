"""Issue 63's smaller classes, one line each (exit 2) and never a traceback: a release in the cache with one
contract's record missing or damaged says which record, offline; an unwritable output folder or cache names
the path; ``--pin`` values that are not plain integers, a negative case seed, an unknown mutant name across
contracts, and ``affected`` for vLLM with a 400-digit ``--max-model-len`` or a deeply nested speculative config.
Each is paired with the good input beside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
