"""The upstream release matrix (kvfence.release.release_matrix, ``upstream matrix``), over fake sglang wheels.

The wheels are tests/test_upstream.py's (a classic-ABI kernel written from docs/contract.md, no SGLang code):
a correct release, one with an inclusive prefix sum (a real bug: caught under every sizing), one without the
kernel and one whose kernel fits no ABI. Every subprocess runs with ``KVFENCE_OFFLINE=1`` (wheels come from
``KVFENCE_WHEEL_DIR``), each cell fuzzes a tiny budget.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvfence.contracts.draft import release_kernels
from kvfence.engine.progress import PLAIN_EVERY_S
from kvfence.errors import BadInput
from kvfence.release import release_matrix as rm
from tests.test_upstream import (
    EXTRA_REQUIRED,
    INCLUSIVE_PREFIX_SUM,
    MODULE,
    NUM_SEQS_TOPK,
    ROOT,
    edited,
    kvfence,
    make_wheel,
    one_line_exit_2,
)

CLEAN, BUGGY, NO_KERNEL, BAD_ABI = "0.0.1", "0.0.2", "0.0.3", "0.0.4"
BUDGET = ("--device", "cpu", "--max-examples", "8", "--shrink-seconds", "2")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    make_wheel(folder, CLEAN)
    make_wheel(folder, BUGGY, modules={MODULE: edited(INCLUSIVE_PREFIX_SUM)})
    make_wheel(folder, NO_KERNEL, modules={"sglang/srt/other.py": "x = 1\n"})
    make_wheel(folder, BAD_ABI, modules={MODULE: edited(EXTRA_REQUIRED)})
    return folder


def matrix(*args, cache: Path, wheel_dir=None):
    return kvfence("upstream", "matrix", *args, cache=cache, wheel_dir=wheel_dir)


def by_cell(doc: dict) -> dict:
    return {(c["version"], c["sizing"], c["contract"]): c for c in doc["cells"]}


# -- versions ------------------------------------------------------------------------------------------
KNOWN = ["0.4.10", "0.4.2", "0.4.10.post1", "0.5.1", "0.5.1.post1", "0.4.9.post6", "0.5.23", "0.5.3"]


def test_versions_sort_as_releases_not_as_text():
    assert sorted(["0.5.10", "0.5.9", "0.5.9.post1", "0.5.9rc1", "0.5.9.dev1", "0.5", "0.4.10"], key=rm.version_key) \
        == ["0.4.10", "0.5", "0.5.9.dev1", "0.5.9rc1", "0.5.9", "0.5.9.post1", "0.5.10"]
    assert rm.version_key("0.5") == rm.version_key("0.5.0")


@pytest.mark.parametrize("text,expected", [
    ("0.4.10..0.5.1", ["0.4.10", "0.4.10.post1", "0.5.1"]),  # inclusive, post releases inside the range
    ("0.5.23", ["0.5.23"]),
    ("0.5.3, 0.4.2 ,0.5.3", ["0.4.2", "0.5.3"]),  # sorted, repeats once
    ("0.4.2,0.5.1..0.5.3", ["0.4.2", "0.5.1", "0.5.1.post1", "0.5.3"]),
    ("0.5.3..0.5.3", ["0.5.3"]),
])
def test_version_ranges_and_lists_expand_against_the_known_releases(text, expected):
    assert rm.parse_versions(text, KNOWN) == expected


def test_a_range_leaves_pre_releases_out_and_says_which_a_list_names_them():
    """As pip's ranges: 0.4.10..0.5.1 passes over 0.5.0rc0-rc2 (AITER first appears in rc1) and says so in one
    line; named in the list (or as an endpoint), a pre-release is in."""
    known = KNOWN + ["0.5.0rc0", "0.5.0rc1", "0.5.0rc2", "0.5.2.dev1"]
    said = []
    assert rm.parse_versions("0.4.10..0.5.1", known, said.append) == ["0.4.10", "0.4.10.post1", "0.5.1"]
    assert said == ["kvfence: --versions leaves out the pre-release(s) 0.5.0rc0, 0.5.0rc1, 0.5.0rc2 inside its "
                    "range(s); name one in the list to include it"]
    said.clear()
    assert rm.parse_versions("0.4.10..0.5.1,0.5.0rc1", known, said.append) == [
        "0.4.10", "0.4.10.post1", "0.5.0rc1", "0.5.1"]
    assert "0.5.0rc0, 0.5.0rc2 inside" in said[0]
    said.clear()
    assert rm.parse_versions("0.5.0rc1..0.5.1.post1", known, said.append) == ["0.5.0rc1", "0.5.1", "0.5.1.post1"]
    assert "0.5.0rc2 inside" in said[0] and rm.is_prerelease("0.5.2.dev1") and not rm.is_prerelease("0.5.1.post1")
    said.clear()
    rm.parse_versions("0.5.3..0.5.23", known, said.append)
    assert said == []  # 0.5.2.dev1 lies before the range


@pytest.mark.parametrize("text,needle", [
    ("0.5.23..0.5.1", "range 0.5.23..0.5.1 is empty"),
    ("0.5.2", "sglang 0.5.2 is not a known release (known: 0.4.2 .. 0.5.23, 8 releases)"),
    ("0.4.0..0.5.23", "sglang 0.4.0 is not a known release"),
    ("0.5.1,,0.5.3", "empty item"),
    ("", "--versions is empty"),
    ("latest", "'latest' is not an sglang release version"),
    ("0.5.1...0.5.3", "is not an sglang release version"),
])
def test_bad_version_ranges_are_bad_input(text, needle):
    with pytest.raises(BadInput) as info:
        rm.parse_versions(text, KNOWN)
    assert needle in str(info.value)


# -- cells that need no fuzzing ------------------------------------------------------------------------
def test_cells_that_cannot_run_say_why():
    ok = rm.Release("1.0", abis={release_kernels.DRAFT_KERNEL: "classic"}, source_path="m.py")
    assert rm.settle(ok, "safe", "draft", ("draft",)).status == "pending"
    cell = rm.settle(ok, "safe", "window-rail", ("draft",))
    assert (cell.status, cell.message) == ("not-applicable", "this kvfence build does not check the window-rail "
                                                             "contract yet")
    cell = rm.settle(ok, "safe", "window-rail", ("draft", "window-rail"))
    assert cell.status == "not-applicable" and release_kernels.WINDOW_KERNEL in cell.message
    refused = rm.Release("0.4.2", "abi-unsupported", "no known ABI fits")
    assert (rm.settle(refused, "prefix", "draft", ("draft",)).status,
            rm.settle(refused, "prefix", "draft", ("draft",)).message) == ("abi-unsupported", "no known ABI fits")
    # A release whose ABI has no page_size is asked only for the flat layout it has.
    old = rm.Release("0.4.5", abis={release_kernels.DRAFT_KERNEL: "num-seqs-topk"}, source_path="m.py")
    assert rm.settle(old, "safe", "draft", ("draft",)).pins == ["--page-size", "1"]
    assert rm.settle(ok, "safe", "draft", ("draft",)).pins == []


@pytest.mark.parametrize("cells,code", [
    ([("prefix", "findings"), ("safe", "clean"), ("safe", "not-applicable")], 0),
    ([("prefix", "error"), ("fixed", "findings"), ("safe", "abi-unsupported"), ("safe", "not-cached")], 0),
    ([("prefix", "clean"), ("safe", "findings")], 1),
    ([("safe", "clean"), ("safe", "error")], 1),
])
def test_exit_code_is_about_the_safe_sizing(cells, code):
    assert rm.exit_code([rm.Cell("1.0", s, "draft", status=st) for s, st in cells]) == code


# -- the command ---------------------------------------------------------------------------------------
@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_matrix_over_fake_releases(tmp_path, wheels):
    """Clean, buggy, no kernel, unknown ABI: each gets its status; the buggy release fails under safe (exit 1)."""
    cache, out = tmp_path / "cache", tmp_path / "m"
    t0 = time.monotonic()
    proc = matrix("--versions", f"{CLEAN}..{BAD_ABI}", "--sizing", "prefix,safe", "--contracts", "draft,window-rail",
                  *BUDGET, "--out", str(out), "--json", str(tmp_path / "m.json"), cache=cache, wheel_dir=wheels)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc == json.loads((out / "matrix.json").read_text())
    cells = by_cell(doc)
    assert len(cells) == 4 * 2 * 2 and doc["versions"] == [CLEAN, BUGGY, NO_KERNEL, BAD_ABI]
    for cell in doc["cells"]:
        assert set(cell) >= {"version", "sizing", "contract", "status", "kinds", "cases", "seconds", "case_files"}
    assert cells[CLEAN, "safe", "draft"]["status"] == "clean" and cells[CLEAN, "safe", "draft"]["cases"] >= 8
    prefix = cells[CLEAN, "prefix", "draft"]  # the pre-fix sizing overflows in a correct kernel: expected
    assert prefix["status"] == "findings" and "SIZING_VIOLATION" in prefix["kinds"]
    buggy = cells[BUGGY, "safe", "draft"]
    assert buggy["status"] == "findings" and buggy["kinds"] and buggy["case_files"]
    for path in buggy["case_files"]:
        assert Path(path).parent == out / BUGGY / "safe-draft" / "cases" and Path(path).is_file()
    for sizing in ("prefix", "safe"):
        assert cells[NO_KERNEL, sizing, "draft"]["status"] == "not-applicable"
        assert "has no generate_draft_decode_kv_indices" in cells[NO_KERNEL, sizing, "draft"]["message"]
        assert cells[BAD_ABI, sizing, "draft"]["status"] == "abi-unsupported"
        assert "extra required parameter(s) scale" in cells[BAD_ABI, sizing, "draft"]["message"]
        for version in (CLEAN, BUGGY):  # the fake releases have no window-rail kernel (or the build no contract)
            assert cells[version, sizing, "window-rail"]["status"] == "not-applicable"
    # A bar, not a line per cell: in a log a line at most every PLAIN_EVERY_S, the last one at 16/16; the
    # cell that decides the exit code (the buggy release under safe) gets a line of its own.
    bars = [line for line in proc.stderr.splitlines() if line.startswith("kvfence [")]
    assert bars and "16/16 cells" in bars[-1], proc.stderr
    assert len(bars) <= 1 + elapsed / PLAIN_EVERY_S, bars
    assert f"kvfence: sglang=={BUGGY} safe draft: findings" in proc.stderr
    # The reports: a row per release (tables within 120 columns), the failing cell's case file listed.
    report = (out / "report.md").read_text()
    assert max(len(line) for line in report.splitlines() if line.startswith("|")) <= 120  # the tables
    for version in doc["versions"]:
        assert f"| {version} |" in report
    assert f": ./{BUGGY}/safe-draft/cases/{Path(buggy['case_files'][0]).name}" in report
    assert "ABI unsupported" in report and "## Legend" in report and "(exit 1)" in report
    page = (out / "report.html").read_text()
    assert f"href='./{BUGGY}/safe-draft/cases/" in page and "<td" in page
    # A case file replays the release's bug on its own.
    assert kvfence("repro", buggy["case_files"][0], "--device", "cpu", cache=cache).returncode == 1


@pytest.mark.interpreter  # runs --device cpu in a subprocess
@pytest.mark.long
def test_matrix_without_a_buggy_release_exits_0_and_offline_reads_the_cache(tmp_path, wheels):
    """The pair of the test above; then offline with no wheels: refusals come from the cache, a release only
    the index listed is 'not cached'."""
    cache, out = tmp_path / "cache", tmp_path / "m"
    proc = matrix("--versions", f"{CLEAN},{NO_KERNEL},{BAD_ABI}", "--sizing", "safe", *BUDGET, "--out", str(out),
                  cache=cache, wheel_dir=wheels)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "every applicable cell of a correct sizing (safe, window-fixed) is clean (exit 0)" in proc.stdout
    # An earlier index listing knew one more release, never fetched.
    (cache / rm.RELEASES_FILE).write_text(json.dumps({"versions": [CLEAN, NO_KERNEL, BAD_ABI, "0.0.5"]}))
    proc = matrix("--versions", f"{CLEAN}..0.0.5", "--sizing", "safe", "--offline", *BUDGET, "--out", str(out),
                  cache=cache)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cells = by_cell(json.loads((out / "matrix.json").read_text()))
    assert {v: cells[v, "safe", "draft"]["status"] for v in (CLEAN, NO_KERNEL, BAD_ABI, "0.0.5")} == {
        CLEAN: "clean", NO_KERNEL: "not-applicable", BAD_ABI: "abi-unsupported", "0.0.5": "not-cached"}
    assert "extra required parameter(s) scale" in cells[BAD_ABI, "safe", "draft"]["message"]


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_a_cell_that_hangs_is_that_cells_error_not_the_matrix_end(tmp_path, wheels):
    cache, out = tmp_path / "cache", tmp_path / "m"
    proc = matrix("--versions", f"{CLEAN},{NO_KERNEL}", "--sizing", "prefix,safe", *BUDGET, "--cell-timeout", "0.5",
                  "--out", str(out), cache=cache, wheel_dir=wheels)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cells = by_cell(json.loads((out / "matrix.json").read_text()))
    for sizing in ("prefix", "safe"):
        assert cells[CLEAN, sizing, "draft"]["status"] == "error"
        assert "ran past --cell-timeout 0.5 s; killed" in cells[CLEAN, sizing, "draft"]["message"]
        assert cells[NO_KERNEL, sizing, "draft"]["status"] == "not-applicable"


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_old_abi_without_page_size_is_fuzzed_flat(tmp_path):
    wheels = tmp_path / "wheels"
    make_wheel(wheels, CLEAN, modules={MODULE: edited(NUM_SEQS_TOPK)})
    proc = matrix("--versions", CLEAN, "--sizing", "safe", *BUDGET, "--out", str(tmp_path / "m"),
                  cache=tmp_path / "cache", wheel_dir=wheels)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cell = json.loads((tmp_path / "m" / "matrix.json").read_text())["cells"][0]
    assert cell["status"] == "clean" and cell["pins"] == ["--page-size", "1"]


@pytest.mark.parametrize("argv,needles", [
    (["--versions", "9.9.9"], ("sglang 9.9.9 is not a known release",)),
    (["--versions", f"{BAD_ABI}..{CLEAN}"], ("is empty",)),
    (["--versions", CLEAN, "--sizing", "safe,bogus"], ("'bogus' is not a named sizing of draft",)),
    (["--versions", CLEAN, "--sizing", "safe,"], ("no empty item",)),
    (["--versions", CLEAN, "--contracts", "draft,rail"], ("unknown contract 'rail'",)),
    (["--versions", CLEAN, "--max-examples", "0"], ("expected a positive integer",)),
    (["--versions", CLEAN, "--max-gpu-mem", "12Q"], ("--max-gpu-mem '12Q'",)),
    (["--sizing", "safe"], ("--versions",)),
])
def test_bad_matrix_input_is_one_line_exit_2(tmp_path, wheels, argv, needles):
    one_line_exit_2(matrix(*argv, "--device", "cpu", "--out", str(tmp_path / "m"), cache=tmp_path / "cache",
                           wheel_dir=wheels), *needles)
    assert not (tmp_path / "m" / "matrix.json").exists()


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_offline_with_nothing_cached_is_exit_2_not_a_silent_pass(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / rm.RELEASES_FILE).write_text(json.dumps({"versions": ["0.5.22", "0.5.23"]}))
    one_line_exit_2(matrix("--versions", "0.5.22..0.5.23", "--offline", "--device", "cpu", "--out",
                           str(tmp_path / "m"), cache=cache), "none of the 2 release(s)", "nothing to test")


# -- refusals remembered by fetch ----------------------------------------------------------------------
def test_fetch_remembers_a_refused_release_and_refresh_forgets_it(tmp_path):
    cache = tmp_path / "cache"
    bad = make_wheel(tmp_path / "bad", CLEAN, modules={MODULE: edited(EXTRA_REQUIRED)})
    one_line_exit_2(kvfence("upstream", "fetch", CLEAN, "--wheel", str(bad), cache=cache), "extra required")
    # Offline, no wheel: the remembered reason, not "not in the cache".
    one_line_exit_2(kvfence("upstream", "fetch", CLEAN, cache=cache), "extra required parameter(s) scale")
    good = make_wheel(tmp_path / "good", CLEAN)
    assert kvfence("upstream", "fetch", CLEAN, "--wheel", str(good), "--refresh", cache=cache).returncode == 0
    assert not upstream_refusal(cache).exists()
    assert kvfence("upstream", "fetch", CLEAN, cache=cache).returncode == 0


def test_corrupt_refusal_record_is_one_line_exit_2(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    # This kvfence's format (one of another format is fetched again), with a status no refusal has.
    upstream_refusal(cache).write_text(json.dumps({"format": release_kernels.CACHE_FORMAT, "version": "0.0.1",
                                                   "status": "exec", "reason": "x"}))
    one_line_exit_2(kvfence("upstream", "fetch", CLEAN, cache=cache), "is corrupt", "--refresh")


def upstream_refusal(cache: Path) -> Path:
    return cache / f"sglang-{CLEAN}.refused.json"


def test_fetch_only_fills_the_cache_for_an_offline_host(tmp_path, wheels):
    cache, out = tmp_path / "cache", tmp_path / "m"
    proc = matrix("--versions", f"{CLEAN}..{BAD_ABI}", "--fetch-only", "--out", str(out), cache=cache, wheel_dir=wheels)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert lines[CLEAN].startswith("testable: sglang/srt/speculative/spec_utils.py")
    assert lines[NO_KERNEL].startswith("not-applicable: ") and lines[BAD_ABI].startswith("abi-unsupported: ")
    assert sorted(p.name for p in cache.iterdir()) == [f"sglang-{CLEAN}", f"sglang-{BUGGY}",
                                                       f"sglang-{NO_KERNEL}.refused.json",
                                                       f"sglang-{BAD_ABI}.refused.json"]
    assert not out.exists()  # nothing fuzzed
    # Offline, no wheels: a release the cache lacks is refused in one line.
    one_line_exit_2(matrix("--versions", CLEAN, "--fetch-only", "--offline", cache=tmp_path / "empty",
                           wheel_dir=None), "not a known release")


# -- online: the package index through pip ---------------------------------------------------------------
def pip_env(**extra):
    # pip with its configuration ignored: the "index" is a local folder of fake wheels (no network).
    return dict(KVFENCE_OFFLINE="0", PIP_CONFIG_FILE=os.devnull, PIP_EXTRA_INDEX_URL="", PIP_CONSTRAINT="", **extra)


def test_online_the_index_lists_and_pip_downloads_the_releases(tmp_path, wheels):
    cache = tmp_path / "cache"
    proc = kvfence("upstream", "matrix", "--versions", f"{CLEAN}..{NO_KERNEL}", "--fetch-only", cache=cache,
                   **pip_env(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "downloading the sglang==0.0.2 wheel with pip" in proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.splitlines()] == [CLEAN, BUGGY, NO_KERNEL]
    # The listing is kept for offline runs: every fake release, also those not fetched.
    saved = json.loads((cache / rm.RELEASES_FILE).read_text())["versions"]
    assert saved == [CLEAN, BUGGY, NO_KERNEL, BAD_ABI]


def test_online_with_the_index_unreachable_is_one_line_exit_2(tmp_path):
    proc = kvfence("upstream", "matrix", "--versions", "0.5.23", "--fetch-only", cache=tmp_path / "cache",
                   **pip_env(PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_FIND_LINKS="", PIP_NO_INDEX="0"))
    one_line_exit_2(proc, "cannot list sglang releases", "--offline")


@pytest.mark.network
def test_real_releases_in_a_small_matrix(tmp_path):
    out = tmp_path / "m"
    proc = kvfence("upstream", "matrix", "--versions", "0.4.0,0.4.2,0.5.23", "--sizing", "prefix,safe", *BUDGET,
                   "--out", str(out), cache=tmp_path / "cache", KVFENCE_OFFLINE="0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cells = by_cell(json.loads((out / "matrix.json").read_text()))
    assert cells["0.4.0", "safe", "draft"]["status"] == "not-applicable"
    assert cells["0.4.2", "safe", "draft"]["status"] == "abi-unsupported"
    assert cells["0.5.23", "safe", "draft"]["status"] == "clean"
    assert cells["0.5.23", "prefix", "draft"]["status"] == "findings"


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_sigterm_stops_the_running_cells_and_writes_what_was_checked(tmp_path, wheels):
    cache, out = tmp_path / "cache", tmp_path / "m"
    env = dict(os.environ, PYTHONPATH=str(ROOT), KVFENCE_CACHE=str(cache), KVFENCE_OFFLINE="1",
               KVFENCE_WHEEL_DIR=str(wheels))
    proc = subprocess.Popen([sys.executable, "-m", "kvfence", "upstream", "matrix",
                             "--versions", f"{CLEAN},{NO_KERNEL}", "--sizing", "safe", "--device", "cpu",
                             "--max-examples", "100000", "--out", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / CLEAN / "safe-draft" / "fuzz.log"
    deadline = time.monotonic() + 120
    while not log.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert log.exists(), proc.communicate()
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stdout + stderr
    doc = json.loads((out / "matrix.json").read_text())
    assert (doc["interrupted"], doc["pending"]) == ("SIGTERM", 1)
    assert [(c["version"], c["status"]) for c in doc["cells"]] == [(NO_KERNEL, "not-applicable")]
    assert "interrupted by SIGTERM (1 cell(s) not run)" in (out / "report.md").read_text()
    # The cell's fuzz (and its worker) went with it.
    time.sleep(0.5)
    alive = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).count(str(out))]
    assert not alive, [_cmdline(p) for p in alive]


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_a_second_matrix_into_a_busy_folder_is_refused_and_the_first_keeps_its_cells(tmp_path, wheels):
    """Two matrices into one ``--out``: the second is refused in one line (exit 2) instead of moving the first's
    live cell folders to ``earlier/`` (the first then called those cells errors); the lock ends with the run."""
    cache, out = tmp_path / "cache", tmp_path / "m"
    env = dict(os.environ, PYTHONPATH=str(ROOT), KVFENCE_CACHE=str(cache), KVFENCE_OFFLINE="1",
               KVFENCE_WHEEL_DIR=str(wheels))
    first = subprocess.Popen([sys.executable, "-m", "kvfence", "upstream", "matrix", "--versions", CLEAN, "--sizing",
                              "safe", "--device", "cpu", "--max-examples", "100000", "--out", str(out)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cell = out / CLEAN / "safe-draft"
        deadline = time.monotonic() + 120
        while not (cell / "fuzz.log").exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.2)
        assert (cell / "fuzz.log").exists(), first.communicate()
        second = matrix("--versions", CLEAN, "--sizing", "prefix", *BUDGET, "--out", str(out), cache=cache,
                        wheel_dir=wheels)
        assert second.returncode == 2 and first.poll() is None, second.stdout + second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "in use by another kvfence run" in lines[0] and f"pid {first.pid}" in lines[0]
        assert cell.is_dir() and not (out / "earlier").exists()  # the first run's cell stayed where it runs
    finally:  # SIGTERM stops the matrix with its cells (a SIGKILL would leave the cells' fuzz running)
        first.send_signal(signal.SIGTERM)
        stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 143, stdout + stderr
    assert json.loads((out / "matrix.json").read_text())["interrupted"] == "SIGTERM"
    third = matrix("--versions", NO_KERNEL, "--sizing", "safe", *BUDGET, "--out", str(out), cache=cache,
                   wheel_dir=wheels)
    assert third.returncode == 0 and "in use" not in third.stderr, third.stdout + third.stderr


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_rail_cells_pin_a_window_and_take_only_window_sizings():
    """A window-rail cell runs fuzz with the rail's window pinned, and only the window-* policies size the
    rail (the draft kernel's policies size the draft kernel): the other pairs are not applicable."""
    from kvfence.contracts.draft.release import RAIL_WINDOW
    from kvfence.release import release_matrix as rm

    assert rm.contract_flags("window-rail") == ["--contract", "window-rail", "--window", str(RAIL_WINDOW)]
    assert rm.contract_flags("draft") == ["--contract", "draft"]
    assert rm.sizing_applies("window-fixed", "window-rail") and rm.sizing_applies("safe", "draft")
    assert not rm.sizing_applies("safe", "window-rail") and not rm.sizing_applies("window-no-topk", "draft")


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_a_table_contracts_cells_fuzz_the_releases_own_kernel_under_its_named_sizings(tmp_path):
    """``--contracts trtllm-mha-page-table --sizing safe,context``: a release with the kernel is clean under safe
    and caught under context (expected: context is a buggy sizing, exit 0); one whose kernel has another
    signature is abi-unsupported, one without it not applicable; a sizing the contract does not name is refused."""
    from tests.test_contracts import _fake_wheel

    ours = (ROOT / "kernels" / "page_table" / "trtllm_mha_page_table.py").read_text()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    path = "sglang/kernels/ops/attention/trtllm_mha_page_table.py"
    _fake_wheel(wheels, "0.0.5", path, ours)
    _fake_wheel(wheels, "0.0.6", path, ours.replace("    HAS_SWA: tl.constexpr,\n", ""))
    _fake_wheel(wheels, "0.0.7", "sglang/srt/other.py", "x = 1\n")
    cache, out = tmp_path / "cache", tmp_path / "m"
    proc = matrix("--versions", "0.0.5,0.0.6,0.0.7", "--sizing", "safe,context", "--contracts", "trtllm-mha-page-table",
                  *BUDGET, "--out", str(out), cache=cache, wheel_dir=wheels)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cells = by_cell(json.loads((out / "matrix.json").read_text()))
    assert cells["0.0.5", "safe", "trtllm-mha-page-table"]["status"] == "clean"
    caught = cells["0.0.5", "context", "trtllm-mha-page-table"]
    assert caught["status"] == "findings" and "TABLE_TRUNCATED" in caught["kinds"] and caught["case_files"]
    assert kvfence("repro", caught["case_files"][0], "--device", "cpu", cache=cache).returncode == 1
    assert cells["0.0.6", "safe", "trtllm-mha-page-table"]["status"] == "abi-unsupported"
    assert cells["0.0.7", "safe", "trtllm-mha-page-table"]["status"] == "not-applicable"
    refused = matrix("--versions", "0.0.5", "--sizing", "prefix", "--contracts", "trtllm-mha-page-table", *BUDGET,
                     "--out", str(tmp_path / "m2"), cache=cache, wheel_dir=wheels)
    assert refused.returncode == 2 and "'prefix' is not a named sizing of trtllm-mha-page-table" in refused.stderr
