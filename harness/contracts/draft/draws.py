"""What a run of the draft kernel or the window rail draws (``DraftContract.cases``): ``strategies`` with the run's
pins, checked against the kernel first.

A run's domain (``kvfence.contract.Domain``) gives the space (``cpu`` or ``gpu``, ``domain``), the pinned config
flags, the kernel (which §6 parameters it takes decides whether the §6 fields are drawn), the sizing, mode and
layout and the memory one config may take (draws are shrunk to fit), and how many batches of one config an
example holds (``case_runs``, and the bulk). Everything that cannot work is one line before any draw: the rail
a pinned §6 field the kernel does not declare, ``--family on`` for a classic-ABI kernel, a
sizing that fails on the smallest config the pins allow.
"""

from __future__ import annotations

from kvfence.contracts.draft.case import Config, DraftCase
from kvfence.contracts.draft.domain import domain_named
from kvfence.contracts.draft.sizing import WINDOW_POLICIES
from kvfence.errors import require


def family_pins(domain) -> dict:
    """The §6 fields the run pins (None: drawn)."""
    translate = domain.pin("translate")
    return dict(window_size=domain.pin("window"), sink_size=domain.pin("sink"),
                entry_page_size=domain.pin("entry_page_size"),
                translate=None if translate is None else translate in (True, "on"))


def family_draws(domain):
    """``strategies.configs(family=...)``: False when the kernel does not take the §6 fields or ``family`` is
    pinned off, True when pinned on (every example), ``"auto"`` otherwise (the domain's share of examples)."""
    from kvfence.contracts.draft.targets import kernel_capabilities

    family = domain.pin("family", "auto")
    if family == "off" or not kernel_capabilities(domain.kernel).family:
        return False
    return True if family == "on" else "auto"


def family_share(domain) -> float:
    """The share of examples that draw the §6 fields: the domain's own share under ``auto``, else 0 or 1."""
    family = family_draws(domain)
    return domain_named(domain.name).family_share if family == "auto" else float(family)


def check(record, domain) -> None:
    """The pins against the kernel and the sizing (one line, exit 2), before anything is drawn."""
    from kvfence.contracts.draft.targets import kernel_capabilities

    family = family_pins(domain)
    caps = kernel_capabilities(domain.kernel)
    rail = record.name == "window-rail"  # its window is drawn (>= 1) unless pinned
    probe = Config(topk=1, num_steps=1, window_size=family["window_size"] or int(rail),
                   sink_size=family["sink_size"] or 0, entry_page_size=family["entry_page_size"] or 1,
                   translate=bool(family["translate"]), contract=record.name)
    caps.check_config(domain.kernel, probe)
    require(domain.pin("family", "auto") != "on" or caps.family,
            f"--family on: kernel {domain.kernel!r} does not take the §6 parameters (a classic-ABI kernel)")
    window = domain.pin("window")
    Config(topk=domain.pin("topk", 1), num_steps=domain.pin("num_steps", 1), page_size=domain.pin("page_size", 1),
           ctx=domain.pin("ctx", domain.pin("num_steps", 1) + 1), max_bs=domain.pin("max_bs", 1), sizing=domain.sizing,
           layout=domain.layout, mode=domain.mode,
           window_size=window if window is not None else int(domain.sizing in WINDOW_POLICIES or rail),
           sink_size=domain.pin("sink", 0), contract=record.name).row_width(1)


def configs(record, domain):
    """The config strategy of the run (``strategies.configs`` with its pins)."""
    from kvfence.contracts.draft.strategies import configs as config_strategy

    pin = domain.pin
    return config_strategy(topk=pin("topk"), num_steps=pin("num_steps"), page_size=pin("page_size"), ctx=pin("ctx"),
                           max_bs=pin("max_bs"), sizing=domain.sizing, layout=domain.layout, mode=domain.mode,
                           domain=domain_named(domain.name), max_bytes=domain.max_bytes,
                           family=family_draws(domain), contract=record.name, **family_pins(domain))


def _as_case(runtime) -> DraftCase:
    return DraftCase.of(runtime)


def _as_cases(run):
    """A ``strategies.CaseRun`` (or list) of runner cases as the contract's cases, its bulk bookkeeping kept."""
    from kvfence.contracts.draft.strategies import CaseRun

    cases = [DraftCase.of(c) for c in run]
    if not isinstance(run, CaseRun):
        return cases
    out = CaseRun(cases)
    out.bulk_start, out.bulk_choices, out.prefix = run.bulk_start, run.bulk_choices, run.prefix
    return out


def draws(record, domain):
    """The run's strategy: a ``DraftCase`` per example, or a list of them of one config (``batches > 1`` or the
    bulk)."""
    from kvfence.contracts.draft.strategies import case_runs, cases

    check(record, domain)
    config_strategy = configs(record, domain)
    seq_len_limit = domain.pin("seq_len_limit", "ctx")
    if domain.batches > 1 or domain.bulk:
        strategy = case_runs(config_strategy, kernel=domain.kernel, seq_len_limit=seq_len_limit,
                             max_batches=domain.batches, bulk=domain.bulk, bulk_after=domain.bulk_after).map(_as_cases)
    else:
        strategy = cases(config_strategy, kernel=domain.kernel, seq_len_limit=seq_len_limit).map(_as_case)
    strategy.validate()
    return strategy
