"""A run's pipeline from its plan (``kvfence.engine.plan.RunPlan``), the same for every front end and contract.

``kvfence fuzz`` (``kvfence.cli.fuzz``), ``kvfence.check_kernel`` (``kvfence.engine.api``) and the
pytest plugin build a plan and take these pieces from here, so a run's draws, its checker, its example
database key and what its summary says of it are assembled once:

* ``record(plan)``: the contract's record, the plan checked against it (one line, exit 2, before any work);
* ``draws(plan, shard)``: the contract's strategy, cut to one shard of its config cells when asked;
* ``checker(plan)``: a checking worker for the contract (a kernel that dies or hangs is its case's finding),
  or with ``plan.isolate`` off, the contract's in-process session;
* ``database_key(plan, shard)``: the example database's key for this contract, kernel, sizing and domain;
* ``run_record(plan)``: the run's choices as the summary records them.
"""

from __future__ import annotations

from typing import Optional, Tuple

from kvfence import contract as contracts
from kvfence.engine.plan import RunPlan


def record(plan: RunPlan):
    """The contract's record, with ``plan`` checked against it (``BadInput``, one line, before any work)."""
    found = contracts.get(plan.contract)
    found.check_plan(plan)
    return found


def probe_plugins(plan: RunPlan) -> None:
    """Import the plan's plug-ins (kernel, sizing) in a throwaway process first, so that an import that exits,
    aborts or raises ``KeyboardInterrupt`` is one line naming it, never the end of this process."""
    from kvfence.engine.probe import check_plugins

    check_plugins(plan.contract, {"kernel": plan.kernel, "sizing": plan.sizing})


def draws(plan: RunPlan, shard=None) -> Tuple[object, Optional[dict]]:
    """``(strategy, shard description)``: the contract's draws for ``plan``, or with ``shard`` (``--shard I/N``)
    only its part of the contract's config cells (``kvfence.engine.campaign.shard_draws``)."""
    found = contracts.get(plan.contract)
    if shard is None:
        return found.draws(plan), None
    from kvfence.engine.campaign import shard_draws

    return shard_draws(shard, lambda **cell: found.draws(plan.with_(pins={**plan.pins, **cell})),
                       found.shard_fields(plan), found.name)


def checker(plan: RunPlan, *, background: bool = False):
    """Where the plan's cases are checked: a worker process (``kvfence.engine.worker.RemoteSession``; with
    ``background`` it starts while the caller builds its strategies, joined by ``wait_ready()``), or the
    contract's in-process session when ``plan.isolate`` is off (debugging: a crash ends the run)."""
    found = contracts.get(plan.contract)
    if not plan.isolate:
        return found.session(plan)
    from kvfence.engine.worker import RemoteSession, crash_spares

    return RemoteSession(plan.device, plan.kernel, contract=found, plan=plan, case_timeout=plan.case_timeout,
                         spares_crashing=crash_spares(plan.device, plan.host_jobs), background=background)


def database_key(plan: RunPlan, shard=None) -> bytes:
    from kvfence.engine.campaign import database_key as key

    return key(kernel=plan.kernel, sizing=plan.sizing, domain=contracts.get(plan.contract).database_domain(plan, shard))


def run_record(plan: RunPlan, seed: int, seed_source: str) -> dict:
    """The run's choices as summary.json records them (the contract adds its own: ``Contract.run_record``)."""
    return {"device": plan.device, "contract": plan.contract, "kernel": plan.kernel, "sizing": plan.sizing,
            "mode": plan.mode, "seed": seed, "seed_source": seed_source, "jobs": plan.jobs,
            "batches_per_example": plan.batches_per_example, "bulk_per_example": plan.bulk_per_example,
            "bulk_after_s": plan.bulk_after, "domain": plan.domain, "max_gpu_mem": plan.max_bytes,
            "checking": "worker" if plan.isolate else "in-process",
            **contracts.get(plan.contract).run_record(plan)}
