"""Campaigns beyond one process: the shared Hypothesis example database, its key, and shards.

Three things live here and nowhere else:

* **``--database``** — ``none``, a directory (Hypothesis's ``DirectoryBasedExampleDatabase``) or
  ``redis://[:PASSWORD@]HOST[:PORT][/DB]`` (``hypothesis.extra.redis.RedisExampleDatabase``).
  ``parse_database`` checks the text, ``open_database`` connects (a Redis server that does not answer
  is ``BadInput`` before any work).
* **The database key** — ``database_key(...)``: a digest of the kernel spec, the sizing spec, the
  contract version (``KEY_VERSION``) and the domain (the contract's ``database_domain``; the draft kernel's:
  mode, layout, seq-len limit, pinned config fields, ``--scale``'s bounds, batches per example, shard).
  Hypothesis's default key is a digest of the test function's source, and ``kvfence.engine.loop`` builds one test
  function for every kernel, so without an explicit key every kernel would replay (and, when the example passes, delete)
  every other kernel's failures. The key does not depend on the host, the device, the seed, the example or memory budget
  or kvfence's own source, so last night's failure is replayed by tonight's run of the same target
  and domain on any host (``--scale cpu`` and ``gpu`` are different domains).
* **``--shard I/N``** — a deterministic partition of the config space and of the seeds. The config
  cells (every combination of the contract's ``shard_fields``: the draft kernel's ``(topk, num_steps,
  page_size)``) are dealt to N shards by a hash (balanced, and each shard gets a spread of each field); a
  shard draws one index into its own cells (no rejection sampling), then the rest from the contract's draws
  with the cell pinned (cells whose smallest config exceeds the memory budget are left out, and counted).
  ``shard_seed`` maps ``--seed S`` to ``S*N + I-1``, so shards sharing a seed still run distinct random streams. When
  fewer cells than shards exist (e.g. a fully pinned GPU config), shards share cells and differ by seed only; the
  summary says so.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import unquote, urlsplit

from hypothesis import strategies as st
from hypothesis.database import ExampleDatabase

from kvfence.errors import BadInput, redact_word, require

#: Bump when the contract (docs/contract.md) or the meaning of a drawn choice sequence changes in a way
#: that makes stored examples mean something else: every stored example then starts afresh.
KEY_VERSION = 1
#: Hypothesis database sub-folder of ``--out`` used when ``--database`` is not given.
DEFAULT_DIR_NAME = ".hypothesis"
REDIS_DEFAULT_PORT = 6379
#: Seconds to wait for a Redis server before calling the URL unreachable.
REDIS_TIMEOUT_S = 5.0
#: The environment variable that passes a Redis password without putting it on the command line.
REDIS_PASSWORD_ENV = "KVFENCE_REDIS_PASSWORD"


# -- shards ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str, environ: Optional[Mapping[str, str]] = None) -> Shard:
    """``I/N`` with ``1 <= I <= N``, or ``auto`` / ``auto/N``: the index the scheduler gives this task
    (``shard_from_scheduler``). One-line ``BadInput`` otherwise."""
    text = str(text).strip()
    if text == "auto" or text.startswith("auto/"):
        count = None
        if text != "auto":
            match = re.match(r"^auto/(\d+)$", text)
            if match is None or int(match.group(1)) < 1:
                raise BadInput(f"--shard {text!r}: expected auto or auto/N")
            count = int(match.group(1))
        return shard_from_scheduler(os.environ if environ is None else environ, count)
    match = _SHARD.match(text)
    if match is None:
        raise BadInput(f"--shard {text!r}: expected I/N, e.g. 1/4 (shards are numbered 1..N), or auto")
    index, count = int(match.group(1)), int(match.group(2))
    require(count >= 1, f"--shard {text}: N must be at least 1")
    require(1 <= index <= count, f"--shard {text}: I must be in 1..{count} (shards are numbered 1..N)")
    return Shard(index, count)


def _env_int(environ: Mapping[str, str], name: str) -> Optional[int]:
    value = environ.get(name)
    if value is None or value == "":
        return None
    require(value.strip().isdigit(), f"--shard auto: {name}={value!r} is not a non-negative integer"[:200])
    return int(value)


def shard_from_scheduler(environ: Mapping[str, str], count: Optional[int] = None) -> Shard:
    """This task's shard from its scheduler's environment (docs/campaigns.md):

    * a Slurm job array (``sbatch --array=A-B[:S]``): ``SLURM_ARRAY_TASK_ID``, ``SLURM_ARRAY_TASK_MIN`` and
      ``SLURM_ARRAY_TASK_STEP`` give the 1-based index, ``SLURM_ARRAY_TASK_COUNT`` the count;
    * a Kubernetes Indexed Job: ``JOB_COMPLETION_INDEX`` (0-based); Kubernetes does not export the
      completion count, so it is ``auto/N`` (``N`` = ``.spec.completions``).

    ``auto/N`` beside a Slurm count must agree with it. Neither scheduler, or both: one line."""
    slurm = _env_int(environ, "SLURM_ARRAY_TASK_ID")
    k8s = _env_int(environ, "JOB_COMPLETION_INDEX")
    require(slurm is not None or k8s is not None,
            "--shard auto: neither SLURM_ARRAY_TASK_ID (a Slurm job array) nor JOB_COMPLETION_INDEX (a Kubernetes "
            "Indexed Job) is set; give --shard I/N")
    require(slurm is None or k8s is None, "--shard auto: both SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX are "
                                          "set; give --shard I/N")
    if slurm is not None:
        first = _env_int(environ, "SLURM_ARRAY_TASK_MIN")
        step = _env_int(environ, "SLURM_ARRAY_TASK_STEP") or 1
        total = _env_int(environ, "SLURM_ARRAY_TASK_COUNT")
        if first is None or total is None or total < 1:
            raise BadInput("--shard auto: a Slurm array task needs SLURM_ARRAY_TASK_MIN and SLURM_ARRAY_TASK_COUNT")
        require(count is None or count == total, f"--shard auto/{count}: the Slurm array has {total} tasks")
        require(slurm >= first and (slurm - first) % step == 0,
                f"--shard auto: SLURM_ARRAY_TASK_ID={slurm} is not in the array {first}..(step {step})")
        index = (slurm - first) // step + 1
        require(index <= total, f"--shard auto: SLURM_ARRAY_TASK_ID={slurm} is task {index} of {total}")
        return Shard(index, total)
    assert k8s is not None  # neither-nor and both are refused above
    if count is None:
        raise BadInput("--shard auto: a Kubernetes Indexed Job exports JOB_COMPLETION_INDEX but not the "
                       "completion count; give --shard auto/N with N = .spec.completions")
    require(k8s < count, f"--shard auto/{count}: JOB_COMPLETION_INDEX={k8s} is not below {count}")
    return Shard(k8s + 1, count)


def shard_seed(seed: Optional[int], shard: Optional[Shard]) -> Optional[int]:
    """The Hypothesis seed of this shard: ``seed*N + I-1`` (injective in (seed, I) for a fixed N)."""
    if seed is None or shard is None:
        return seed
    return seed * shard.count + shard.index - 1


def _cell_rank(cell: Tuple[int, ...]) -> str:
    return hashlib.sha256(repr(cell).encode()).hexdigest()


def shard_cells(shard: Shard, domains: Sequence[Sequence[int]]) -> Tuple[Tuple[Tuple[int, ...], ...], int]:
    """The cells (value tuples over a contract's ``shard_fields``) of ``shard``, simplest first, and the number
    of cells.

    ``domains[i]`` are the values the ``i``-th field can take, simplest first. Cells are ordered
    by a hash and dealt round-robin, so shard sizes differ by at most one and no shard is stuck with
    one page size or one topk; within a shard they are sorted simplest first (the shrink target).
    """
    grid = list(itertools.product(*domains))
    require(grid, "shard: the config space is empty")
    dealt = sorted(grid, key=_cell_rank)
    if len(dealt) >= shard.count:
        mine = dealt[shard.index - 1::shard.count]
    else:  # fewer cells than shards: shards share cells and differ by seed only
        mine = [dealt[(shard.index - 1) % len(dealt)]]
    position = {cell: tuple(d.index(v) for d, v in zip(domains, cell)) for cell in mine}
    mine.sort(key=lambda cell: (sum(position[cell]), position[cell]))
    return tuple(mine), len(grid)


def shard_draws(shard: Shard, build: Callable[..., Any], fields: Dict[str, Sequence[Any]], contract: str = "?"
                ) -> Tuple[st.SearchStrategy[Any], dict[str, Any]]:
    """A strategy drawing only from ``shard``'s config cells, and a description of the part.

    ``fields`` (the contract's ``shard_fields``) maps each field a shard deals out to the values it takes,
    simplest first (a pinned field: its one value); ``build(**cell)`` returns the contract's unsharded draws
    with the cell's fields pinned. One draw picks a cell; everything else is drawn by the contract's strategy
    itself, so sharding adds no rejection and no second definition of it. Cells are dealt before anything
    else, so the partition is the same on every host; a cell whose smallest config exceeds this host's memory
    budget (``build`` says ``BadInput``) is then left out here and counted.
    """
    require(fields, f"--shard: contract {contract} has no config cells to deal out (it takes no --shard)")
    names = tuple(fields)
    cells, total = shard_cells(shard, [tuple(fields[name]) for name in names])
    strategies, unfit = {}, 0
    for cell in cells:  # built now: BadInput here, not inside Hypothesis; cached for the draws
        try:
            strategies[cell] = build(**dict(zip(names, cell)))
        except BadInput:
            unfit += 1
    require(strategies, f"--shard {shard}: none of its {len(cells)} config cell(s) fits this run's limits "
                        f"(e.g. {dict(zip(names, cells[0]))}: {_why(build, dict(zip(names, cells[0])))})")
    usable = tuple(cell for cell in cells if cell in strategies)
    index = st.integers(0, len(usable) - 1)

    @st.composite
    def sharded(draw: st.DrawFn) -> Any:
        return draw(strategies[usable[draw(index)]])

    info = {"shard": str(shard), "cells": len(usable), "of_cells": total, "unfit_cells": unfit,
            "partition": "configs and seeds" if total >= shard.count else "seeds only (fewer cells than shards)"}
    return sharded(), info


def _why(build: Callable[..., Any], cell: dict[str, Any]) -> str:
    try:
        build(**cell)
    except BadInput as exc:
        return str(exc)
    return "?"


# -- database URL -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DatabaseSpec:
    """A parsed ``--database`` value. ``display`` is safe to print and record (no password)."""

    kind: str  # "none" | "directory" | "redis"
    display: str
    what: str = "--database"  # where the value came from, for messages (a flag or an environment variable)
    path: Optional[Path] = None
    host: str = ""
    port: int = REDIS_DEFAULT_PORT
    db: int = 0
    password: Optional[str] = None


def parse_database(text: str, what: str = "--database") -> DatabaseSpec:
    """``none``, ``redis://[:PASSWORD@]HOST[:PORT][/DB]`` or a directory path; ``BadInput`` if malformed.
    ``what`` names the source in messages."""
    require(isinstance(text, str) and text.strip(),
            f"{what}: empty value (use none, a directory or redis://HOST:PORT/DB)")
    if text.strip().lower() == "none":
        return DatabaseSpec("none", "none", what)
    if "://" not in text:
        path = Path(text)
        require(not path.exists() or path.is_dir(), f"{what} {text}: exists and is not a directory")
        return DatabaseSpec("directory", str(path), what, path=path)
    where = f"{what} {redact_word(text)}"
    # The userinfo ends at the last "@": split it off first, so a password holding "/" or "#" (not
    # percent-encoded) is still a password, never part of the host or the path.
    scheme, _, rest = text.partition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    try:
        parts = urlsplit(f"{scheme}://{hostpart}")
        port = parts.port
    except ValueError as exc:
        reason = "the port must be an integer in 0..65535" if "port" in str(exc).lower() else exc
        raise BadInput(f"{where}: {reason}") from None
    require(parts.scheme == "redis",
            f"{where}: unsupported scheme {parts.scheme!r}; use none, a directory or redis://HOST:PORT/DB")
    require(not parts.query and not parts.fragment, f"{where}: unexpected ?query or #fragment")
    host = parts.hostname
    if not host:
        raise BadInput(f"{where}: no host (expected redis://HOST:PORT/DB)")
    database = parts.path.strip("/")
    require(database == "" or database.isdigit(), f"{where}: the database must be a number, got {database!r}")
    username, _, password = userinfo.partition(":")
    require(username == "", f"{where}: Redis URLs take a password only (the password goes before the @ after a colon, "
                            "or in KVFENCE_REDIS_PASSWORD)")
    port = REDIS_DEFAULT_PORT if port is None else port
    require(1 <= port <= 65535, f"{where}: port {port} out of range")
    db = int(database) if database else 0
    display = f"redis://{host}:{port}/{db}"
    # KVFENCE_REDIS_PASSWORD keeps the password off the command line (docs/security.md, "Secrets").
    secret = unquote(password) if at and password else os.environ.get(REDIS_PASSWORD_ENV) or None
    return DatabaseSpec("redis", display, what, host=host, port=port, db=db, password=secret)


def default_database(out_dir: Union[str, Path]) -> str:
    """``--database`` when none is given: next to the run's outputs, so a re-run replays its failures."""
    return str(Path(out_dir) / DEFAULT_DIR_NAME)


def open_database(spec: DatabaseSpec) -> Optional[CampaignDatabase]:
    """The Hypothesis ``ExampleDatabase`` for ``spec`` (``None`` for ``none``), as a ``CampaignDatabase``.
    A directory is created; a Redis server is pinged first, so an unreachable one is one line and exit 2
    before any work."""
    if spec.kind == "none":
        return None
    if spec.kind == "directory":
        from hypothesis.database import DirectoryBasedExampleDatabase

        assert spec.path is not None  # a directory spec always has one (parse_database)

        try:
            spec.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"{spec.what} {spec.display}: cannot create the directory: {exc.strerror or exc}") from None
        return CampaignDatabase(DirectoryBasedExampleDatabase(str(spec.path)))
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as exc:
        raise BadInput(f"{spec.what} {spec.display}: needs the redis client ({exc}); pip install redis") from None
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No retries: a server that accepts and never answers is unreachable after
    # REDIS_TIMEOUT_S, not after the client's default retry schedule (about a minute).
    client = redis.Redis(host=spec.host, port=spec.port, db=spec.db, password=spec.password,
                         socket_connect_timeout=REDIS_TIMEOUT_S, socket_timeout=REDIS_TIMEOUT_S,
                         retry=Retry(NoBackoff(), 0))
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        raise BadInput(f"{spec.what} {spec.display}: cannot reach Redis: {type(exc).__name__}: {exc}") from None
    return CampaignDatabase(RedisExampleDatabase(client))


# -- database key -------------------------------------------------------------------------------------
def database_key(*, kernel: str, sizing: str, domain: dict[str, Any]) -> bytes:
    """The example-database key of a fuzz target: sha384 of canonical JSON of the kernel spec, the
    sizing spec, ``KEY_VERSION`` and ``domain`` (everything that changes what a choice sequence means).

    Same inputs on any host or process give the same key; a different kernel, policy or domain gives
    another, so their examples are never replayed against each other. Name a plug-in the same way on
    every host (e.g. a path relative to the checkout): the spec string is part of the key.
    """
    doc = {"kvfence_db_key": KEY_VERSION, "kernel": kernel, "sizing": sizing, "domain": domain}
    return hashlib.sha384(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).digest()


def apply_database_key(test: Any, inner: Any, key: bytes) -> None:
    """Make Hypothesis store ``test``'s examples under ``key``.

    ``test`` is what ``@given`` returned and ``inner`` the function it wraps. Hypothesis (checked on
    6.170) reads ``test._hypothesis_internal_database_key`` when set (``hypothesis.find`` uses it) and
    otherwise digests ``inner``'s source plus ``inner._hypothesis_internal_add_digest``. Both are set:
    the explicit key keeps stored examples valid across edits to kvfence's own fuzz loop, and the
    digest still separates targets should a Hypothesis release stop reading the explicit key.
    """
    inner._hypothesis_internal_add_digest = key
    test._hypothesis_internal_database_key = key


def stored_failures(database: Optional[ExampleDatabase], key: bytes) -> int:
    """How many minimal failing examples the database holds under ``key`` (Hypothesis replays these first)."""
    if database is None:
        return 0
    return sum(1 for _ in database.fetch(key))


def summary_block(spec: DatabaseSpec, key: Optional[bytes], shard_info: Optional[dict[str, Any]],
                  hypothesis_seed: Optional[int],
                  stored: int) -> dict[str, Any]:
    """What ``summary.json`` records about the campaign: where examples live, under which key, the shard."""
    return {"host": platform.node(), "database": spec.display, "database_key": key.hex()[:24] if key else None,
            "stored_failures_at_start": stored, "shard": shard_info, "hypothesis_seed": hypothesis_seed}


# -- pytest -------------------------------------------------------------------------------------------
#: Sub-key suffix under which Hypothesis keeps the target phase's pareto front (engine ``pareto_key``).
PARETO_SUFFIX = b".pareto"


class CampaignDatabase(ExampleDatabase):
    """``inner`` with every key under ``prefix``, minus Hypothesis's pareto-front entries.

    The pareto front is one run's targeting state (the best need/width examples), re-saved on many
    examples while the target phase runs. Only failures (Hypothesis's primary and secondary corpora)
    need to travel between runs and hosts, so pareto saves are dropped (no database write per pareto
    update, no per-run state in a shared Redis) and pareto fetches come back empty.
    """

    def __init__(self, inner: ExampleDatabase, prefix: bytes = b"") -> None:
        super().__init__()
        self.inner, self.prefix = inner, prefix

    def __repr__(self) -> str:
        return f"CampaignDatabase({self.inner!r}, prefix={self.prefix!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CampaignDatabase) and (self.inner, self.prefix) == (other.inner, other.prefix)

    def __hash__(self) -> int:
        return hash(self.prefix)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return iter(()) if key.endswith(PARETO_SUFFIX) else self.inner.fetch(self.prefix + key)

    def save(self, key: bytes, value: bytes) -> None:
        if not key.endswith(PARETO_SUFFIX):
            self.inner.save(self.prefix + key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        if not key.endswith(PARETO_SUFFIX):
            self.inner.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        if src.endswith(PARETO_SUFFIX) or dest.endswith(PARETO_SUFFIX):
            return
        self.inner.move(self.prefix + src, self.prefix + dest, value)


def pytest_database(text: str, *, kernel: str, sizing: str) -> Optional[CampaignDatabase]:
    """The database the property tests use under ``KVFENCE_DATABASE`` (same syntax as ``--database``).

    Hypothesis keys each test by its source; the prefix adds the session's ``--kernel`` and
    ``--sizing``, so sessions on different targets keep separate examples in one shared database.
    """
    database = open_database(parse_database(text, "KVFENCE_DATABASE"))
    if database is None:
        return None
    prefix = hashlib.sha256(f"kvfence-pytest:{KEY_VERSION}:{kernel}:{sizing}".encode()).hexdigest()[:16]
    return CampaignDatabase(database.inner, prefix.encode() + b":")
