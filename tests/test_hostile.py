"""Hostile data and odd faults (issue 24): each probe class stays fixed.

Every probe is bad input or a fault that must end as one line on stderr and exit 2 (never a traceback,
never a silent pass), or a wrong result that must now be right. Most run the CLI in this process
(``kvfence.cli.main``) for speed; process-level faults (signals, workers, plug-ins that kill their
process) run real processes.

The probe classes of issue 24 and their tests (HTML escaping of the reports is tests/test_report*.py's):

* secrets: ``test_url_credentials_are_redacted_*``, ``test_a_bad_redis_url_message_*``,
  ``test_a_password_with_a_slash_*``, ``test_the_password_can_come_from_the_environment``,
  ``test_the_lock_record_keeps_no_password``
* wrong-typed summary.json (``report DIR``, ``report --merge``): ``test_a_hostile_summary_*``, paired with
  ``test_the_real_summary_still_renders_and_merges``; merge ``--out`` not creatable: ``test_a_merge_out_*``
* merge takes the ``--out`` lock: ``test_merge_into_a_folder_a_run_holds_is_refused``
* corrupt journal slots: ``test_a_corrupt_journal_slot_*``, ``test_fuzz_into_a_folder_with_a_corrupt_slot_*``,
  ``test_a_file_where_the_run_needs_a_folder_*`` (``OUT/journal``, ``OUT/cases/earlier`` a file)
* lock records (bad ``started``, escape codes; full disk): ``test_a_dead_runs_lock_record_*``,
  ``test_a_full_disk_when_writing_the_lock_record_*``
* malformed Redis URLs, Redis that never answers: ``test_malformed_redis_urls_*``, ``test_a_redis_that_accepts_*``
* the upstream cache: ``test_a_cache_writable_by_others_is_refused``, ``test_a_manifest_abi_of_the_wrong_type_*``
* ``--jobs`` bound, orphans: ``test_more_jobs_than_the_machine_holds_*``, ``test_the_jobs_bound_*``,
  ``test_jobs_and_their_workers_die_with_a_killed_run``
* ``--out ''``, ``--json ''``, symlink loops: ``test_empty_output_paths_*``, ``test_a_symlink_loop_case_file_*``
* OOB_WRITE names its pointer: ``test_a_wild_store_is_named_after_its_pointer``
* plug-in import side effects: ``test_a_plugin_whose_import_ends_the_process_*``, ``test_plugins_that_import_*``,
  ``test_repro_probes_*``
* SIGINT: ``test_a_sigint_while_the_run_starts_*``, ``test_a_sigint_while_the_outputs_are_written_*``
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import hypothesis
import hypothesis.strategies
import pytest

from kvfence import cli
from kvfence.errors import BadInput, printable, redact, redact_word

ROOT = Path(__file__).resolve().parent.parent


def one_line_exit_2(capsys, argv, needle):
    """Run the CLI in this process: exit 2 and one ``kvfence: error:`` line naming ``needle``."""
    code = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("kvfence: error:") and needle in lines[0], lines[0]
    return lines[0]


# -- secrets ----------------------------------------------------------------------------------------------
PASSWORDS = ["hunter2", "pw/with/slashes", "p@ss#word", "a:b/c?d"]


@pytest.mark.parametrize("password", PASSWORDS)
def test_url_credentials_are_redacted_however_the_password_is_spelled(password):
    url = f"redis://:{password}@db.example:6399/3"
    assert password not in redact(f"see {url} now") and "db.example:6399/3" in redact(url)
    assert password not in redact_word(url) and redact_word(url).endswith("@db.example:6399/3")
    assert redact("no url here: a@b") == "no url here: a@b"


@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
@pytest.mark.parametrize("password", PASSWORDS)
def test_a_bad_redis_url_message_never_holds_the_password(capsys, tmp_path, password):
    line = one_line_exit_2(capsys, ["fuzz", "--device", "cpu", "--out", tmp_path / "o", "--database",
                                    f"redis://:{password}@host:63x9/0"], "port")
    assert password not in line and "***" in line


def test_a_password_with_a_slash_is_parsed_as_a_password():
    from kvfence.engine.campaign import parse_database

    spec = parse_database("redis://:pw/x@host:6399/2")
    assert (spec.host, spec.port, spec.db, spec.password) == ("host", 6399, 2, "pw/x")
    assert "pw" not in spec.display


def test_the_password_can_come_from_the_environment(monkeypatch):
    from kvfence.engine.campaign import REDIS_PASSWORD_ENV, parse_database

    monkeypatch.setenv(REDIS_PASSWORD_ENV, "from-env")
    assert parse_database("redis://host:6399/0").password == "from-env"
    assert parse_database("redis://:in-url@host:6399/0").password == "in-url"
    monkeypatch.delenv(REDIS_PASSWORD_ENV)
    assert parse_database("redis://host:6399/0").password is None


def test_the_lock_record_keeps_no_password(tmp_path, monkeypatch):
    from kvfence.engine import outlock

    monkeypatch.setattr(sys, "argv", ["kvfence", "fuzz", "--database", "redis://:se/cret@h:1/0", "--out", "x"])
    outlock.acquire(tmp_path, announce=lambda line: None)
    try:
        text = (tmp_path / outlock.LOCK_NAME).read_text()
        assert "se/cret" not in text and "redis://***@h:1/0" in text
        assert (tmp_path / outlock.LOCK_NAME).stat().st_mode & 0o077 == 0
    finally:
        outlock.release_all()


def test_bad_input_messages_carry_no_terminal_escapes():
    assert "\x1b" not in str(BadInput("host \x1b[2J\x1b]0;pwned\x07 here"))
    assert printable("a\x1bb\nc") == "a\\x1bb\\nc"


def test_a_redis_that_accepts_and_never_answers_times_out_on_time(monkeypatch):
    pytest.importorskip("redis", reason="needs the redis client (pip install redis; the test extra has it)")
    from kvfence.engine import campaign

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held = []
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    monkeypatch.setattr(campaign, "REDIS_TIMEOUT_S", 0.5)
    start = time.monotonic()
    with pytest.raises(BadInput, match="cannot reach Redis"):
        campaign.open_database(campaign.parse_database(f"redis://127.0.0.1:{server.getsockname()[1]}/0"))
    assert time.monotonic() - start < 3 * 0.5 + 1
    server.close()


# -- summary.json of the wrong type: report DIR and report --merge ---------------------------------------
FUZZ = ["fuzz", "--sizing", "prefix", "--device", "cpu", "--max-examples", "10", "--quiet", "--shrink-seconds", "5",
        "--database", "none", "--seed", "1"]


def kvfence(*args, timeout=240, **kw):
    import subprocess

    return subprocess.run([sys.executable, "-m", "kvfence", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """One real fuzz run with a finding (the buggy ``prefix`` sizing): its folder."""
    out = tmp_path_factory.mktemp("real") / "run"
    proc = kvfence(*FUZZ, "--out", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return out


_DELETE = object()
#: (id, path into summary.json ("*": the first case record), hostile value, what the error names)
HOSTILE_SUMMARIES = [
    ("topk-string-in-case", ("cases", "*", "config", "topk"), "2", "config.topk"),
    ("ctx-script-in-case", ("cases", "*", "config", "ctx"), "<script>alert(5)</script>", "config.ctx"),
    ("need-script-in-case", ("cases", "*", "need"), "<b>", "need"),
    ("missing-config", ("cases", "*", "config"), _DELETE, "config is missing"),
    ("case-record-string", ("cases", "*"), "a string", "must be an object"),
    ("coverage-row-string", ("coverage", "examples"), ["abc"], "coverage rows"),
    ("coverage-row-topk-string", ("coverage", "examples"), [["1", 1, 1, 1, 1, 1, 1, False]], "coverage rows"),
    ("coverage-width-zero", ("coverage", "examples"), [[1, 1, 1, 1, 1, 1, 0, False]], "coverage rows"),
    ("max-need-over-width-abc", ("max_need_over_width",), "abc", "max_need_over_width"),
    ("compile-s-x", ("compile_s",), "x", "compile_s"),
    ("largest-config-not-an-object", ("largest_config",), ["topk", 2], "largest_config"),
    ("largest-config-topk-script", ("largest_config", "topk"), "<script>", "largest_config"),
    ("boundaries-string-count", ("boundaries",), {"x": "1"}, "boundaries"),
    ("finding-start-string", ("findings", 0, "start"), "0", "findings[0]"),
    ("versions-list", ("versions",), [1], "versions"),
    ("nan-elapsed", ("elapsed_s",), float("nan"), ": NaN is not valid JSON"),
    ("interrupted-number", ("interrupted",), 3, "interrupted"),
    ("merged-runs-string", ("merged",), {"runs": "x"}, "merged"),
]


def _hostile_copy(real_run, tmp_path, path, value) -> Path:
    import shutil

    folder = tmp_path / "hostile"
    shutil.copytree(real_run, folder)
    doc = json.loads((folder / "summary.json").read_text())
    target = doc
    for key in path[:-1]:
        target = target[next(iter(target))] if key == "*" else target[key]
    last = next(iter(target)) if path[-1] == "*" else path[-1]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    (folder / "summary.json").write_text(json.dumps(doc))
    return folder


@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
@pytest.mark.parametrize("name, path, value, needle", HOSTILE_SUMMARIES, ids=[h[0] for h in HOSTILE_SUMMARIES])
def test_a_hostile_summary_is_one_line_for_report_and_merge(capsys, real_run, tmp_path, name, path, value, needle):
    folder = _hostile_copy(real_run, tmp_path, path, value)
    before = (folder / "report.html").read_bytes()
    one_line_exit_2(capsys, ["report", folder], needle)
    assert (folder / "report.html").read_bytes() == before  # nothing rendered from it
    one_line_exit_2(capsys, ["report", "--merge", real_run, folder, "--out", tmp_path / "merged"], needle)
    assert not (tmp_path / "merged").exists()


@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
def test_the_real_summary_still_renders_and_merges(capsys, real_run, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(real_run, folder)
    # Both exit 1: the run has findings (report DIR and report --merge share their exit codes).
    assert cli.main(["report", str(folder)]) == 1
    assert cli.main(["report", "--merge", str(folder), "--out", str(tmp_path / "merged")]) == 1
    assert cli.main(["report", str(tmp_path / "merged")]) == 1  # a merged summary validates too


@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
def test_a_merge_out_that_cannot_be_created_is_one_line(capsys, real_run):
    one_line_exit_2(capsys, ["report", "--merge", real_run, "--out", "/sys/kvfence-merged"], "/sys/kvfence-merged")


def _hold_lock(folder: Path):
    """A real process holding ``folder``'s run lock (as a running fuzz does) until it is killed."""
    import subprocess

    code = ("import sys, time; from pathlib import Path; from kvfence.engine import outlock; "
            "outlock.acquire(Path(sys.argv[1]), announce=print); print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
def test_merge_into_a_folder_a_run_holds_is_refused(capsys, real_run, tmp_path):
    out = tmp_path / "busy"
    holder = _hold_lock(out)
    try:
        one_line_exit_2(capsys, ["report", "--merge", real_run, "--out", out], "in use by another kvfence run")
        assert not (out / "summary.json").exists()
    finally:
        holder.kill()
        holder.wait()
    assert cli.main(["report", "--merge", str(real_run), "--out", str(out)]) == 1  # free now: merged
    assert (out / "summary.json").exists() and not (out / ".kvfence.lock").exists()


@pytest.mark.parametrize("argv, needle", [
    (["fuzz", "--device", "cpu", "--out", ""], "--out: empty path"),
    (["fuzz", "--device", "cpu", "--out", "{tmp}/o", "--json", ""], "--json: empty path"),
    (["report", "--merge", "{run}", "--out", ""], "--out: empty path"),
])
@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
def test_empty_output_paths_are_refused(capsys, real_run, tmp_path, argv, needle):
    one_line_exit_2(capsys, [a.format(tmp=tmp_path, run=real_run) for a in argv], needle)


# -- corrupt journal slots ---------------------------------------------------------------------------------
def _live_slot(out: Path, case) -> Path:
    """A slot exactly as a process that died mid-launch leaves it (written, not removed, lock gone)."""
    from kvfence.engine.journal import Journal

    j = Journal(out, device="cpu")
    j.begin(case)
    os.close(j.fd)
    j.fd = None
    return j.path


def _small_case():
    """A small draft launch (what the journal and case files take)."""
    from kvfence.contracts.draft.case import Batch, Case, Config
    from kvfence.contracts.draft.record import launch_of

    return launch_of(Case(Config(topk=2, num_steps=1, ctx=4, max_bs=2, sizing="prefix"), Batch((3,), (1,), 5)))


def _corrupt(record_text: str) -> bytes:
    return b"S" + record_text.encode() + b"\n"


@pytest.mark.parametrize("name", ["list", "run-int", "started-string", "started-1e300", "batch_of-int", "directory",
                                  "case-string"])
def test_a_corrupt_journal_slot_is_reported_and_set_aside(tmp_path, name):
    from kvfence.engine import journal

    good = json.loads(_live_slot(tmp_path, _small_case()).read_bytes()[1:])
    folder = tmp_path / journal.JOURNAL_DIR
    bad = folder / f"999-dead{journal.SUFFIX}"
    variants = {"list": "[1, 2]", "run-int": json.dumps(dict(good, run=1)),
                "started-string": json.dumps(dict(good, run=dict(good["run"], started="soon"))),
                "started-1e300": json.dumps(dict(good, run=dict(good["run"], started=1e300))),
                "batch_of-int": json.dumps(dict(good, batch_of=3)), "case-string": json.dumps(dict(good, case="x"))}
    if name == "directory":
        bad.mkdir()
    else:
        bad.write_bytes(_corrupt(variants[name]))
    lines = []
    crashes = journal.recover(tmp_path, report=lines.append)
    usable = name.startswith("started")  # a bad start time is shown as "?": the case is still recovered
    assert len(crashes) == (2 if usable else 1)  # the good slot is always recovered
    assert not list(folder.glob(f"*{journal.SUFFIX}"))  # nothing left in any later run's way
    if usable:
        assert lines == [] and all("started ?" in c.finding.detail or "started 2" in c.finding.detail for c in crashes)
    else:
        assert len(lines) == 1 and bad.name in lines[0] and "set aside" in lines[0]
        assert (folder / journal.UNUSABLE_DIR / bad.name).exists()
    assert journal.recover(tmp_path, report=lines.append) == []  # and a later run is not bothered again


@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
def test_fuzz_into_a_folder_with_a_corrupt_slot_runs_and_says_so(tmp_path):
    from kvfence.engine import journal

    folder = tmp_path / "out" / journal.JOURNAL_DIR
    folder.mkdir(parents=True)
    (folder / f"1-x{journal.SUFFIX}").write_bytes(_corrupt("[1]"))
    (folder / f"2-x{journal.SUFFIX}").write_bytes(_corrupt('{"run": 1}'))
    for _ in range(2):  # the first run sets them aside; the second never sees them
        proc = kvfence(*FUZZ, "--max-examples", "3", "--out", tmp_path / "out")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("set aside") == 0
    assert len(list((folder / journal.UNUSABLE_DIR).glob(f"*{journal.SUFFIX}"))) == 2


@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
@pytest.mark.parametrize("where", ["journal", "cases/earlier"])
def test_a_file_where_the_run_needs_a_folder_is_one_line(capsys, tmp_path, where):
    out = tmp_path / "out"
    (out / where).parent.mkdir(parents=True, exist_ok=True)
    (out / where).write_text("not a folder")
    (out / "cases").mkdir(exist_ok=True)
    (out / "cases" / "old.json").write_text("{}")
    one_line_exit_2(capsys, ["fuzz", *FUZZ[1:], "--in-process", "--max-examples", "2", "--out", out],
                    "exists and is not a directory")


# -- the upstream cache is trusted code ---------------------------------------------------------------------
@pytest.fixture
def cached_entry(tmp_path, monkeypatch):
    """A real cache entry, fetched from a small local wheel (tests/test_upstream.py builds it)."""
    from test_upstream import VERSION, make_wheel

    from kvfence.contracts.draft import release_kernels

    monkeypatch.setenv("KVFENCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVFENCE_OFFLINE", "1")
    release_kernels.fetch(VERSION, wheel=str(make_wheel(tmp_path / "wheels")), announce=lambda line: None)
    return release_kernels.entry_folder(VERSION), VERSION


@pytest.mark.parametrize("what", ["root", "entry", "module", "manifest"])
def test_a_cache_writable_by_others_is_refused(cached_entry, what):
    from kvfence.contracts.draft import release_kernels

    folder, version = cached_entry
    assert release_kernels.load_entry(version) is not None  # as fetched: trusted
    path = {"root": folder.parent, "entry": folder, "module": folder / "spec_utils.py",
            "manifest": folder / release_kernels.MANIFEST}[what]
    path.chmod(path.stat().st_mode | 0o002)
    with pytest.raises(BadInput, match="writable by others"):
        release_kernels.load_entry(version)
    path.chmod(path.stat().st_mode & ~0o022)
    assert release_kernels.load_entry(version) is not None


def test_a_cache_root_reached_through_a_link_is_judged_by_where_it_points(cached_entry, monkeypatch):
    """A symlinked cache root (``~/.cache -> /data/cache``) is trusted when its target is: a link's own mode
    reads 777 and means nothing. A target writable by others is still refused, named by the link."""
    from kvfence.contracts.draft import release_kernels

    folder, version = cached_entry
    link = folder.parent.parent / "linked-cache"
    link.symlink_to(folder.parent, target_is_directory=True)
    monkeypatch.setenv("KVFENCE_CACHE", str(link))
    assert release_kernels.entry_folder(version).parent == link
    assert release_kernels.load_entry(version) is not None
    folder.parent.chmod(folder.parent.stat().st_mode | 0o002)
    with pytest.raises(BadInput, match=f"{link} is writable by others"):
        release_kernels.load_entry(version)
    folder.parent.chmod(folder.parent.stat().st_mode & ~0o022)


def test_an_entry_swapped_while_it_is_read_is_read_again_not_called_corrupt(cached_entry, monkeypatch, tmp_path):
    """Simultaneous first uses: one process re-extracts (the old folder aside, the new one in) while another
    reads. A file gone mid-read means the entry was swapped: read it again. Then the real thing: a process
    re-extracting 20 times while this one loads, with no "corrupt"."""
    from test_upstream import make_wheel

    from kvfence.contracts.draft import release_kernels

    folder, version = cached_entry
    real = release_kernels._validate_entry
    calls = []

    def swapped_once(v, f):
        calls.append(f)
        if len(calls) == 1:
            raise FileNotFoundError(2, "No such file or directory", str(f / "spec_utils.py"))
        return real(v, f)

    monkeypatch.setattr(release_kernels, "_validate_entry", swapped_once)
    assert release_kernels.load_entry(version) is not None and len(calls) == 2
    monkeypatch.setattr(release_kernels, "_validate_entry", real)
    wheel, errors = make_wheel(tmp_path / "again"), []
    # Another process (as another first user would be; ast.parse is not safe across threads in CPython 3.11).
    writer = subprocess.Popen([sys.executable, "-c", "import sys\nfrom pathlib import Path\n"
                               "from kvfence.contracts.draft import release_kernels\n"
                               "for _ in range(20):\n"
                               "    release_kernels._extract_to_cache(sys.argv[1], Path(sys.argv[2]))\n",
                               version, str(wheel)], stderr=subprocess.PIPE, text=True)
    while writer.poll() is None:
        try:
            release_kernels.load_entry(version)
        except BadInput as exc:
            errors.append(str(exc))
    assert writer.wait() == 0, writer.stderr.read()[-2000:]
    assert errors == [] and release_kernels.load_entry(version) is not None
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []  # no folder left aside


def test_a_manifest_abi_of_the_wrong_type_is_corrupt(cached_entry):
    from kvfence.contracts.draft import release_kernels

    folder, version = cached_entry
    manifest = json.loads((folder / release_kernels.MANIFEST).read_text())
    (folder / release_kernels.MANIFEST).write_text(json.dumps(dict(manifest, abi="x")))
    with pytest.raises(BadInput, match="is corrupt.*abi"):
        release_kernels.load_entry(version)


# -- lock records ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("started", [1e300, -1e20, "NaN", "soon"])
def test_a_dead_runs_lock_record_is_one_safe_line(tmp_path, started):
    from kvfence.engine import outlock

    record = {"pid": "12\x1b[2J", "host": "evil\x1b]0;title\x07\nhost", "started": started}
    text = json.dumps(record).replace('"NaN"', "NaN")
    (tmp_path / outlock.LOCK_NAME).write_text(text)
    notes = []
    outlock.acquire(tmp_path, announce=notes.append)
    outlock.release_all()
    assert len(notes) == 1 and "took over the lock" in notes[0]
    assert "\x1b" not in notes[0] and "\n" not in notes[0] and "\x07" not in notes[0]
    assert "started ?" in notes[0] and "\\x1b" in notes[0]


def test_a_full_disk_when_writing_the_lock_record_is_one_line(tmp_path, monkeypatch):
    import errno

    from kvfence.engine import outlock

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(outlock.os, "write", full)
    with pytest.raises(BadInput, match="cannot write the run lock record.*ENOSPC"):
        outlock.acquire(tmp_path, announce=print)
    monkeypatch.undo()
    assert outlock._HELD == {}
    outlock.acquire(tmp_path, announce=print)  # once the disk has room again: held
    outlock.release_all()


# -- case files ----------------------------------------------------------------------------------------------
def test_a_symlink_loop_case_file_says_so(capsys, tmp_path):
    loop = tmp_path / "loop.json"
    loop.symlink_to(tmp_path / "loop.json")
    line = one_line_exit_2(capsys, ["repro", loop], "cannot read")
    assert "symbolic links" in line and "no such file" not in line
    one_line_exit_2(capsys, ["repro", tmp_path / "absent.json"], "no such file")  # a missing one still says that


# -- --jobs the machine cannot hold, and workers that outlive their job -----------------------------------
@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
@pytest.mark.parametrize("jobs", [str(10**30), "1000"])
def test_more_jobs_than_the_machine_holds_is_refused_at_once(capsys, tmp_path, jobs):
    from kvfence.engine.jobs import max_jobs

    start = time.monotonic()
    line = one_line_exit_2(capsys, ["fuzz", "--device", "cpu", "--jobs", jobs, "--max-examples", "2000",
                                    "--out", tmp_path / "o"], f"at most {max_jobs()} jobs")
    assert time.monotonic() - start < 10 and not (tmp_path / "o").exists(), line


def test_the_jobs_bound_follows_cores_and_memory(monkeypatch):
    from kvfence.cli import fuzz
    from kvfence.engine import jobs

    monkeypatch.setattr(jobs.os, "cpu_count", lambda: 128)  # the host: only the affinity mask counts
    monkeypatch.setattr(jobs.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(jobs, "_available_memory", lambda: 128 << 30)
    assert jobs.max_jobs() == 16 * jobs.JOBS_PER_CORE
    monkeypatch.setattr(jobs, "_available_memory", lambda: 3 * jobs.JOB_MEMORY_BYTES + 1)
    assert jobs.max_jobs() == 3
    # The default --jobs (15 on 16 cores) fits what the machine holds; an explicit --jobs 4 is refused.
    from kvfence.engine import budget

    monkeypatch.setattr(budget, "free_device_memory", lambda: 80 << 30)  # the plan's GPU budget: no GPU here

    def shape(*flags):
        args = cli.build_parser().parse_args(["fuzz", "--device", "cuda", "--max-seconds", "60", *flags])
        return fuzz.plan_from_args(args, "cuda").jobs

    assert shape() == 3
    with pytest.raises(BadInput, match="at most 3 jobs"):
        shape("--jobs", "4")
    monkeypatch.setattr(jobs, "_available_memory", lambda: 0)
    assert jobs.max_jobs() == 1  # one job always runs


def _descendants(pid: int) -> set:
    """Every live descendant of ``pid`` (from /proc; zombies count as gone)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.cpu_only
def test_jobs_and_their_workers_die_with_a_killed_run(tmp_path):
    import signal
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "kvfence", *FUZZ, "--jobs", "2", "--max-examples", "4000",
                             "--out", str(tmp_path / "o")], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        family = set()
        while time.monotonic() < deadline and len(family) < 4:  # 2 fuzz jobs, each with its checking worker
            time.sleep(0.5)
            family = _descendants(proc.pid)
        assert len(family) >= 4, family
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(p) for p in family):
        time.sleep(0.5)
    assert not [p for p in family if _alive(p)]  # no orphan outlives the run


# -- signals are never lost -----------------------------------------------------------------------------
@pytest.mark.cpu_only
def test_a_sigint_while_the_run_starts_ends_it_with_its_outputs(tmp_path):
    import signal
    import subprocess

    out = tmp_path / "o"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "kvfence", *FUZZ, "--max-examples", "4000", "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (out / ".kvfence.lock").exists() and proc.poll() is None:
        time.sleep(0.01)  # the lock is taken before the checking worker starts
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    doc = json.loads((out / "summary.json").read_text())
    assert doc["interrupted"] == "SIGINT" and doc["examples"] < 4000
    assert (out / "report.md").exists() and (out / "report.html").exists()


@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
def test_a_sigint_while_the_outputs_are_written_marks_them_and_they_are_complete(tmp_path, real_run, capsys):
    import signal

    from kvfence.engine import interrupt
    from kvfence.engine.fuzzrun import Outputs, Run
    from kvfence.engine.plan import RunPlan
    from kvfence.reports.render import write_reports
    from kvfence.reports.text import text_table

    doc = json.loads((real_run / "summary.json").read_text())
    doc["interrupted"] = None
    before = {sig: signal.getsignal(sig) for sig in interrupt.SIGNALS}
    try:
        interrupt.defer()
        os.kill(os.getpid(), signal.SIGINT)  # arrives now, as the outputs are about to be written
        run = Run(RunPlan(out=str(tmp_path)), Outputs(render=write_reports, table=text_table), print, print)
        code = run.write_summary(doc)
        assert interrupt.pending() == "SIGINT"
    finally:
        interrupt._RECEIVED.clear()
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert code == 1  # _fuzz_command turns it into 130 (pending)
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["interrupted"] == "SIGINT"
    assert (tmp_path / "report.md").exists() and (tmp_path / "report.html").exists()


# -- OOB_WRITE names the pointer the store went through -------------------------------------------------
@pytest.fixture(scope="module")
def far_store(device):
    import triton
    import triton.language as tl

    @triton.jit
    def store_far(dst, n, shift, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(dst + offs + shift, offs, mask=offs < n)

    return store_far


@pytest.mark.cpu_only
@pytest.mark.parametrize("shift, region", [(0, None), (10**7, "past the allocation"), (-10**7, "before the allocation"),
                                           (40, "past the allocation"), (-40, "before the allocation")])
def test_a_wild_store_is_named_after_its_pointer(far_store, shift, region):
    import numpy as np
    import torch

    from kvfence.engine.audit import Audit
    from kvfence.engine.findings import Kind

    n = 16
    # One host array: "neighbour" right after "target" (a store 40 past target's end lands just past the
    # neighbour's end, where the old nearest-allocation guess named the neighbour), then "before" ahead of it.
    outer = np.zeros(160, dtype=np.int32)
    before, target, neighbour = (torch.from_numpy(outer[o:o + n]) for o in (0, 64, 80))
    a = Audit()
    for name, t in (("before", before), ("target", target), ("neighbour", neighbour)):
        a.register_tensor(name, t)
    with a:
        far_store[(1,)](target, n, shift, BLOCK=n)
    writes = [f for f in a.findings() if f.kind is Kind.OOB_WRITE]
    if region is None:
        assert a.findings() == [] and target.tolist() == list(range(n))
    else:
        assert [(f.buffer, f.region) for f in writes] == [("target", region)]
        assert writes[0].count == n


# -- plug-ins whose import ends the process ---------------------------------------------------------------
PLUGIN_TAIL = "\n\ndef launch(**kw):\n    pass\n\n\ndef width(n, topk, ctx, num_steps):\n    return n * topk * ctx\n"
IMPORT_EFFECTS = [
    ("os-exit-0", "import os\nos._exit(0)", "ends the process (exit status 0)"),
    ("os-abort", "import os\nos.abort()", "dies of SIGABRT"),
    ("keyboard-interrupt", "raise KeyboardInterrupt", "raised KeyboardInterrupt"),
    ("sigkill-self", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "dies of SIGKILL"),
]


@pytest.mark.parametrize("what", ["kernel", "sizing"])
@pytest.mark.parametrize("name, code, needle", IMPORT_EFFECTS, ids=[e[0] for e in IMPORT_EFFECTS])
def test_a_plugin_whose_import_ends_the_process_is_one_line(tmp_path, what, name, code, needle):
    plugin = tmp_path / "plugin.py"
    plugin.write_text(code + PLUGIN_TAIL)
    spec = f"{plugin}:{'launch' if what == 'kernel' else 'width'}"
    proc = kvfence("fuzz", "--device", "cpu", f"--{what}", spec, "--max-examples", "2", "--out", tmp_path / "o",
                   timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("kvfence: error: importing") and needle in lines[0], lines[0]


def test_plugins_that_import_cleanly_pass_the_probe(tmp_path):
    from kvfence.engine.probe import check_plugins

    plugin = tmp_path / "plugin.py"
    plugin.write_text("X = 1" + PLUGIN_TAIL)
    check_plugins("draft", {"kernel": f"{ROOT}/tests/targets/classic_kernel.py:classic", "sizing": f"{plugin}:width"})
    with pytest.raises(BadInput, match="has no attribute"):  # a refusal in the probe reads as it would here
        check_plugins("draft", {"sizing": f"{plugin}:nothing"})


@pytest.mark.parametrize("url, needle", [("redis://[::1/0", "Invalid IPv6 URL"),
                                         ("redis://:pw@h:99999/0", "port must be an integer"),
                                         ("redis://h:6379/x", "must be a number")])
@pytest.mark.interpreter  # runs --device cpu (the Triton interpreter)
def test_malformed_redis_urls_are_one_line(capsys, tmp_path, url, needle):
    line = one_line_exit_2(capsys, ["fuzz", "--device", "cpu", "--database", url, "--out", tmp_path / "o"], needle)
    assert "pw" not in line


def test_repro_probes_a_kernel_plugin_named_on_its_command_line(tmp_path):
    from kvfence.engine import casefile

    case = tmp_path / "case.json"
    case.write_text(json.dumps(casefile.document(_small_case(), [], device="cpu", source="test")))
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import os\nos._exit(0)" + PLUGIN_TAIL)
    proc = kvfence("repro", case, "--device", "cpu", "--kernel", f"{plugin}:launch", timeout=120)
    assert proc.returncode == 2 and "exit status 0" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_redaction_is_linear_whatever_the_message():
    """A long word without ``://`` (and a 10 MB refusal reason) is redacted in one pass: the old regex
    backtracked quadratically (80k characters took 6 s), and a word of many ``://`` was scanned to its end
    again for each of them (80k characters of ``x://`` took 48 s)."""
    import time

    for text in ("a" * 200_000, "x://" + "b" * 200_000, ("ab1+" * 2_500_000) + " redis://u:p@h",
                 "x://" * 20_000 + " redis://u:p@h", "x://a" * 16_000 + "@h redis://u:p@h",
                 "redis://:" * 9_000 + "u:p@h"):
        start = time.perf_counter()
        out = redact(text)
        assert time.perf_counter() - start < 2.0, len(text)
        assert "u:p" not in out
    assert redact("x1://u:p@h and 9ab://q@r") == "x1://***@h and 9ab://***@r"


@hypothesis.given(hypothesis.strategies.text(alphabet="ab1+.-:/@ \n", max_size=60))
def test_redaction_equals_the_specification_regex(text):
    """The linear pass is the rule ``scheme://`` + everything to the last ``@`` of the word, as a regex says."""
    import re

    rule = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://)\S*@")
    assert redact(text) == rule.sub(r"\1***@", text)


@pytest.mark.interpreter  # --device cpu: the Triton interpreter must be usable here
@pytest.mark.parametrize("where, make", [("jobs", "file"), ("jobs/job-0", "file"), ("jobs/stop", "dir")])
def test_a_jobs_scratch_path_of_the_wrong_type_is_one_line_before_a_job_starts(capsys, tmp_path, where, make):
    out = tmp_path / "out"
    (out / where).parent.mkdir(parents=True, exist_ok=True)
    (out / where).mkdir() if make == "dir" else (out / where).write_text("not a folder")
    line = one_line_exit_2(capsys, ["fuzz", "--device", "cpu", "--jobs", "2", "--max-examples", "2", "--out", out],
                           str(out / where))
    assert ("is a directory" if make == "dir" else "exists and is not a directory") in line
    assert not (out / "jobs" / "job-1").exists()


#: Where a SIGINT lands while kvfence starts: importing ``kvfence.cli``, or building the parser and
#: parsing (the first ~0.2 s; a signal there used to print a bare "kvfence: interrupted").
STARTING = {
    "importing": ("import builtins\n"
                  "real = builtins.__import__\n"
                  "def interrupted(name, *args, **kwargs):\n"
                  "    if name == 'kvfence.cli':\n"
                  "        raise KeyboardInterrupt\n"
                  "    return real(name, *args, **kwargs)\n"
                  "builtins.__import__ = interrupted\n"),
    "parsing": ("import argparse\n"
                "def interrupted(self, *args, **kwargs):\n"
                "    raise KeyboardInterrupt\n"
                "argparse.ArgumentParser.parse_known_args = interrupted  # parse_args calls it too\n"),
}


@pytest.mark.parametrize("where", sorted(STARTING))
def test_a_ctrl_c_while_kvfence_is_still_importing_is_exit_130_and_one_line(where):
    """The first ~0.2 s of a run are Python importing kvfence, before any command sets its signal handling:
    a SIGINT there is a KeyboardInterrupt raised at an import or in the parser. It must end in one line and
    130, as the console script and ``python -m kvfence`` both start in ``kvfence.__main__.main``."""
    child = ("import sys\n" + STARTING[where] + "from kvfence.__main__ import main\n"
             "sys.exit(main(['fuzz', '--device', 'cpu']))\n")
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == ["kvfence: interrupted while starting (no command ran; nothing was "
                                                "written)"]
    script = Path(sys.executable).with_name("kvfence")
    if script.exists():  # the installed console script starts in the same function
        assert "from kvfence.__main__ import main" in script.read_text()


@pytest.mark.interpreter  # the real run of the fixture runs --device cpu
def test_terminal_escapes_in_a_summary_reach_neither_report(capsys, real_run, tmp_path):
    """``report DIR`` renders any folder's summary.json: its strings (kernel, sizing, a finding's fields)
    are shown as text, control characters escaped, in report.md and report.html alike."""
    folder = _hostile_copy(real_run, tmp_path, ("kernel",), "evil\x1b[2Jkernel\x07")
    doc = json.loads((folder / "summary.json").read_text())
    doc["sizing"] = "prefix\x1b]0;pwned\x07"
    doc["findings"][0]["region"] = "kv_indices\x1b[31m row 0"
    (folder / "summary.json").write_text(json.dumps(doc))
    cli.main(["report", str(folder)])
    capsys.readouterr()
    for name in ("report.md", "report.html"):
        text = (folder / name).read_text()
        assert "\x1b" not in text and "\x07" not in text, name
        assert "evil\\x1b[2Jkernel\\x07" in text, name


@pytest.mark.interpreter  # the real run of the fixture runs --device cpu
def test_merge_refuses_a_case_file_edited_after_its_run(capsys, real_run, tmp_path):
    """The summary's findings describe each case as it ran; a case file edited since (its case no longer
    hashes to its name) would be merged under the old description: one line naming the file instead."""
    import shutil

    folder = tmp_path / "edited"
    shutil.copytree(real_run, folder)
    case_file = sorted((folder / "cases").glob("*.json"))[0]
    doc = json.loads(case_file.read_text())
    doc["case"]["case"]["batch"]["token_seed"] += 1  # still a valid case, another one
    case_file.write_text(json.dumps(doc))
    one_line_exit_2(capsys, ["report", "--merge", real_run, folder, "--out", tmp_path / "merged"],
                    f"case file {case_file.name} was changed after its run")
    assert not (tmp_path / "merged").exists()


# -- a sizing plug-in's callable runs behind the engine's boundary -----------------------------------------
_SIZINGS = '''
import os, time
def exits(n, topk, ctx, num_steps):
    os._exit(0)
def aborts(n, topk, ctx, num_steps):
    os.abort()
def interrupts(n, topk, ctx, num_steps):
    raise KeyboardInterrupt
def hangs(n, topk, ctx, num_steps):
    time.sleep(600)
'''


@pytest.mark.interpreter  # --device cpu: the Triton interpreter must be usable here
@pytest.mark.parametrize("name, needle", [
    ("exits", "ended its process with exit status 0 before the command returned"),
    ("aborts", "died of SIGABRT"),
    ("interrupts", "raised KeyboardInterrupt while no signal came"),
    ("hangs", "did not return within 1s (kvfence's limit on one call into a plug-in's code, KVFENCE_CALL_LIMIT_S)")])
def test_a_sizing_plugin_that_ends_or_stalls_its_process_is_one_line_exit_2(tmp_path, name, needle):
    """The callable of ``--sizing file.py:attr`` is user code called for every drawn config: in the fuzzing
    process an ``os._exit(0)`` would be a silent pass. It runs behind the engine's boundary, as a plug-in
    contract's methods do (the command in a supervised child, each call under the call limit
    ``KVFENCE_CALL_LIMIT_S``): each of these is one line naming the sizing and the call, exit 2. (One that raises,
    ``sys.exit``s or answers no width: tests/test_plugins.py, tests/test_bad_input.py.)"""
    (tmp_path / "sz.py").write_text(_SIZINGS)
    proc = subprocess.run([sys.executable, "-m", "kvfence", "fuzz", "--device", "cpu", "--sizing", f"sz.py:{name}",
                           "--max-examples", "3", "--out", str(tmp_path / "o")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, KVFENCE_CALL_LIMIT_S="1"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith(f"kvfence: error: sizing 'sz.py:{name}'") and needle in lines[0], lines[0]


@pytest.mark.interpreter  # --device cpu: the Triton interpreter must be usable here
def test_check_kernel_with_a_sizing_plugin_that_exits_is_a_contract_fault_naming_it(tmp_path, monkeypatch):
    """``kvfence.check_kernel(sizing=...)`` runs behind the same boundary as a plug-in contract's code: the
    sizing's ``os._exit(0)`` ends the boundary's child, never the caller, and is one ``ContractFault`` line."""
    import kvfence
    from kvfence.engine.boundary import ContractFault

    (tmp_path / "sz.py").write_text(_SIZINGS)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ContractFault, match=r"^sizing 'sz.py:exits': its call for n=1, topk=1, ctx=2, num_steps=1 "
                                            r"ended its process with exit status 0"):
        kvfence.check_kernel("reference", sizing="sz.py:exits", device="cpu", max_examples=3, out_dir=tmp_path / "o")


@pytest.mark.interpreter  # --device cpu: the Triton interpreter must be usable here
def test_fuzz_with_a_sizing_that_exits_0_is_one_line_and_exit_2(capsys, tmp_path, monkeypatch):
    (tmp_path / "sz.py").write_text(_SIZINGS)
    monkeypatch.chdir(tmp_path)
    one_line_exit_2(capsys, ["fuzz", "--device", "cpu", "--sizing", "sz.py:exits", "--max-examples", "3",
                             "--out", tmp_path / "o"], "its call for n=1, topk=1, ctx=2, num_steps=1 ended its process")


@pytest.mark.interpreter  # --device cpu: the Triton interpreter must be usable here
@pytest.mark.parametrize("kernel, sizing", [
    ("é" * 40_000 + ".py:launch", None),  # 80 KB on the command line, 240 KB once JSON-escaped
    ("a" * 70_000 + ".py:launch", "a" * 70_000 + ".py:s"),
], ids=["non-ascii-kernel", "two-long-specs"])
def test_a_very_long_plug_in_spec_is_one_line_not_a_traceback(capfd, tmp_path, kernel, sizing):
    """The plug-in probe's options go to its child in a file: as one command-line argument, a spec past
    Linux's 128 KiB per argument made the probe's start fail with an ``OSError`` traceback. (``capfd``: with a
    sizing plug-in the command runs in the boundary's child, whose line reaches this process's stderr.)"""
    argv = ["fuzz", "--device", "cpu", "--kernel", kernel, "--max-examples", "2", "--out", tmp_path / "o"]
    line = one_line_exit_2(capfd, argv + (["--sizing", sizing] if sizing else []), "kernel '")
    assert "Argument list too long" not in line
