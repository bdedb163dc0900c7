"""A run's pipeline from its plan (``kvfence.engine.plan.RunPlan``), the same for every front end and contract.

``kvfence fuzz`` (``kvfence.cli.fuzz``), ``kvfence.check_kernel`` (``kvfence.engine.api``) and the pytest plugin
build a plan and take these pieces from here, so a run's draws, its checker, its example database key and what
its summary says of it are assembled once:

* ``record(plan)``: the contract's record, the plan checked against it (one line, exit 2, before any work);
* ``draws(plan, shard)``: the contract's cases on the plan's domain, bound into launches (``kvfence.engine.launch``),
  cut to one shard of its config cells when asked;
* ``checker(plan)``: a checking worker for the contract (a kernel that dies or hangs is its case's finding), or
  with ``plan.isolate`` off, the checker itself in this process;
* ``database_key(plan, shard)``: the example database's key for this contract, kernel, sizing and domain;
* ``run_record(plan)``: the run's choices as the summary records them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from kvfence.contract import Contract, Launch, option_named
from kvfence.engine import registry
from kvfence.engine.kernels import check_spec
from kvfence.engine.launch import bind, sizing_policy
from kvfence.engine.plan import RunPlan
from kvfence.errors import require

if TYPE_CHECKING:  # annotations only: the campaign module is imported when a run shards
    from kvfence.engine.campaign import Shard


def record(plan: RunPlan) -> Contract[Any]:
    """The contract's record, with ``plan`` checked against it (``BadInput``, one line, before any work): every
    pinned flag one the contract takes, a sizing it knows, a kernel spec of the right shape."""
    found = registry.get(plan.contract)
    check_pins(found, plan.pins)
    sizing_policy(found, plan.sizing)
    check_spec(plan.kernel, record=found)
    return found


def check_pins(found: Contract[Any], pins: Mapping[str, object]) -> None:
    """Every pinned field one the contract declares an option for (``Contract.options``), its value one the option
    takes: ``BadInput``, one line naming the flag, otherwise."""
    unknown = sorted(k for k, v in pins.items() if v is not None and option_named(found, k) is None)
    require(not unknown, f"--contract {found.name} takes no {', '.join('--' + k.replace('_', '-') for k in unknown)}"
                         f" (its options: {', '.join(o.flag for o in found.options) or 'none'})")
    for key, value in pins.items():
        option = option_named(found, key)
        if value is not None and option is not None:
            option.check(value)


def probe_plugins(plan: RunPlan) -> None:
    """Import the plan's plug-ins (kernel, sizing) in a throwaway process first, so that an import that exits,
    aborts or raises ``KeyboardInterrupt`` is one line naming it, never the end of this process."""
    from kvfence.engine.probe import check_plugins

    check_plugins(registry.get(plan.contract), {"kernel": plan.kernel, "sizing": plan.sizing})


class BoundRun(list[Any]):
    """The launches of one example that drew several cases of one config, with the drawn list's bulk
    bookkeeping (``bulk_start``, ``splice``) read through: the fuzz loop splices a bulk failure by it."""

    def __init__(self, launches: List[Launch[Any]], drawn: Any) -> None:
        super().__init__(launches)
        self.drawn = drawn

    @property
    def bulk_start(self) -> int:
        return getattr(self.drawn, "bulk_start", len(self))

    def splice(self, index: int) -> Optional[tuple[Any, ...]]:
        splice = getattr(self.drawn, "splice", None)
        return splice(index) if splice is not None else None


def binder(found: Contract[Any], plan: RunPlan) -> Callable[[Any], Any]:
    """``drawn -> launches``: a drawn case (or list of them) bound to the plan's sizing, kernel, mode, layout."""
    def bind_one(case: Any) -> Launch[Any]:
        return bind(found, case, plan.sizing, plan.kernel, plan.mode, plan.layout)

    def bind_drawn(drawn: Any) -> Union[BoundRun, Launch[Any]]:
        if isinstance(drawn, list):
            return BoundRun([bind_one(c) for c in drawn], drawn)
        return bind_one(drawn)

    return bind_drawn


def draws(plan: RunPlan, shard: Optional[Shard] = None) -> Tuple[Any, Optional[dict[str, Any]]]:
    """``(strategy, shard description)``: the contract's launches for ``plan``, or with ``shard`` (``--shard I/N``)
    only its part of the contract's config cells (``kvfence.engine.campaign.shard_draws``: the options the
    contract deals out, each over its values on the plan's domain)."""
    found = record(plan)
    if shard is None:
        return found.cases(plan.draw_domain()).map(binder(found, plan)), None
    from kvfence.engine.campaign import shard_draws

    def build(**cell: Any) -> Any:
        cut = plan.with_(pins={**plan.pins, **cell})
        return found.cases(cut.draw_domain()).map(binder(found, cut))

    return shard_draws(shard, build, shard_fields(found, plan), found.name)


def shard_fields(found: Contract[Any], plan: RunPlan) -> Dict[str, Sequence[Any]]:
    """The options a ``--shard`` deals out, each with its values on the plan's domain (a pinned one: its value)."""
    return {o.key: (plan.pins[o.key],) if plan.pins.get(o.key) is not None else tuple(o.shard(plan.domain))
            for o in found.options if o.shard is not None}


def checker(plan: RunPlan, *, background: bool = False) -> Any:  # a Checker, or a RemoteSession of the worker
    """Where the plan's cases are checked: a worker process (``kvfence.engine.supervisor.RemoteSession``; with
    ``background`` it starts while the caller builds its strategies, joined by ``wait_ready()``), or the
    contract's checker in this process when ``plan.isolate`` is off (debugging: a crash ends the run)."""
    found = record(plan)
    if not plan.isolate:
        from kvfence.engine.checking import checker_for

        return checker_for(found, plan)
    from kvfence.engine.supervisor import RemoteSession
    from kvfence.engine.workers import crash_spares

    return RemoteSession(plan, spares_crashing=crash_spares(plan.device, plan.host_jobs), background=background)


def database_key(plan: RunPlan, shard: Optional[Shard] = None) -> bytes:

    """The example database's key: everything that changes what a drawn choice sequence means."""
    from kvfence.engine.campaign import database_key as key

    domain = {"contract": plan.contract, "mode": plan.mode, "layout": plan.layout, "domain": plan.domain,
              "pins": {k: v for k, v in sorted(plan.pins.items()) if v is not None},
              "shard": str(shard) if shard is not None else None, "batches_per_example": plan.batches_per_example}
    if plan.bulk_per_example:
        domain["bulk_per_example"] = plan.bulk_per_example
    return key(kernel=plan.kernel, sizing=plan.sizing, domain=domain)


def run_record(plan: RunPlan, seed: int, seed_source: str) -> dict[str, Any]:
    """The run's choices as summary.json records them."""
    return {"device": plan.device, "contract": plan.contract, "kernel": plan.kernel, "sizing": plan.sizing,
            "mode": plan.mode, "layout": plan.layout, "seed": seed, "seed_source": seed_source, "jobs": plan.jobs,
            "batches_per_example": plan.batches_per_example, "bulk_per_example": plan.bulk_per_example,
            "bulk_after_s": plan.bulk_after, "domain": plan.domain, "pins": {k: v for k, v in plan.pins.items()
                                                                            if v is not None},
            "max_gpu_mem": plan.max_bytes, "checking": "worker" if plan.isolate else "in-process"}
