"""``RunPlan``: the choices of one fuzz run, built once by its front end and read by everything after it.

Three front ends build one: the command line (``kvfence fuzz``, ``kvfence.cli.fuzz``), the API
(``kvfence.check_kernel``) and the pytest plugin. From there the engine (``kvfence.engine.run``), the
contract's record (``kvfence.contract.Contract.cases`` through ``kvfence.engine.run.draws``,
``Contract.checker``), the checking worker and the ``--jobs`` children read the plan, never the front end's own
arguments. Every field is validated here, with a one-line ``BadInput``.

``pins`` holds the contract-specific config choices (the draft kernel's ``topk``, ``num_steps``, window
fields, layout, ...), ``None`` meaning "drawn"; a contract takes the pins it lists (``Contract.options``) and
refuses the others.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Mapping, Optional

from kvfence.contract import DOMAINS, LAYOUTS, MODES, Domain
from kvfence.engine.registry import default_name
from kvfence.errors import BadInput, require

DEVICES = ("cpu", "cuda")


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _seconds(v: object, *, positive: bool) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and (v > 0 if positive else v >= 0))


@dataclass(frozen=True)
class RunPlan:
    """What one run checks (contract, kernel, sizing, device, mode, domain, pins), how long (examples, seconds,
    shrinking), how (batches per example, bulk, memory, jobs, targeting, keep-going) and where cases run
    (a checking worker with a case timeout, or this process)."""

    contract: str = field(default_factory=lambda: default_name())
    kernel: str = "reference"
    sizing: str = "safe"
    device: str = "cpu"
    mode: str = "graph"
    layout: str = "redzone"
    domain: str = "cpu"
    pins: Mapping[str, object] = field(default_factory=dict)
    seed: Optional[int] = None
    max_examples: int = 100
    max_seconds: Optional[float] = None
    shrink_seconds: float = 60.0
    batches_per_example: int = 1
    bulk_per_example: int = 0
    bulk_after: float = 0.0
    max_bytes: Optional[int] = None
    jobs: int = 1
    #: Fuzzing processes of this run on this host (a ``--jobs`` child's siblings counted): its share of the cores.
    host_jobs: int = 1
    targeting: bool = True
    keep_going: bool = False
    isolate: bool = True
    case_timeout: float = 5.0
    audit: Optional[bool] = None
    #: False (``--no-absorb``): a write past the last row leaves the allocation (for compute-sanitizer).
    absorb: bool = True
    #: Where the run writes (cases/, summary.json, the reports), its example database (None: OUT/.hypothesis),
    #: its shard (``--shard I/N``, as given) and ``--resume`` (only collect cases left in flight by runs that died).
    out: str = "reports/out"
    database: Optional[str] = None
    shard: Optional[str] = None
    resume: bool = False

    def __post_init__(self) -> None:
        for name in ("contract", "kernel", "sizing"):
            require(isinstance(getattr(self, name), str) and getattr(self, name),
                    f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        require(self.device in DEVICES, f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        require(self.mode in MODES, f"mode must be graph or eager, got {self.mode!r}")
        require(self.layout in LAYOUTS, f"layout must be redzone or production, got {self.layout!r}")
        require(self.domain in DOMAINS, f"domain must be cpu or gpu, got {self.domain!r}")
        require(not (self.domain == "gpu" and self.device != "cuda"),
                "the gpu domain needs a CUDA device: production-sized launches under the interpreter would take hours")
        require(isinstance(self.pins, Mapping) and all(isinstance(k, str) for k in self.pins),
                "pins must map field names to values")
        object.__setattr__(self, "pins", dict(self.pins))
        require(self.seed is None or (_int(self.seed) and self.seed >= 0),
                f"seed must be an integer >= 0, got {self.seed!r}")
        require(_int(self.max_examples) and self.max_examples >= 1,
                f"max_examples must be a positive integer, got {self.max_examples!r}")
        require(self.max_seconds is None or _seconds(self.max_seconds, positive=True),
                f"max_seconds must be a positive number of seconds, got {self.max_seconds!r}")
        require(_seconds(self.shrink_seconds, positive=False),
                f"shrink_seconds must be a number of seconds >= 0, got {self.shrink_seconds!r}")
        require(_int(self.batches_per_example) and self.batches_per_example >= 1,
                f"batches_per_example must be a positive integer, got {self.batches_per_example!r}")
        require(_int(self.bulk_per_example) and self.bulk_per_example >= 0,
                f"bulk_per_example must be an integer >= 0, got {self.bulk_per_example!r}")
        require(_seconds(self.bulk_after, positive=False), f"bulk_after must be seconds >= 0, got {self.bulk_after!r}")
        require(self.max_bytes is None or (_int(self.max_bytes) and self.max_bytes > 0),
                f"max_bytes must be a positive integer, got {self.max_bytes!r}")
        require(_int(self.jobs) and self.jobs >= 1, f"jobs must be a positive integer, got {self.jobs!r}")
        require(_int(self.host_jobs) and self.host_jobs >= 1,
                f"host_jobs must be a positive integer, got {self.host_jobs!r}")
        require(_seconds(self.case_timeout, positive=True),
                f"case_timeout must be a positive number of seconds, got {self.case_timeout!r}")
        require(self.audit is None or isinstance(self.audit, bool), "audit must be true, false or null")
        require(isinstance(self.out, str) and self.out.strip(), "out must name a folder")
        for name in ("database", "shard"):
            require(getattr(self, name) is None or isinstance(getattr(self, name), str), f"{name} must be a string")
        require(not (self.resume and self.jobs > 1),
                "--resume collects crashed cases of one folder; it takes no --jobs")
        for name in ("targeting", "keep_going", "isolate", "absorb", "resume"):
            require(isinstance(getattr(self, name), bool), f"{name} must be true or false")

    @property
    def graph(self) -> bool:
        """Launches are captured in CUDA graphs (graph mode on a CUDA device)."""
        return self.mode == "graph" and self.device == "cuda"

    def pin(self, name: str, default: Any = None) -> Any:
        value = self.pins.get(name)
        return default if value is None else value

    def with_(self, **changes: Any) -> "RunPlan":
        return replace(self, **changes)

    def draw_domain(self) -> Domain:
        """What the contract's ``cases`` may depend on (``kvfence.contract.Domain``)."""
        return Domain(self.domain, dict(self.pins), self.kernel, self.sizing, self.mode, self.layout, self.max_bytes,
                      self.batches_per_example, self.bulk_per_example, self.bulk_after)

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON data: what a checking worker and a ``--jobs`` child get (``from_dict``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> "RunPlan":
        if not isinstance(data, dict):
            raise BadInput("plan: expected a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        require(not unknown, f"plan: unknown field(s) {', '.join(unknown)}")
        return cls(**data)
