"""The shards of a campaign: from ``fuzz``'s flags and ``--shards N``, or from a plan file of many targets.

A **target** is one set of ``fuzz`` flags (contract, kernel, sizing, config pins, budget, ...); ``--shards N`` (or
a target's ``"shards"``) splits it into ``N`` shards, shard ``I`` running ``fuzz ... --shard I/N --seed S`` (the
config cells and the Hypothesis seed ``S*N + I-1`` that ``--shard`` deals: ``kvfence.engine.campaign``). Every
shard gets the campaign's example database, ``--quiet`` and ``--jobs 1`` unless its target says otherwise.

A plan file is JSON data (never code)::

    {"defaults": {"device": "cuda", "max-seconds": 600, "no-target": true},
     "targets": [{"contract": "CONTRACT", "sizing": "SIZING", "shards": 4},
                 {"contract": "OTHER", "kernel": "KERNEL SPEC", "shards": 2}]}

(a worked plan file, with kvfence's own contracts, is in docs/campaigns.md.)

Keys are ``fuzz`` flags without the dashes (``max-seconds`` or ``max_seconds``); ``true`` is a switch, ``false`` or
``null`` leaves a flag out. A target's keys override ``defaults``, which override the command line's flags.
Every target is parsed by ``fuzz``'s own parser before anything runs: a bad one is one line naming it, exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from kvfence.errors import BadInput, require

#: Flags a campaign sets on each shard itself (a plan or a flag may not).
OWN_FLAGS = ("out", "shard", "json", "plan", "resume", "quiet")
#: Seconds a shard may take beyond its time budget (--max-seconds + --shrink-seconds): start-up, the first
#: compile, writing its outputs. Without a time budget a shard's timeout is ``DEFAULT_SHARD_TIMEOUT_S``.
SHARD_STARTUP_S = 300.0
DEFAULT_SHARD_TIMEOUT_S = 6 * 3600.0


@dataclass(frozen=True)
class ShardSpec:
    """One shard: ``fuzz`` flags (``argv``, no ``--out``), where it sits in the campaign, its timeout and GPUs."""

    target: int  # 1-based, in the plan's order
    index: int  # 1-based shard of ``count``
    count: int
    seed: int
    argv: Tuple[str, ...]
    label: str
    timeout_s: float
    gpus: float

    @property
    def name(self) -> str:
        """Its folder under ``OUT/shards/``."""
        return f"t{self.target}-s{self.index}-of-{self.count}"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ShardSpec":
        return cls(**dict(data, argv=tuple(data["argv"])))


def flag_argv(values: Dict[str, object]) -> List[str]:
    """``{"max-seconds": 60, "no-target": True, "topk": None}`` as ``fuzz`` arguments."""
    argv: List[str] = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def _target_values(doc: object, where: str) -> Dict[str, object]:
    if not isinstance(doc, dict):
        raise BadInput(f"{where}: expected a JSON object of fuzz flags")
    out: Dict[str, object] = {}
    for key, value in doc.items():
        require(isinstance(key, str) and key.strip(), f"{where}: a flag name must be a non-empty string")
        name = key.strip().lstrip("-").replace("_", "-")
        require(name.replace("-", "_") not in OWN_FLAGS,
                f"{where}: {name!r} is set by the campaign for each shard; leave it out")
        require(value is None or isinstance(value, (bool, int, float, str)),
                f"{where}: {name!r} must be a string, a number, true, false or null")
        out[name] = value
    return out


def read_plan(path: str) -> List[Dict[str, object]]:
    """The targets of a plan file (``defaults`` applied), each a dict of ``fuzz`` flags plus ``shards``."""
    file = Path(path)
    require(file.is_file(), f"--plan-file {path}: no such file")
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"--plan-file {path}: not a JSON file ({' '.join(str(exc).split())[:160]})") from None
    require(isinstance(doc, dict) and isinstance(doc.get("targets"), list) and doc["targets"],
            f"--plan-file {path}: expected {{\"targets\": [...]}} with at least one target (an object of fuzz flags)")
    unknown = sorted(set(doc) - {"defaults", "targets", "comment"})
    require(not unknown, f"--plan-file {path}: unknown top-level key(s) {', '.join(unknown)} (defaults, targets)")
    defaults = _target_values(doc.get("defaults", {}), f"--plan-file {path}: defaults")
    return [dict(defaults, **_target_values(t, f"--plan-file {path}: target {i}"))
            for i, t in enumerate(doc["targets"], 1)]


def _shard_count(values: Dict[str, object], default: int, where: str) -> int:
    count = values.pop("shards", default)
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
        raise BadInput(f"{where}: shards must be a positive integer, got {count!r}")
    return count


def shard_timeout(parsed, given: Optional[float]) -> float:
    """``--shard-timeout``, or the shard's time budget plus ``SHARD_STARTUP_S``, or ``DEFAULT_SHARD_TIMEOUT_S``."""
    if given is not None:
        return given
    if parsed.max_seconds is not None:
        return parsed.max_seconds + parsed.shrink_seconds + SHARD_STARTUP_S
    return DEFAULT_SHARD_TIMEOUT_S


def _label(parsed) -> str:
    return f"{parsed.contract} kernel {parsed.kernel} sizing {parsed.sizing}"


def build_shards(targets: Sequence[Dict[str, object]], *, default_shards: int, seed: int, database: str,
                 parse: Callable[[List[str]], argparse.Namespace], timeout: Optional[float], gpus: float,
                 planned: bool = True) -> List[ShardSpec]:
    """Every shard of every target. ``parse(argv)`` is ``fuzz``'s parser (a bad flag: ``BadInput``, one line,
    naming the target when they come from a plan: ``planned``); a target's own ``seed`` and ``database`` win over
    the campaign's."""
    require(math.isfinite(gpus) and gpus >= 0, f"--gpus-per-shard {gpus:g}: expected a number >= 0")
    specs: List[ShardSpec] = []
    for t, values in enumerate(targets, 1):
        where = f"target {t}" if planned else "campaign"
        values = dict(values)
        count = _shard_count(values, default_shards, where)
        values.setdefault("seed", seed)
        values.setdefault("database", database)
        values.setdefault("jobs", 1)
        base = flag_argv(values)
        try:
            parsed = parse(base)
        except BadInput as exc:
            raise BadInput(f"{where}: {exc}") from None
        for i in range(1, count + 1):
            argv = tuple(base + ["--shard", f"{i}/{count}", "--quiet"])
            specs.append(ShardSpec(t, i, count, int(parsed.seed), argv, _label(parsed),
                                   shard_timeout(parsed, timeout), gpus))
    return specs
