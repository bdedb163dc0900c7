"""The draft kernel's own kernels by contract: each record's reference kernel (``REFERENCE_KERNELS``, its
``Contract.reference``) and its planted bugs, the files of ``kernels/draft/mutants/`` (each file one bug, its
docstring, ``CONTRACT``, ``DETECTS`` and ``PATCH`` of the reference's text or ``KIND = "sizing"``).

The records (``kvfence.contracts.draft.record``) and the ``mutant:NAME`` kernel spec
(``kvfence.contracts.draft.targets.mutant_spec``) both read them here.
"""

from __future__ import annotations

import functools
import runpy
from pathlib import Path
from typing import Tuple

from kvfence.contract import Mutant
from kvfence.errors import require
from kvfence.kernels import KERNELS_DIR

MUTANTS_DIR = KERNELS_DIR / "draft" / "mutants"
#: Each contract's reference kernel: ``(module of kvfence.kernels.draft, function)``.
REFERENCE_KERNELS = {"draft": ("draft_kv_indices", "generate_draft_decode_kv_indices"),
                     "window-rail": ("window_kv_indices", "generate_draft_decode_window_kv_indices")}


def kernel_spec(module: str, attr: str) -> str:
    """``module:attr`` of the function ``attr`` of ``kvfence.kernels.draft.<module>``."""
    return f"kvfence.kernels.draft.{module}:{attr}"


def reference_spec(contract: str) -> str:
    """``module:attr`` of ``contract``'s reference kernel."""
    return kernel_spec(*REFERENCE_KERNELS[contract])


def mutants(contract: str) -> Tuple[Mutant, ...]:
    """The planted bugs of ``MUTANTS_DIR`` that break ``contract`` (each file's ``CONTRACT``), read once per folder."""
    return _read(MUTANTS_DIR, contract)


@functools.lru_cache(maxsize=None)
def _read(folder: Path, contract: str) -> Tuple[Mutant, ...]:
    out = []
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        module = runpy.run_path(str(path))
        if module.get("CONTRACT", "draft") != contract:
            continue
        doc = (module.get("__doc__") or "").strip().splitlines()[0]
        domain = module.get("DOMAIN", "cpu")
        detects = module.get("DETECTS")
        # One line naming the file (a missing DETECTS was a KeyError, a string one its letters as kinds).
        require(isinstance(detects, (tuple, list)) and detects and all(isinstance(k, str) for k in detects),
                f"mutant {path.name}: DETECTS must be a non-empty tuple of finding kinds, got {detects!r}")
        assert isinstance(detects, (tuple, list))  # require refused anything else
        detects = tuple(detects)
        if module.get("KIND") == "sizing":
            out.append(Mutant(path.stem, doc, detects, sizing=f"{path}:row_width", domain=domain))
        else:
            out.append(Mutant(path.stem, doc, detects, patch=tuple(map(tuple, module["PATCH"])), domain=domain))
    return tuple(out)
