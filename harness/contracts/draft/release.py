"""What SGLang's releases say of the draft kernel and the window rail (``kvfence.release.knowledge``, registered
under ``kvfence.shipped``): where their kernels are, the sizings and flags a release matrix pairs with them, and
the draft kernel's own release tooling (``DraftReleaseTool``).

The draft kernel's shipped sizing is no list of sites: its backends are found in a wheel by what they launch and
its graph-mode width is read through the CUDA-graph runner (``kvfence.contracts.draft.shipped_wheel``), so
``upstream sizing``, ``upstream matrix --shipped`` and ``affected`` reach it through the tool, never by the contract's
name; the draft's release cache (``kvfence.contracts.draft.release_kernels``, ``Shipped.release_cache``) writes that
reading beside the kernels of a release's cache entry.
"""

from __future__ import annotations

import json
from typing import List, Tuple

from kvfence.contracts.draft.release_kernels import DraftReleaseCache
from kvfence.contracts.draft.shipped_wheel import DRAFT_KERNEL, WINDOW_KERNEL
from kvfence.release.knowledge import Shipped, Upstream

#: The rail's window in a release matrix cell (``--contract window-rail`` needs one): longer than most drawn
#: requests and shorter than the longest, so both of the rail's parts (prefix and chain) are exercised.
RAIL_WINDOW = 16


class DraftReleaseTool:
    """``kvfence.release.knowledge.ReleaseTool`` for the draft kernel."""

    def sizing_lines(self, version: str, announce) -> List[str]:
        from kvfence.contracts.draft import shipped_sizing, shipped_wheel
        from kvfence.contracts.draft.shipped_report import sizing_lines
        from kvfence.errors import require

        record = shipped_sizing.load_record(version)
        require(record["backends"], f"sglang=={version} has no draft backend (no class launches "
                                    f"{shipped_wheel.DRAFT_KERNEL})" + shipped_wheel.unread_note(record))
        return sizing_lines(version, record)

    def shipped_matrix(self, versions: List[str], options: dict, *, device: str, offline: bool, out,
                       progress) -> Tuple[dict, str]:
        """``options``: the ``--shipped-*`` flags by name (``ctx``, ``steps``, ``max_bs``, ``max_topk``,
        ``lengths``)."""
        from kvfence.contracts.draft import shipped_matrix as sm
        from kvfence.contracts.draft.shipped_report import markdown, write
        from kvfence.provenance import stamped

        domain = sm.WitnessSpace(ctx=options["ctx"], num_steps=options["steps"], max_bs=options["max_bs"],
                           max_topk=options["max_topk"], ordinary_only=options["lengths"] == "ordinary")
        doc = sm.run(versions, domain=domain, device=device, offline=offline, out=out,
                     progress=progress)
        report = write(doc, out)
        doc = stamped(doc)
        (out / "shipped.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        return doc, markdown(doc, out) + f"report {report}\n"

    def deployment_verdicts(self, deployment, releases: List[str], out, device: str) -> list:
        from kvfence.contracts.draft.affected import draft_verdict

        return draft_verdict(deployment, releases, out, device)


DRAFT = Shipped(Upstream(DRAFT_KERNEL, ()), sizings=("eager", "fixed", "prefix", "safe"), tool=DraftReleaseTool(),
                cache=True, release_cache=DraftReleaseCache())
WINDOW_RAIL = Shipped(Upstream(WINDOW_KERNEL, ()), sizings=("window-fixed", "window-no-topk"),
                      flags=("--window", str(RAIL_WINDOW)), cache=True)
