"""``kvfence check-contract NAME``: is a contract record well formed? (docs/contract-api.md)

Statically (its data and methods, as every load checks them) and on a few drawn cases, in a throwaway process
(``kvfence.engine.record_probe``): the JSON round trip, every sizing's width (an integer, 0 included), the need,
the tables and their shapes, the oracle's keys against the tables, the keys, the findings decided before a
launch, the reference and planted kernels resolving, and the reference kernel clean under ``safe`` on the drawn
cases. Each problem is one line naming the record; any problem is exit 2. ``--list`` names the registered
contracts.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List

from kvfence.cli.common import _exit_codes, _non_negative_int, _positive_int, _stderr
from kvfence.contract import Contract
from kvfence.errors import EXIT_BAD_INPUT, EXIT_CLEAN, BadInput, printable


def contracts_of(args) -> list:
    """The contract checked: a plug-in's static and drawn checks both run behind the boundary
    (kvfence.engine.boundary)."""
    return [args.name] if args.name is not None and not args.list else []


def cmd_check_contract(args) -> int:
    from kvfence.contract import MEMBERS
    from kvfence.engine import registry
    from kvfence.engine.record_probe import check_contract

    if args.list:
        for name in registry.names():
            print(f"{name}  ({'kvfence' if registry.builtin(name) else registry.entry(name)})")
        return EXIT_CLEAN
    if args.name is None:
        _stderr("kvfence check-contract: name a contract (--list names them)")
        return EXIT_BAD_INPUT
    record = registry.get(args.name)  # static checks: a malformed record is one line, exit 2
    pins = _pins(record, args.pin)
    answer = check_contract(record, examples=args.examples, seed=args.seed, pins=pins)
    for problem in answer["problems"]:
        _stderr(f"kvfence: error: contract {record.name!r}: {problem}")
    if answer["problems"]:
        return EXIT_BAD_INPUT
    own = [m for m in MEMBERS if callable(getattr(Contract, m, None)) and getattr(type(record), m) is not
           getattr(Contract, m)]
    print(f"kvfence check-contract {record.name}: well formed: {answer['cases']} drawn cases answered by every "
          f"method, the reference clean under 'safe' on {answer['launches']} launches, {len(record.mutants)} "
          f"planted bug(s) resolve; it defines {', '.join(own)}")
    return EXIT_CLEAN


def _pins(record: Contract[Any], texts: List[str]) -> Dict[str, object]:
    """``--pin NAME=VALUE``s: NAME one of the record's declared options (``Contract.options``), VALUE one it takes
    (``Option.parse``), by the draw field each pins."""
    pins: Dict[str, object] = {}
    names = ", ".join(o.name for o in record.options) or "none"
    for text in texts:
        key, sep, value = text.partition("=")
        option = next((o for o in record.options if o.name == key), None)
        if not sep or option is None:
            raise BadInput(f"--pin {printable(text, 60)!r}: expected NAME=VALUE with NAME one of contract "
                           f"{record.name}'s options ({names})")
        try:
            pins[option.key] = option.parse(value)
        except BadInput as exc:
            raise BadInput(f"--pin {printable(text, 60)!r}: {exc}") from None
    return pins


def add_parser(sub) -> None:
    cc = sub.add_parser("check-contract", help="is a contract record well formed? (statically and on drawn cases)",
                        description=str(sys.modules[__name__].__doc__).split("\n\n", 1)[1],
                        epilog=_exit_codes(zero="well formed", one=None,
                                           two="a record mistake (one line each), or an unknown contract"))
    cc.add_argument("name", nargs="?", default=None, help="a registered contract (entry point kvfence.contracts)")
    cc.add_argument("--list", action="store_true", help="name the registered contracts and exit")
    cc.add_argument("--examples", type=_positive_int, default=20, help="cases drawn and asked about")
    cc.add_argument("--seed", type=_non_negative_int, default=0, help="Hypothesis seed of the draws")
    cc.add_argument("--pin", action="append", default=[], metavar="NAME=VALUE",
                    help="pin one of the contract's declared options (Contract.options) for the draws "
                         "(window-rail: --pin window=4); repeatable")
    cc.set_defaults(func=cmd_check_contract)
