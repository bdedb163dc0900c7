"""Kill time of the table contracts' planted bugs: ``benchmarks/plain_fuzz_mutants.py`` over their mutants.

    python benchmarks/table_kill_time.py [--device cuda] [--seeds 10] [--only CONTRACT.NAME ...] [--parallel N]
        [--gpus 0,0,...] [--reference-seeds K] [--max-seconds S] [--run-timeout S] [--json FILE]
        [--resume FILE] [-- EXTRA FUZZ FLAGS]

The same plan, runs, results file and verdict as ``plain_fuzz_mutants.py`` (read its docstring: one plain
``kvfence fuzz --contract C --kernel mutant:NAME --device D --seed S --shrink-seconds 0`` per mutant and seed,
the search time from the worker's start to the first failure, median and worst per mutant against the kill
targets), for the mutants of the table contracts (``CONTRACTS``: kvfence's own text and the release text of
``kvfence.contracts.page_table.release_mutants``, whose wheels the command's environment must reach:
``KVFENCE_WHEEL_DIR`` holding sglang 0.5.23 and 0.5.3.post3, or a ``KVFENCE_CACHE`` filled by one resolving run
where the network is, as ``kvfence mutants --contract C --max-examples 1`` does). A row is ``CONTRACT.NAME``:
mutant names repeat across the contracts. On the CPU the scale mutants (``domain="gpu"``, which the CPU domain
never reaches) are left out unless named with ``--only``.

On the CPU with tiny settings (what ``tests/test_table_kill_time.py`` runs):

    python benchmarks/table_kill_time.py --device cpu --seeds 1 --reference-seeds 1 \\
        --only trtllm-mha-page-table.one_page_more --json OUT.json -- --max-examples 20
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plain_fuzz_mutants as base  # noqa: E402

from kvfence.engine import registry  # noqa: E402
from kvfence.errors import require  # noqa: E402

#: The table contracts (each command names its own with ``--contract``).
CONTRACTS = ("flashmla-page-table", "trtllm-mha-page-table", "fa3-decode-metadata")


def discover(names: Optional[List[str]] = None) -> List[base.Planted]:
    """The planted bugs of ``CONTRACTS`` as rows ``CONTRACT.NAME`` (sorted), or only ``names``; on the CPU without
    ``names``, the CPU-domain ones only."""
    found = {}
    for contract in CONTRACTS:
        for m in registry.get(contract).mutants:
            found[f"{contract}.{m.name}"] = base.Planted(
                f"{contract}.{m.name}", contract, m.domain, tuple(m.detects),
                f"mutant:{m.name}" if (m.patch or m.kernel) else base.REFERENCE, m.sizing)
    unknown = [n for n in names or () if n not in found]
    require(not unknown, f"unknown mutant(s) {', '.join(unknown)}: choose from {', '.join(sorted(found))}")
    if names:
        return [found[n] for n in names]
    cpu = "cpu" in sys.argv[sys.argv.index("--device") + 1:][:1] if "--device" in sys.argv else False
    return [found[n] for n in sorted(found) if not (cpu and found[n].domain == "gpu")]


base.CONTRACTS = CONTRACTS
base.CONTRACT_FLAGS = {c: ["--contract", c] for c in CONTRACTS}
base.discover = discover

if __name__ == "__main__":
    sys.exit(base.main())
