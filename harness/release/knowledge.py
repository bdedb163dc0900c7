"""What upstream releases say of a contract's kernel: the release tooling's knowledge, keyed by contract.

A contract's record says what the kernel must do; where SGLang's wheels define that kernel and where its backends
size the tables it writes is the release tooling's business, kept out of the record. Each contract with such
knowledge registers a ``Shipped`` under the entry-point group ``kvfence.shipped`` by the contract's name (kvfence's
own in ``pyproject.toml``), so the release tooling (``upstream``, the matrices, ``affected``) finds it by name, as
the engine finds records, and names no contract itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

from kvfence.errors import BadInput, require

GROUP = "kvfence.shipped"


@dataclass(frozen=True)
class Upstream:
    """Where SGLang's wheels define the contract's kernel: the function name and candidate module paths
    (the newest first). ``renamed``: the kernel under an older name, ``(name, its parameters, adapter)``: a
    release defining ``name`` with exactly those parameters (and not ``function``) is launched through
    ``adapter``, the text of a ``@triton.jit`` function of kvfence's named ``function`` with the contract's ABI
    that calls it. ``function`` may name a ``@staticmethod`` ``@triton.jit`` method as ``Class.method`` (a
    vLLM ``VllmTritonJitKernel``'s body; the kernel source lifts it to the top level). ``variants``: other kernels
    of the same ABI a release ships, ``(name, Upstream)`` pairs a spec selects as ``SOURCE==VERSION:name``."""

    function: str
    paths: Tuple[str, ...]
    renamed: Tuple[Tuple[str, Tuple[str, ...], str], ...] = ()
    variants: Tuple[Tuple[str, "Upstream"], ...] = ()


@dataclass(frozen=True)
class ShippedSite:
    """Where one SGLang backend sizes the table this contract's kernel writes, for one CUDA-graph mode and
    forward mode, as expression texts a reader finds in the release's wheel (``kvfence.release.contract_shipped``).

    ``width``: the row width in pages, as the backend spells it (found by its text in ``cls``'s methods, or in
    ``within`` only; ``cls``'s bases in the wheel are searched too). ``delta``: the tokens the launch adds to
    each committed length (``"0"`` for none), found inside ``evidence`` (an expression or statement of the
    class that shows the lengths getting it) when given. ``symbols``: names this site gives a quantity (a fact of
    the backend: tokens per request in target verify are the draft tokens). ``page_sizes``: the page sizes the
    backend runs with. ``topk``: the EAGLE topk values the site runs under (``"1"``: only topk <= 1, ``"any"``).
    ``guard``: the expression text of the branch that makes the site run only so (``"self.topk <= 1"``), whose
    line the reader records (the nearest before ``evidence`` in the same method). ``page_default``: the page
    size SGLang runs the backend with when ``--page-size`` is not given or is not one of ``page_sizes`` (SGLang
    changes it and logs so); 0 where SGLang's own default page size (1) stands. ``fill``: where the backend's own
    torch code fills the table instead of the contract's kernel, the statement that does (its slice clips the
    copy to the row): the site is read only in a release that has it, and its verdict rests on the width
    arithmetic (the reader past the row is the attention kernel given the published length)."""

    backend: str          # SGLang's --attention-backend name
    cls: str              # the backend class
    mode: str             # graph | eager
    forward_mode: str     # decode | target_verify | draft_extend
    width: str
    delta: str
    page_sizes: Tuple[int, ...]
    within: str = ""
    evidence: str = ""
    symbols: Tuple[Tuple[str, str], ...] = ()
    note: str = ""
    topk: str = "any"
    guard: str = ""
    page_default: int = 0
    fill: str = ""


class ReleaseTool(Protocol):
    """A contract's own release tooling, for a kernel whose shipped sizing is not a list of sites: the draft
    kernel's backends are found in a wheel by what they launch, its width read from its CUDA-graph runner
    (``kvfence.contracts.draft.release``). ``upstream sizing``, ``upstream matrix --shipped`` and ``affected``
    call it for the contract it is registered with."""

    def sizing_lines(self, version: str, announce: Callable[[str], None]) -> List[str]:
        """``upstream sizing VERSION``: the release's shipped sizing, one line per backend and mode."""

    def shipped_matrix(self, versions: List[str], options: dict, *, device: str, offline: bool, out,
                       progress) -> Tuple[dict, str]:
        """``upstream matrix --shipped``: ``(doc, markdown)``, its reports written under ``out``; ``options``: the
        ``--shipped-*`` flags by name without the prefix (``ctx``, ``steps``, ``max_bs``, ``max_topk``, ``lengths``)."""

    def deployment_verdicts(self, deployment, releases: List[str], out, device: str) -> list:
        """``affected``: ``kvfence.release.affected.Verdict``s of one deployment."""


class ReleaseCache(Protocol):
    """A contract's cache of the kernels it extracts from SGLang's wheels, one entry per release: the draft
    kernel's (``kvfence.contracts.draft.release_kernels``). ``upstream fetch`` and the release matrix reach it
    through ``release_cache()``. ``kernel``: the kernel a ``sglang==VERSION`` spec names by default."""

    kernel: str

    def fetch(self, version: str, *, wheel: Optional[str] = None, offline: Optional[bool] = None,
              refresh: bool = False, announce: Optional[Callable[[str], None]] = None) -> Any:
        """The release's cache entry (``.version``, ``.module_path``, ``.manifest``, ``.abis``): from the cache,
        else extracted from its wheel; ``kvfence.release.upstream.Refused`` where the wheel says why not."""

    def cached_versions(self) -> Dict[str, str]:
        """Releases the cache knows: version -> ``"entry"`` or ``"refused"``."""

    def describe(self, entry: Any) -> str:
        """One line: where an entry's kernels came from and their ABIs."""

    def abi_parameters(self, abi: str) -> Tuple[str, ...]:
        """The required parameters of the ABI named ``abi``."""


@dataclass(frozen=True)
class Shipped:
    """One contract's release knowledge. ``upstream``: where its kernel is; ``sites``: where backends size its
    table; ``wall(ctx, page_size, draft_tokens, length)``: the JSON of the case ``from_json`` reads for one request
    of committed length ``length`` launched with ``draft_tokens`` added, as the sites pass it; ``sizings``: the
    named policies of the record a release matrix pairs with this contract; ``flags``: the fuzz flags a release
    matrix's cell of this contract adds (a config the ABI needs pinned); ``tool``: its own release tooling
    (``ReleaseTool``), where its sizing is not a list of sites; ``cache``: True where the release's kernel comes
    from the tool's cache entry rather than from ``upstream`` (the draft family's). ``block_pages(page_size)``:
    the kernel's block arithmetic, the pages one program of its grid covers: a launch for a row of ``W`` pages
    covers ``ceil(W / B) * B`` columns, so the pages a length needs past ``W`` land past the row up to there
    (None: the kernel clamps its stores to the row). The whole-space classes kvfence derives from it
    (``kvfence.release.contract_space``) are each confirmed on the release's kernel by a witness.
    ``severity``: what a deployment suffers, per class of a site (``"writes past its row"``, ``"width formula
    short"``), in a deployer's words. ``vllm_affected(deployment, out, device)``: the contract's
    ``kvfence.release.affected.Verdict``s for a vLLM deployment (``kvfence.release.affected_vllm``).
    ``release_cache``: its cache of the kernels it extracts from the wheels, with what it keeps beside them
    (``ReleaseCache``: the draft family's, its shipped sizing beside its kernels)."""

    upstream: Optional[Upstream] = None
    sites: Tuple[ShippedSite, ...] = ()
    wall: Optional[Callable[[int, int, int, int], dict]] = None
    sizings: Tuple[str, ...] = ()
    flags: Tuple[str, ...] = ()
    tool: Optional[ReleaseTool] = None
    cache: bool = False
    block_pages: Optional[Callable[[int], int]] = None
    severity: Tuple[Tuple[str, str], ...] = ()
    vllm_affected: Optional[Callable] = None
    release_cache: Optional[ReleaseCache] = None


_FOUND: Dict[str, str] = {}
_LOADED: Dict[str, Shipped] = {}


def _entries() -> Dict[str, str]:
    if not _FOUND:
        from importlib.metadata import entry_points

        for ep in entry_points(group=GROUP):
            _FOUND.setdefault(ep.name, ep.value)
    return _FOUND


def names() -> List[str]:
    """The contracts with release knowledge, sorted."""
    return sorted(_entries())


def shipped(name: str) -> Shipped:
    """The release knowledge of contract ``name`` (an empty ``Shipped`` where none is registered)."""
    if name not in _LOADED:
        spec = _entries().get(name)
        if spec is None:
            _LOADED[name] = Shipped()
        else:
            from kvfence.engine.kernels import load_attr

            found = load_attr(spec, "shipped knowledge")
            require(isinstance(found, Shipped), f"{GROUP} entry {name} = {spec} is not a kvfence Shipped")
            _LOADED[name] = found
    return _LOADED[name]


def with_tool() -> List[str]:
    """The contracts with release tooling of their own (``Shipped.tool``), sorted."""
    return [n for n in names() if shipped(n).tool is not None]


def release_cache() -> ReleaseCache:
    """The first ``Shipped.release_cache`` registered, by contract name: the cache of SGLang's kernels that
    ``upstream fetch`` fills and the release matrix reads."""
    for name in names():
        cache = shipped(name).release_cache
        if cache is not None:
            return cache
    raise BadInput(f"no contract registers a release cache ({GROUP}): `upstream fetch` and the matrix need one")


def upstream_of(name: str) -> Upstream:
    found = shipped(name).upstream
    if found is None:
        raise BadInput(f"contract {name} names no kernel in SGLang's wheels")
    return found


def wall_case(record, ctx: int, page_size: int, draft_tokens: int, length: int):
    """The record's case for one request at the wall (``Shipped.wall``), through its ``from_json``."""
    wall = shipped(record.name).wall
    if wall is None:
        raise BadInput(f"contract {record.name} has no shipped sizing (no wall case)")
    return record.from_json(wall(ctx, page_size, draft_tokens, length))
