"""One SGLang deployment as ``kvfence affected`` reads it (``Deployment``), and what kvfence assumes where neither
the flags nor the release's argument code say.

``kvfence.release.affected`` reads the flags into a ``Deployment`` and resolves it as the release does
(``kvfence.release.launch_resolve``); each contract's verdicts take it (``kvfence.release.affected_verdict``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

#: The DFlash family of ``--speculative-algorithm`` (``kvfence.release.affected.ALGORITHMS``): one verify block of
#: D tokens a step, steps and topk forced to 1.
DFLASH_FAMILY = ("DFLASH", "DSPARK")
#: SGLang's automatic (steps, topk, draft tokens) for most models (see the module docstring).
AUTO_SPECULATIVE = (3, 1, 4)
ASSUMED_CTX = 4096
ASSUMED_MAX_BS = 8


@dataclass(frozen=True)
class Deployment:
    """One SGLang deployment as its flags describe it; ``assumed`` lists what kvfence filled in."""

    version: str
    backend: str
    topk: int
    num_steps: int
    draft_tokens: int
    ctx: int
    max_bs: int
    graphs: bool
    page_size: Optional[int]
    assumed: Tuple[str, ...] = ()
    algorithm: str = "EAGLE"   # --speculative-algorithm, NEXTN read as EAGLE (SGLang's alias)
    #: The flags as the command gives them (None: not given), for the release's own resolution.
    given: dict = field(default_factory=dict, compare=False)
    tp_size: int = 1
    model_arch: str = ""       # the local --model-path's config.json architectures[0]
    model_kind: str = ""       # MLA or MHA (the release's ModelConfig list), "" when not read
    gpu: str = ""              # --gpu (kvfence's option), "" when assumed
    graph_cap: Optional[int] = None     # the graph's max batch size (flag or the release's default)
    max_running: Optional[int] = None   # --max-running-requests (or SGLang's for speculative decoding)
    eager_note: str = ""       # why no batch of a graph deployment runs eagerly for its size ("": one can)
    graph_flag: str = "--cuda-graph-max-bs"  # the release's name of the graph's max batch flag
    dcp_size: int = 1   # --dcp-size / --decode-context-parallel-size (SGLang 0.5.18 server_args.py:1018-1025)

    @property
    def mode(self) -> str:
        return "graph" if self.graphs else "eager"

    def describe(self) -> str:
        spec = (f"{self.algorithm}, " if self.algorithm != "EAGLE" else "") + (
            "" if self.algorithm in DFLASH_FAMILY else f"topk {self.topk}, {self.num_steps} steps, ")
        return (f"sglang {self.version}, {self.backend}, {'CUDA graphs' if self.graphs else 'no CUDA graphs'}, "
                f"{spec}{self.draft_tokens} draft tokens, ctx {self.ctx}"
                + (f", page {self.page_size}" if self.page_size else "")
                + (f", DCP {self.dcp_size}" if self.dcp_size > 1 else ""))
