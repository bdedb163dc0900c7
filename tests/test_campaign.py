"""Campaigns beyond one process (kvfence.engine.campaign): the example database, its key, shards.

The replay tests run real ``python -m kvfence fuzz`` processes one after another against one database
(a directory, and a real ``redis-server`` when it is installed): the first finds the seed's bug, the
second, with another seed and a budget of one example, must replay that failure at once; the same
second run without the database (or under another kernel's key) must stay clean.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings

from kvfence.contracts.draft.domain import CPU, GPU
from kvfence.contracts.draft.strategies import configs
from kvfence.engine import campaign, registry, run
from kvfence.engine.plan import RunPlan
from kvfence.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]
#: The draft kernel's shard cells (its record's ``shard_fields``) on the CPU domain.
DOMAINS = run.shard_fields(registry.get("draft"), RunPlan())
GRID = list(DOMAINS.values())


def kvfence(*args, timeout=240, env=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "kvfence", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


# -- URL parsing ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, kind, display", [
    ("none", "none", "none"),
    ("redis://127.0.0.1:6380/2", "redis", "redis://127.0.0.1:6380/2"),
    ("redis://cache.example", "redis", "redis://cache.example:6379/0"),
    ("redis://:s3cret@cache.example:7000/1", "redis", "redis://cache.example:7000/1"),
    ("some/dir", "directory", "some/dir"),
])
def test_database_urls_parse(text, kind, display):
    spec = campaign.parse_database(text)
    assert (spec.kind, spec.display) == (kind, display)
    assert "s3cret" not in spec.display


@pytest.mark.parametrize("text, message", [
    ("http://host/0", "unsupported scheme 'http'"),
    ("redis://host:notaport/0", "port must be an integer"),
    ("redis://host:6379/zero", "database must be a number"),
    ("redis://:6379/0", "no host"),
    ("redis://user:pw@host:6379/0", "password only"),
    ("redis://host:6379/0?db=1", "unexpected ?query"),
    ("", "empty value"),
])
def test_malformed_database_urls_are_bad_input(text, message):
    with pytest.raises(BadInput, match=None) as err:
        campaign.parse_database(text)
    assert message in str(err.value)


def test_a_password_never_reaches_a_message():
    with pytest.raises(BadInput) as err:
        campaign.parse_database("redis://:hunter2@host:6379/x")
    assert "hunter2" not in str(err.value) and "***" in str(err.value)


# -- shards ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, index, count", [("1/1", 1, 1), ("3/8", 3, 8), (" 2 / 2 ", 2, 2)])
def test_shards_parse(text, index, count):
    assert campaign.parse_shard(text) == campaign.Shard(index, count)


@pytest.mark.parametrize("text", ["3/2", "0/2", "1/0", "x", "1/2/3", "-1/2"])
def test_bad_shards_are_bad_input(text):
    with pytest.raises(BadInput):
        campaign.parse_shard(text)


_SLURM = {"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "4",
          "SLURM_ARRAY_TASK_COUNT": "4"}


@pytest.mark.parametrize("text, environ, shard", [
    ("auto", _SLURM, (3, 4)),                                                          # sbatch --array=1-4
    ("auto/4", _SLURM, (3, 4)),
    ("auto", {**_SLURM, "SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_STEP": "2"},
     (3, 4)),                                                                          # --array=0-6:2
    ("auto/4", {"JOB_COMPLETION_INDEX": "2"}, (3, 4)),                                 # Indexed Job, completions 4
    ("auto/1", {"JOB_COMPLETION_INDEX": "0"}, (1, 1)),
])
def test_shard_auto_reads_the_schedulers_index(text, environ, shard):
    assert campaign.parse_shard(text, environ) == campaign.Shard(*shard)


@pytest.mark.parametrize("text, environ, message", [
    ("auto", {}, "neither SLURM_ARRAY_TASK_ID"),
    ("auto", {"JOB_COMPLETION_INDEX": "2"}, "give --shard auto/N with N = .spec.completions"),
    ("auto/4", {"JOB_COMPLETION_INDEX": "4"}, "is not below 4"),
    ("auto/3", _SLURM, "the Slurm array has 4 tasks"),
    ("auto", {**_SLURM, "JOB_COMPLETION_INDEX": "0"}, "both"),
    ("auto", {**_SLURM, "SLURM_ARRAY_TASK_ID": "x"}, "not a non-negative integer"),
    ("auto", {"SLURM_ARRAY_TASK_ID": "3"}, "needs SLURM_ARRAY_TASK_MIN"),
    ("auto/0", {"JOB_COMPLETION_INDEX": "0"}, "expected auto or auto/N"),
])
def test_shard_auto_without_a_usable_index_is_one_line(text, environ, message):
    with pytest.raises(BadInput, match=re.escape(message)):
        campaign.parse_shard(text, environ)


@pytest.mark.parametrize("count", [1, 2, 3, 8, 320])
def test_shards_partition_the_config_cells(count):
    """Disjoint, covering, balanced (sizes differ by at most one)."""
    parts = [set(campaign.shard_cells(campaign.Shard(i, count), GRID)[0]) for i in range(1, count + 1)]
    cells = set().union(*parts)
    assert len(cells) == CPU.max_topk * CPU.max_steps * len(CPU.page_sizes)
    assert sum(len(p) for p in parts) == len(cells)  # disjoint
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_each_shard_of_eight_spreads_over_topks_and_page_sizes():
    for i in range(1, 9):
        cells = campaign.shard_cells(campaign.Shard(i, 8), GRID)[0]
        assert len({c[0] for c in cells}) >= 4 and len({c[2] for c in cells}) >= 4, (i, cells)


def test_more_shards_than_cells_share_cells_and_say_so():
    _, info = campaign.shard_draws(campaign.Shard(3, 4), lambda **pins: configs(**pins),
                                   {"topk": (2,), "num_steps": (1,), "page_size": (1,)})
    assert info["cells"] == 1 and info["of_cells"] == 1 and info["partition"].startswith("seeds only")


def test_shard_seeds_are_distinct_across_shards_and_seeds():
    seeds = {campaign.shard_seed(s, campaign.Shard(i, 4)) for s in range(5) for i in range(1, 5)}
    assert len(seeds) == 20
    assert campaign.shard_seed(7, None) == 7 and campaign.shard_seed(None, campaign.Shard(1, 2)) is None


def test_gpu_domain_cells_are_dealt_too():
    gpu = run.shard_fields(registry.get("draft"), RunPlan(device="cuda", domain="gpu"))
    cells, total = campaign.shard_cells(campaign.Shard(5, 16), list(gpu.values()))
    assert total == GPU.max_topk * GPU.max_steps * len(GPU.page_sizes) and len(cells) == total // 16


def test_cells_that_exceed_the_memory_budget_are_left_out_and_counted():
    from kvfence.contracts.draft.case import Config
    from kvfence.contracts.draft.runner_buffers import config_bytes

    # A budget that the smallest topk-8 config exceeds but the smallest topk-1 config fits.
    small = config_bytes(Config(topk=1, num_steps=1, page_size=1, ctx=2, max_bs=1))
    big = config_bytes(Config(topk=8, num_steps=8, page_size=1, ctx=9, max_bs=1))
    assert small < big
    budget = (small + big) // 2
    _, info = campaign.shard_draws(campaign.Shard(1, 1), lambda **pins: configs(**pins, max_bytes=budget), DOMAINS)
    assert 0 < info["unfit_cells"] < info["of_cells"] and info["cells"] + info["unfit_cells"] == info["of_cells"]


def _cell(config):
    return (config.topk, config.num_steps, config.page_size)


def test_a_sharded_strategy_draws_only_its_own_cells():
    shard = campaign.Shard(2, 8)
    mine = set(campaign.shard_cells(shard, GRID)[0])
    sharded, _ = campaign.shard_draws(shard, lambda **pins: configs(**pins), DOMAINS)
    seen_sharded, seen_all = set(), set()

    @settings(max_examples=150, database=None, derandomize=True)
    @given(sharded, configs())
    def draw(config, unsharded):
        seen_sharded.add(_cell(config))
        seen_all.add(_cell(unsharded))

    draw()
    assert seen_sharded <= mine and len(seen_sharded) >= 10
    assert seen_all - mine  # the unsharded strategy does reach other shards' cells


# -- the database wrapper -------------------------------------------------------------------------------
def test_the_campaign_database_keeps_failures_and_drops_the_pareto_front():
    from hypothesis.database import InMemoryExampleDatabase

    inner = InMemoryExampleDatabase()
    db = campaign.CampaignDatabase(inner, prefix=b"ns:")
    db.save(b"key", b"failure")
    db.save(b"key.secondary", b"bigger failure")
    db.save(b"key.pareto", b"best need/width")
    assert set(inner.fetch(b"ns:key")) == {b"failure"} and set(inner.fetch(b"ns:key.secondary")) == {b"bigger failure"}
    assert list(inner.fetch(b"ns:key.pareto")) == [] and list(db.fetch(b"key.pareto")) == []
    assert list(db.fetch(b"key")) == [b"failure"] and list(inner.fetch(b"key")) == []  # namespaced
    db.move(b"key", b"key.secondary", b"failure")
    assert list(db.fetch(b"key")) == [] and b"failure" in set(db.fetch(b"key.secondary"))
    db.delete(b"key.secondary", b"failure")
    assert set(db.fetch(b"key.secondary")) == {b"bigger failure"}
    assert campaign.stored_failures(db, b"key.secondary") == 1 and campaign.stored_failures(None, b"key") == 0


# -- the database key -----------------------------------------------------------------------------------
def _key(**kw):
    base = dict(kernel="reference", sizing="prefix", domain={"mode": "graph", "shard": None})
    base.update(kw)
    return campaign.database_key(**base)


def test_the_key_separates_kernels_sizings_and_domains_and_nothing_else():
    assert _key() == _key()
    assert len({_key(), _key(kernel="reference-blocked"), _key(sizing="fixed"),
                _key(domain={"mode": "eager", "shard": None}), _key(domain={"mode": "graph", "shard": "1/2"})}) == 5


def test_the_key_is_the_same_in_another_process():
    code = ("from kvfence.engine.campaign import database_key; print(database_key(kernel='reference', sizing='prefix', "
            "domain={'mode': 'graph', 'shard': None}).hex())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT),
                         PYTHONHASHSEED="123"), capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == _key().hex()


# -- replay through a real database ---------------------------------------------------------------------
FIRST = ["fuzz", "--sizing", "prefix", "--device", "cpu", "--max-examples", "40", "--seed", "1", "--quiet",
         "--shrink-seconds", "6"]
# Another seed and a budget of one example: Hypothesis's first example is its simplest (topk 1), which
# the prefix policy sizes correctly, so this run is clean unless it replays a stored failure.
SECOND = ["fuzz", "--sizing", "prefix", "--device", "cpu", "--max-examples", "1", "--seed", "5", "--quiet"]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def check_replay(tmp_path: Path, database: str) -> None:
    first = kvfence(*FIRST, "--database", database, "--out", str(tmp_path / "first"))
    assert first.returncode == 1, first.stdout + first.stderr
    found = _summary(tmp_path / "first")
    assert found["campaign"]["stored_failures_at_start"] == 0

    second = kvfence(*SECOND, "--database", database, "--out", str(tmp_path / "second"))
    assert second.returncode == 1, second.stdout + second.stderr
    replayed = _summary(tmp_path / "second")
    assert replayed["campaign"]["stored_failures_at_start"] >= 1
    assert replayed["examples_to_failure"] == 1 and replayed["launches"] <= 3
    # Reported like a fresh failure: the same case, with its own case file in this run's folder.
    assert set(found["cases"]) and {Path(p).name for p in replayed["cases"]} == {Path(p).name for p in found["cases"]}
    assert all(Path(p).exists() and str(tmp_path / "second") in p for p in replayed["cases"])
    assert "replayed 1 stored failure" in second.stdout

    without = kvfence(*SECOND, "--database", "none", "--out", str(tmp_path / "without"))
    assert without.returncode == 0, without.stdout + without.stderr
    other_key = kvfence(*SECOND, "--kernel", "reference-blocked", "--database", database,
                        "--out", str(tmp_path / "other"))
    assert other_key.returncode == 0, other_key.stdout + other_key.stderr
    assert _summary(tmp_path / "other")["campaign"]["stored_failures_at_start"] == 0


@pytest.mark.cpu_only
@pytest.mark.long
def test_a_directory_database_replays_the_first_runs_failure(tmp_path):
    check_replay(tmp_path, str(tmp_path / "examples"))


def _assert_first_examples(doc: dict) -> None:
    """``first_examples``: the explored examples in order up to ``FIRST_EXAMPLES_KEPT``, the failing one
    last when it came within them, each checked after it began, with the config it drew."""
    from kvfence.engine.result import EXAMPLE_WORK, FIRST_EXAMPLES_KEPT

    rows = doc["first_examples"]
    assert [r["example"] for r in rows] == list(range(1, min(doc["examples"], FIRST_EXAMPLES_KEPT) + 1))
    assert all(0 < r["began_s"] <= r["checked_s"] for r in rows)
    assert all(a["checked_s"] <= b["began_s"] for a, b in zip(rows, rows[1:]))
    # An example whose cases were checked before (Hypothesis repeats its simplest one) checks none.
    assert rows[0]["cases_checked"] >= 1 and all(r["config"]["topk"] >= 1 for r in rows)
    if doc["examples_to_failure"] <= FIRST_EXAMPLES_KEPT:
        assert rows[doc["examples_to_failure"] - 1]["config"]["topk"] >= 2  # the prefix policy fails only there
    # Each row's work is the sessions' counters' change over that example: the first built its config's buffers
    # and launched; the rows add up to no more than the run's totals.
    assert set(rows[0]["work"]) == set(EXAMPLE_WORK)
    assert rows[0]["work"]["runners"] >= 1 and rows[0]["work"]["launches"] >= rows[0]["cases_checked"]
    assert sum(r["work"]["launches"] for r in rows) <= doc["launches"]


@pytest.mark.cpu_only
def test_the_default_database_lives_under_out_and_replays(tmp_path):
    out = tmp_path / "out"
    assert kvfence(*FIRST, "--out", str(out)).returncode == 1
    _assert_first_examples(_summary(out))
    again = kvfence(*SECOND, "--out", str(out))
    assert again.returncode == 1, again.stdout + again.stderr
    doc = _summary(out)
    assert doc["campaign"]["database"] == str(out / ".hypothesis") and doc["examples_to_failure"] == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A real ``redis-server`` on a free loopback port, stopped at the end of the module."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install -y redis-server; .ci/run installs it)")
    pytest.importorskip("redis", reason="the redis client is not installed (pip install redis; in the test extra)")
    import redis

    folder = tmp_path_factory.mktemp("redis")
    for _attempt in range(3):
        port = _free_port()
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", str(folder)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        else:
            proc.kill()
            proc.wait(10)
            continue  # the port was taken, or the server did not come up in time: try another
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        return
    pytest.fail("redis-server did not start on a free loopback port in three attempts")


@pytest.mark.cpu_only
@pytest.mark.redis
def test_a_redis_database_replays_the_first_runs_failure(tmp_path, redis_url):
    check_replay(tmp_path, redis_url)


# -- the pytest property tests: KVFENCE_DATABASE ---------------------------------------------------------
PROPERTY = '''
import os
from hypothesis import given, strategies as st

@given(st.integers(0, 1000))
def test_logged(n):
    with open(os.environ["LOG"], "a") as fh:
        fh.write(f"{n}\\n")
    assert n < 500
'''


def _pytest_first_value(folder: Path, name: str, database: str, *extra, must_fail: bool = False) -> int:
    """The first value the property saw in a pytest session with ``KVFENCE_DATABASE=database``."""
    log = folder / f"{name}.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT), LOG=str(log), KVFENCE_DATABASE=database, HYPOTHESIS_PROFILE="ci")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           "-p", "no:xdist", "--rootdir", str(folder), str(folder / "test_logged.py"), *extra],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode in ((1,) if must_fail else (0, 1)), proc.stdout + proc.stderr
    return int(log.read_text().split()[0])


def test_property_tests_replay_through_kvfence_database(tmp_path):
    """The first session shrinks the failure to 500; the next one starts with it. Without the database,
    or under another --kvfence-kernel (its own namespace), Hypothesis starts with its simplest example, 0."""
    (tmp_path / "test_logged.py").write_text(PROPERTY)
    database = str(tmp_path / "db")
    _pytest_first_value(tmp_path, "first", database, must_fail=True)
    assert _pytest_first_value(tmp_path, "second", database, must_fail=True) == 500
    assert _pytest_first_value(tmp_path, "none", "none") != 500
    assert _pytest_first_value(tmp_path, "other", database, "--kvfence-kernel", "reference-blocked") != 500


# -- bad input --------------------------------------------------------------------------------------------
@pytest.mark.interpreter  # runs --device cpu in a subprocess
@pytest.mark.parametrize("args, message", [
    (["--database", "redis://127.0.0.1:1/0"], "cannot reach Redis"),
    (["--database", "redis://127.0.0.1:port/0"], "port must be an integer"),
    (["--database", "memcached://127.0.0.1:1/0"], "unsupported scheme"),
    (["--shard", "3/2"], "I must be in 1..2"),
    (["--shard", "two"], "expected I/N"),
])
def test_campaign_bad_input_is_one_line_and_exit_2_before_work(tmp_path, args, message):
    out = tmp_path / "out"
    proc = kvfence("fuzz", "--device", "cpu", "--max-examples", "1", "--out", str(out), *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr
    assert not out.exists()  # nothing ran, nothing was written


@pytest.mark.cpu_only
def test_a_sharded_run_stays_in_its_cells_and_records_the_shard(tmp_path):
    out = tmp_path / "out"
    proc = kvfence("fuzz", "--shard", "2/8", "--seed", "3", "--max-examples", "12", "--device", "cpu", "--quiet",
                   "--no-target", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = _summary(out)
    shard = doc["campaign"]["shard"]
    assert shard["shard"] == "2/8" and shard["cells"] == 40 and shard["of_cells"] == 320
    assert doc["campaign"]["hypothesis_seed"] == 3 * 8 + 1
    drawn = {tuple(e["config"][f] for f in ("topk", "num_steps", "page_size")) for e in doc["first_examples"]}
    assert drawn and drawn <= set(campaign.shard_cells(campaign.Shard(2, 8), GRID)[0])
    assert "shard" in proc.stdout and "2/8" in proc.stdout


@pytest.mark.cpu_only
def test_shard_auto_in_a_slurm_array_task_runs_that_tasks_shard(tmp_path):
    """The variables Slurm sets in task 2 of ``sbatch --array=1-8``: the run is shard 2/8, as with --shard 2/8."""
    out = tmp_path / "out"
    env = {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "8",
           "SLURM_ARRAY_TASK_COUNT": "8", "SLURM_ARRAY_JOB_ID": "4711"}
    proc = kvfence("fuzz", "--shard", "auto", "--seed", "3", "--max-examples", "4", "--device", "cpu", "--quiet",
                   "--no-target", "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = _summary(out)
    assert doc["campaign"]["shard"]["shard"] == "2/8" and doc["campaign"]["hypothesis_seed"] == 3 * 8 + 1


@pytest.mark.cpu_only
def test_jobs_share_one_database_under_out(tmp_path):
    """``--jobs`` children get the parent's database (default ``OUT/.hypothesis``, not one per job): a
    second run's jobs replay the first run's failure; the same run without a database stays clean."""
    out = tmp_path / "out"
    first = kvfence(*FIRST, "--jobs", "2", "--out", str(out))
    assert first.returncode == 1, first.stdout + first.stderr
    assert (out / ".hypothesis").is_dir() and not list((out / "jobs").glob("*/.hypothesis"))
    again = kvfence(*SECOND, "--jobs", "2", "--max-examples", "2", "--out", str(out))
    assert again.returncode == 1, again.stdout + again.stderr
    assert _summary(out)["campaign"]["stored_failures_at_start"] >= 1
    clean = kvfence(*SECOND, "--jobs", "2", "--max-examples", "2", "--database", "none", "--out", str(tmp_path / "c"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
