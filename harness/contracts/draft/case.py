"""The case model: a ``Config`` (what is fixed at capture time), a ``Batch`` (one launch's requests)
and how a batch is fed to the kernel (``LaunchBatch``, with CUDA-graph padding per docs/contract.md §4).

Everything is validated on construction with ``BadInput``: an impossible case never reaches a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Dict, List, Optional, Tuple

from kvfence.contracts.draft import oracle
from kvfence.contracts.draft.tokens import INT32_LIMIT, SLOT_BITS, req_to_token_rows, v2p_table
from kvfence.errors import BadInput, require

LAYOUTS = ("redzone", "production")
MODES = ("graph", "eager")
#: The kernel a config checks (docs/contract.md §6): the draft kernel, or the window rail.
CONTRACTS = ("draft", "window-rail")
#: Largest ``entry_page_size`` (a power of two): an entry then holds a 24-bit page id (see ``entry_bits``).
MAX_ENTRY_PAGE_SIZE = 64
#: The most bytes a config's req_to_token pool may take, checked by arithmetic on construction (before
#: ``pool_len`` or anything else is computed): far above any real pool (257 rows x 131072 tokens is
#: 137 MB), so it only refuses absurd inputs such as ``--page-size 2**40`` or a 5,000-digit number in a
#: case file. The memory budget of a run (``kvfence.engine.budget``, ``--max-gpu-mem``) is the real limit.
MAX_POOL_BYTES = 1 << 34


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _cached_hash(obj, names: tuple) -> int:
    """The hash of a frozen dataclass's fields ``names``, computed once and kept in its ``__dict__``
    (``_state_without_hash`` keeps it off pickles: a str's hash differs between processes)."""
    h = obj.__dict__.get("_hash")
    if h is None:
        h = obj.__dict__["_hash"] = hash(tuple(getattr(obj, name) for name in names))
    return h


def _state_without_hash(obj) -> dict:
    """The fields, without the caches kept in ``__dict__`` (a str's hash differs between processes)."""
    return {k: v for k, v in obj.__dict__.items() if not k.startswith("_")}


def _check_settings(sizing, mode, layout) -> None:
    """A config's launch settings (each None in a case's unbound config)."""
    require(layout is None or layout in LAYOUTS, f"config.layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    require(mode is None or mode in MODES, f"config.mode must be one of {', '.join(MODES)}, got {mode!r}")
    require(sizing is None or (isinstance(sizing, str) and sizing),
            f"config.sizing must be a policy name, got {sizing!r}")


def _plain_ints(values: tuple) -> bool:
    """Every element exactly an ``int`` (a fast sufficient test for ``_is_int`` of each)."""
    return set(map(type, values)) == {int}


def default_buckets(max_bs: int) -> Tuple[int, ...]:
    """Capture buckets as upstream runners use them: 1, 2, 4, ... below ``max_bs``, then ``max_bs``."""
    out, b = [], 1
    while b < max_bs:
        out.append(b)
        b *= 2
    return tuple(out + [max_bs])


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.0f} MiB" if nbytes < 2**50 else f"~2**{nbytes.bit_length() - 1} bytes"


def _short(n: int) -> str:
    """An integer for a one-line message: a 5,000-digit number is shown by its size."""
    text = str(n) if n.bit_length() < 64 else f"~2**{n.bit_length() - 1}"
    return text


@dataclass(frozen=True)
class Config:
    """What a CUDA-graph runner fixes once: model-side constants, buckets, buffer sizing and layout.

    ``sizing`` names a row-width policy (``kvfence.contracts.draft.sizing`` or a plug-in spec). ``layout`` is
    ``redzone`` (a guard after every step row) or ``production`` (rows contiguous, as upstream).
    ``mode`` is ``graph`` (buffers sized once at ``max_bs``, batches padded to a bucket) or ``eager``.

    The contract's case (``DraftCase``) holds a config *unbound*: ``sizing``, ``layout`` and ``mode`` None, since
    they are the launch's settings (``kvfence.contract.Launch``), not the case's; ``bind`` gives the runner's.
    """

    topk: int
    num_steps: int
    page_size: int = 1
    ctx: int = 64
    max_bs: int = 4
    buckets: Optional[Tuple[int, ...]] = None
    sizing: str = "safe"
    layout: str = "redzone"
    mode: str = "graph"
    #: docs/contract.md §6, all off by default (a config with every default is exactly a §2 config).
    window_size: int = 0
    sink_size: int = 0
    entry_page_size: int = 1
    translate: bool = False
    contract: str = "draft"

    def __post_init__(self):
        for name in ("topk", "num_steps", "page_size", "ctx", "max_bs"):
            value = getattr(self, name)
            require(_is_int(value) and value >= 1, f"config.{name} must be a positive integer, got {value!r}")
        require(self.topk <= 64, f"config.topk must be at most 64, got {self.topk}")
        require(self.num_steps <= 64, f"config.num_steps must be at most 64, got {self.num_steps}")
        require(self.page_size & (self.page_size - 1) == 0,
                f"config.page_size must be a power of two, got {self.page_size}")
        _check_settings(self.sizing, self.mode, self.layout)
        self._check_family()
        if self.buckets is None:
            object.__setattr__(self, "buckets", default_buckets(self.max_bs))
        else:
            buckets = tuple(self.buckets)
            require(
                len(buckets) > 0 and all(_is_int(b) and b >= 1 for b in buckets),
                f"config.buckets must be positive integers, got {list(buckets)!r}",
            )
            require(list(buckets) == sorted(set(buckets)),
                    f"config.buckets must be strictly increasing, got {list(buckets)}")
            require(buckets[-1] == self.max_bs, f"config.buckets must end at max_bs={self.max_bs}, got {list(buckets)}")
            object.__setattr__(self, "buckets", buckets)
        require(
            self.max_bs * self.topk * (self.ctx + self.num_steps) < INT32_LIMIT,
            f"config overflows int32 offsets: max_bs*topk*(ctx+num_steps) = "
            f"{self.max_bs * self.topk * (self.ctx + self.num_steps)} >= 2**31",
        )
        # The pool alone, from an upper bound of pool_len (O(1): no loop over ctx or page_size yet).
        pool_bound = 4 * self.pool_rows * (self.ctx + self.topk * (2 * self.page_size + self.num_steps))
        require(pool_bound <= MAX_POOL_BYTES,
                f"config too large: req_to_token would take about {_mib(pool_bound)} "
                f"(page_size={_short(self.page_size)}, ctx={_short(self.ctx)}, max_bs={self.max_bs}); "
                f"kvfence allocates at most {_mib(MAX_POOL_BYTES)} for it")

    @property
    def capture_buckets(self) -> Tuple[int, ...]:
        """``buckets`` as ``__post_init__`` settled them (None there means upstream's default)."""
        assert self.buckets is not None
        return self.buckets

    def _check_family(self) -> None:
        """The §6 fields (docs/contract.md §6), each a one-line ``BadInput`` when impossible."""
        for name in ("window_size", "sink_size"):
            value = getattr(self, name)
            require(_is_int(value) and 0 <= value < INT32_LIMIT,
                    f"config.{name} must be a non-negative integer, got {_short(value) if _is_int(value) else value!r}")
        e = self.entry_page_size
        require(_is_int(e) and 1 <= e <= MAX_ENTRY_PAGE_SIZE and e & (e - 1) == 0,
                f"config.entry_page_size must be a power of two in 1..{MAX_ENTRY_PAGE_SIZE}, got {e!r}")
        require(isinstance(self.translate, bool), f"config.translate must be true or false, got {self.translate!r}")
        require(self.contract in CONTRACTS,
                f"config.contract must be one of {', '.join(CONTRACTS)}, got {self.contract!r}")
        require(self.sink_size == 0 or self.window_size > 0,
                f"config.sink_size={self.sink_size} needs a window (window_size > 0): sinks only exist beside a window")
        if self.contract == "window-rail":
            require(self.window_size > 0, "config.contract window-rail needs window_size > 0 (the rail's window)")
            require(self.sink_size == 0, f"config.sink_size={self.sink_size}: the window rail has no sinks")

    def __hash__(self) -> int:
        # Hashed for every cache and verdict lookup of every case: computed once per config.
        return _cached_hash(self, _CONFIG_FIELDS)

    def __getstate__(self) -> dict:
        return _state_without_hash(self)

    @property
    def bound(self) -> bool:
        """Sizing, layout and mode set: a runner's config (``bind``), not a case's."""
        return self.sizing is not None and self.layout is not None and self.mode is not None

    def bind(self, sizing: str, mode: str, layout: str = "redzone") -> "Config":
        """This config under a launch's settings (the same object for the same settings: runners are cached
        by config, and a config caches the widths its policy gave)."""
        if (self.sizing, self.mode, self.layout) == (sizing, mode, layout):
            return self
        cache = self.__dict__.setdefault("_bound", {})
        key = (sizing, mode, layout)
        if key not in cache:
            if len(cache) > 64:
                cache.clear()
            cache[key] = self._with_settings(sizing, mode, layout)
        return cache[key]

    def unbound(self) -> "Config":
        """This config without a launch's settings: what a ``DraftCase`` holds."""
        if self.sizing is None and self.mode is None and self.layout is None:
            return self
        found = self.__dict__.get("_unbound")
        if found is None:
            found = self.__dict__["_unbound"] = self._with_settings(None, None, None)
            # Bound again to these settings it is this config, with the widths and extents it has computed.
            found.__dict__["_bound"] = {(self.sizing, self.mode, self.layout): self}
        return found

    def _with_settings(self, sizing, mode, layout) -> "Config":
        """This config under other launch settings. Only the settings are checked again: the rest was checked
        when this config was made, and a fuzzing run binds and unbinds every drawn config."""
        _check_settings(sizing, mode, layout)
        other = object.__new__(Config)  # the fields only: no cache of this config's travels with it
        other.__dict__.update({name: getattr(self, name) for name in _CONFIG_FIELDS}, sizing=sizing, mode=mode,
                              layout=layout)
        return other

    @property
    def is_family(self) -> bool:
        """Any §6 path on: a window, sinks, page-granular rows, translation, or the rail contract."""
        return (self.window_size > 0 or self.entry_page_size > 1 or self.translate
                or self.contract != "draft")

    @property
    def is_rail(self) -> bool:
        return self.contract == "window-rail"

    def family_dict(self) -> dict:
        """The §6 fields that differ from their defaults (what case files and summaries record)."""
        defaults = {"window_size": 0, "sink_size": 0, "entry_page_size": 1, "translate": False, "contract": "draft"}
        return {k: getattr(self, k) for k, v in defaults.items() if getattr(self, k) != v}

    # -- derived sizes -----------------------------------------------------------------------------
    @property
    def entry_bits(self) -> int:
        """Bits of a req_to_token entry: 30, less ``log2(E)`` with page-granular rows, so that
        ``entry*E + E-1`` (the token id, docs/contract.md §6) stays a 30-bit slot id."""
        return SLOT_BITS - (self.entry_page_size.bit_length() - 1)

    @property
    def pool_cols(self) -> int:
        """Entries of one req_to_token row: ``pool_len`` tokens, one entry per ``E`` of them (§6)."""
        return -(-self.pool_len // self.entry_page_size)

    @property
    def virtual_tokens(self) -> int:
        """TRANSLATE: virtual token ids are ``[0, pool_rows*pool_cols*E)`` (entries permute ``[0, N)``)."""
        return self.pool_rows * self.pool_cols * self.entry_page_size

    @property
    def v2p_pages(self) -> int:
        """TRANSLATE: entries of the page table, one per page of ``page_size`` virtual tokens (0 without)."""
        return -(-self.virtual_tokens // self.page_size) if self.translate else 0

    @property
    def pool_rows(self) -> int:
        """req_to_token rows: one per possible request, plus one so pool indices can be permuted."""
        return self.max_bs + 1

    @cached_property
    def pool_len(self) -> int:
        """req_to_token row length: every slot any request of length <= ctx reads (docs/contract.md §2, Reads).

        ``read_extent(L)`` is ``L`` plus a term that depends only on ``L mod page_size`` and grows with
        it, so within a page it peaks at the page's last length and a higher page beats a lower one:
        the maximum over ``1..ctx`` is at ``ctx`` or at the last length of the page below ctx's. O(topk),
        whatever ctx and page_size are (a loop over either would hang on ``--page-size 2**40``).
        (``tests/test_case_limits.py`` checks this against the maximum over every length.)
        """
        top_page_start = self.ctx - self.ctx % self.page_size
        candidates = [self.ctx] + ([top_page_start - 1] if top_page_start - 1 >= 1 else [])
        return max(oracle.read_extent(L, self.topk, self.num_steps, self.page_size) for L in candidates)

    def bucket_for(self, raw_bs: int) -> int:
        """The smallest capture bucket ``>= raw_bs`` (graph mode replays that graph)."""
        for b in self.capture_buckets:
            if b >= raw_bs:
                return b
        raise BadInput(f"batch of {raw_bs} requests exceeds max_bs={self.max_bs}")

    def sizing_n(self, num_seqs: int) -> int:
        """The ``n`` a sizing policy is called with: ``max_bs`` in graph mode, ``num_seqs`` in eager mode."""
        return self.max_bs if self.mode == "graph" else num_seqs

    def row_width(self, num_seqs: int) -> int:
        """Row width ``W`` of the kv_indices buffer a launch of ``num_seqs`` requests gets."""
        n = self.sizing_n(num_seqs)
        # A policy is a function of its arguments: ask it once per n (this runs for every case checked).
        widths = self.__dict__.setdefault("_row_widths", {})
        if n not in widths:
            widths[n] = self._policy_width(n)
        return widths[n]

    def _policy_width(self, n: int) -> int:
        from kvfence.contracts.draft.sizing import resolve_sizing  # late: plug-in policies resolve on first use

        policy = resolve_sizing(self.sizing)
        # A shipped sizing (kvfence.contracts.draft.shipped_wheel) reads a different site per mode.
        mode = {"mode": self.mode} if getattr(policy, "takes_mode", False) else {}
        width = policy(n, self.topk, self.ctx, self.num_steps, window_size=self.window_size, sink_size=self.sink_size,
                       **mode)
        require(_is_int(width) and width >= 1,
                f"sizing policy {self.sizing!r} returned {width!r} for n={n}: not a positive int")
        # Row offsets are int32 in the kernel (docs/contract.md §3): a wider row cannot be addressed.
        require(width < INT32_LIMIT,
                f"sizing policy {self.sizing!r} returned width {_short(width)} for n={n}: wider than int32 row offsets "
                "(2**31) allow")
        return width

    def worst_overflow(self) -> int:
        """How far past its width any step row can be written by a correct kernel under this sizing.

        Guards are at least this long, so a buggy sizing never writes outside our allocation.
        """
        worst = 0
        for n in (self.capture_buckets if self.mode == "graph" else range(1, self.max_bs + 1)):
            worst = max(worst, self.worst_need(n) - self.row_width(n))
        return worst

    def worst_need(self, n: int) -> int:
        """The widest step row a correct kernel writes for ``n`` requests of length ``ctx``."""
        if self.is_rail:  # every branch keeps min(ctx + num_steps, w): B(s, bs) in closed form
            return n * self.topk * min(self.ctx + self.num_steps, self.window_size)
        return oracle.need([oracle.clipped_length(self.ctx, self.window_size, self.sink_size)] * n, self.topk,
                           self.num_steps)

    def to_dict(self) -> dict:
        return {
            "topk": self.topk,
            "num_steps": self.num_steps,
            "page_size": self.page_size,
            "ctx": self.ctx,
            "max_bs": self.max_bs,
            "buckets": list(self.capture_buckets),
            **{k: getattr(self, k) for k in ("sizing", "layout", "mode") if getattr(self, k) is not None},
            **self.family_dict(),  # §6 fields only when set: a §2 config's dict is unchanged
        }


#: Config's fields in order (what its equality compares and its hash digests).
_CONFIG_FIELDS = tuple(Config.__dataclass_fields__)


@dataclass(frozen=True)
class Batch:
    """One launch's requests, before padding: committed lengths, pool rows, and the table's seed.

    ``req_to_token`` is not stored: entry ``i`` of the flattened table is ``slot_id(token_seed, i)``.
    """

    seq_lens: Tuple[int, ...]
    req_pool_indices: Tuple[int, ...]
    token_seed: int = 0
    #: TRANSLATE's page table (``v2p_table``): 0 is the identity, any other seed a drawn table.
    v2p_seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "seq_lens", tuple(self.seq_lens))
        object.__setattr__(self, "req_pool_indices", tuple(self.req_pool_indices))
        require(len(self.seq_lens) >= 1, "batch.seq_lens must hold at least one request")
        require(
            len(self.req_pool_indices) == len(self.seq_lens),
            f"batch.req_pool_indices has {len(self.req_pool_indices)} entries for {len(self.seq_lens)} requests",
        )
        # Plain ints (every drawn or parsed batch) are checked in one pass; anything else element by element.
        if not (_plain_ints(self.seq_lens) and min(self.seq_lens) >= 1):
            require(all(_is_int(L) and L >= 1 for L in self.seq_lens),
                    f"batch.seq_lens must be positive integers, got {list(self.seq_lens)}")
        if not (_plain_ints(self.req_pool_indices) and min(self.req_pool_indices) >= 0):
            require(all(_is_int(r) and r >= 0 for r in self.req_pool_indices),
                    "batch.req_pool_indices must be non-negative integers")
        require(len(set(self.req_pool_indices)) == len(self.req_pool_indices),
                "batch.req_pool_indices must be distinct")
        require(_is_int(self.token_seed) and 0 <= self.token_seed < 2**SLOT_BITS,
                "batch.token_seed must be an integer in [0, 2**30)")
        require(_is_int(self.v2p_seed) and 0 <= self.v2p_seed < 2**SLOT_BITS,
                "batch.v2p_seed must be an integer in [0, 2**30)")

    @property
    def raw_bs(self) -> int:
        return len(self.seq_lens)

    def check_fits(self, config: Config) -> None:
        """Raise ``BadInput`` unless this batch is one the config's runner can launch."""
        require(self.raw_bs <= config.max_bs, f"batch has {self.raw_bs} requests, more than max_bs={config.max_bs}")
        if max(self.seq_lens) > config.ctx:
            bad = [L for L in self.seq_lens if L > config.ctx]
            require(not bad, f"batch.seq_lens {bad} exceed ctx={config.ctx}")
        if max(self.req_pool_indices) >= config.pool_rows:
            rows = [r for r in self.req_pool_indices if r >= config.pool_rows]
            require(not rows, f"batch.req_pool_indices {rows} outside the pool's {config.pool_rows} rows")

    def to_dict(self) -> dict:
        d = {"seq_lens": list(self.seq_lens), "req_pool_indices": list(self.req_pool_indices),
             "token_seed": self.token_seed}
        if self.v2p_seed:
            d["v2p_seed"] = self.v2p_seed
        return d




def _row_used(config: Config, seq_lens, positions, s: int) -> int:
    if config.is_rail:
        return oracle.rail_used(seq_lens, positions, config.topk, s, config.window_size)
    return oracle.used_length_family(seq_lens, config.topk, s, config.window_size, config.sink_size)


def launch_used(config: Config, seq_lens, positions) -> List[int]:
    """``U(s)`` of every step row: how many leading elements a correct kernel writes (§2, §6)."""
    return [_row_used(config, seq_lens, positions, s) for s in range(config.num_steps)]


def launch_need(config: Config, seq_lens, positions) -> int:
    """The width one launch needs: its widest (last) step row (``U(s)`` grows with ``s``)."""
    return _row_used(config, seq_lens, positions, config.num_steps - 1)


@dataclass(frozen=True)
class LaunchBatch:
    """What the kernel actually reads for one launch: ``num_seqs`` rows (a bucket, in graph mode).

    In graph mode rows ``raw_bs..num_seqs-1`` are the runner's padding: ``seq_len 1``,
    ``position 0``, ``req_pool_index 0`` (docs/contract.md §4).
    """

    seq_lens: Tuple[int, ...]
    req_pool_indices: Tuple[int, ...]
    positions: Tuple[int, ...]
    raw_bs: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


def launch_batch(config: Config, batch: Batch) -> LaunchBatch:
    """Pad (graph mode) and derive ``positions = seq_lens.repeat_interleave(topk)``."""
    batch.check_fits(config)
    return _padded(config, batch)


def _pad_rows(config: Config, raw_bs: int) -> int:
    """Padding rows the runner adds to ``raw_bs`` requests: up to the bucket in graph mode, none eager."""
    return 0 if config.mode == "eager" else config.bucket_for(raw_bs) - raw_bs


def _padded_lens(config: Config, batch: Batch) -> Tuple[int, ...]:
    """The launch's ``seq_lens``: a padding row has length 1 (docs/contract.md §4)."""
    return batch.seq_lens + (1,) * _pad_rows(config, batch.raw_bs)


def _padded(config: Config, batch: Batch) -> LaunchBatch:
    """``launch_batch`` of a batch known to fit ``config`` (a ``Case`` checked it when it was built).
    A padding row reads pool row 0 at position 0."""
    pad = _pad_rows(config, batch.raw_bs)
    positions = [L for L in batch.seq_lens for _ in range(config.topk)] + [0] * (pad * config.topk)
    return LaunchBatch(_padded_lens(config, batch), batch.req_pool_indices + (0,) * pad, tuple(positions),
                       batch.raw_bs)


@dataclass(frozen=True)
class Case:
    """One fuzz case: config, batch, which kernel runs it, and the seed of the guard canaries."""

    config: Config
    batch: Batch
    kernel: str = "reference"
    canary_seed: int = 0
    extras: dict = field(default_factory=dict, compare=False, hash=False)

    def __hash__(self) -> int:
        # Each case is hashed several times per example (dedup, verdict cache, launched set).
        return _cached_hash(self, _CASE_KEY_FIELDS)

    def __getstate__(self) -> dict:
        return _state_without_hash(self)

    def __post_init__(self):
        self.batch.check_fits(self.config)
        require(isinstance(self.kernel, str) and self.kernel, "case.kernel must name a kernel")
        require(_is_int(self.canary_seed) and 0 <= self.canary_seed < 2**31,
                "case.canary_seed must be an integer in [0, 2**31)")

    @property
    def contract(self) -> str:
        """The contract whose record checks this case (``kvfence.contracts.draft.record``): the config's."""
        return self.config.contract

    @cached_property
    def _launch(self) -> LaunchBatch:
        return _padded(self.config, self.batch)  # __post_init__ checked that the batch fits

    def launch(self) -> LaunchBatch:
        """The padded batch the kernel reads (computed once per case)."""
        return self._launch

    def expected(self) -> oracle.WriteSet:
        lb = self.launch()
        c = self.config
        args = (lb.seq_lens, lb.req_pool_indices, lb.positions, req_to_token_rows(c, self.batch.token_seed),
                c.topk, c.num_steps, c.page_size)
        if not c.is_family:
            return oracle.expected_writes(*args)
        family: Dict[str, Any] = dict(entry_page_size=c.entry_page_size, v2p=v2p_table(c, self.batch.v2p_seed))
        if c.is_rail:
            return oracle.expected_window_rail(*args, window=c.window_size, **family)
        return oracle.expected_writes_family(*args, window_size=c.window_size, sink_size=c.sink_size, **family)

    def used(self) -> List[int]:
        """``U(s)`` of every step row of this launch (docs/contract.md §2, §6)."""
        lb = self.launch()
        return launch_used(self.config, lb.seq_lens, lb.positions)

    @cached_property
    def _need(self) -> Tuple[int, Tuple[int, ...]]:
        """``(need, launched lengths)``: the widest step row the launch writes (no sizing is asked)."""
        c = self.config
        if c.is_rail:
            lb = self.launch()
            return launch_need(c, lb.seq_lens, lb.positions), lb.seq_lens
        lens = _padded_lens(c, self.batch)  # the draft kernel's need follows from the padded lengths alone
        return launch_need(c, lens, ()), lens

    def need(self) -> int:
        return self._need[0]

    @cached_property
    def _sizing(self) -> dict:
        need, lens = self._need
        return {"need": need, "width": self.config.row_width(len(lens)), "num_seqs": len(lens),
                "sum_seq_lens": sum(lens)}

    def sizing_summary(self) -> dict:
        """need vs width for this launch: the arithmetic behind ``SIZING_VIOLATION`` (computed once)."""
        return dict(self._sizing)


def config_from_dict(d: dict) -> Config:
    require(isinstance(d, dict), "config must be a JSON object")
    known = set(Config.__dataclass_fields__)
    unknown = sorted(set(d) - known)
    require(not unknown, f"config has unknown fields {unknown}")
    missing = sorted({"topk", "num_steps"} - set(d))
    require(not missing, f"config lacks fields {missing}")
    d = dict(d)
    if d.get("buckets") is not None:
        require(isinstance(d["buckets"], list), "config.buckets must be a list")
        d["buckets"] = tuple(d["buckets"])
    return Config(**d)


def batch_from_dict(d: dict) -> Batch:
    require(isinstance(d, dict), "batch must be a JSON object")
    unknown = sorted(set(d) - set(Batch.__dataclass_fields__))
    require(not unknown, f"batch has unknown fields {unknown}")
    for key in ("seq_lens", "req_pool_indices"):
        require(isinstance(d.get(key), list), f"batch.{key} must be a list")
    return Batch(tuple(d["seq_lens"]), tuple(d["req_pool_indices"]), d.get("token_seed", 0), d.get("v2p_seed", 0))


#: The fields a ``Case`` compares and hashes (``extras`` is neither).
_CASE_KEY_FIELDS = tuple(f.name for f in Case.__dataclass_fields__.values() if f.compare)


@dataclass(frozen=True)
class DraftCase:
    """The draft contract's case (``kvfence.contract.Contract``): an unbound config (``Config.unbound``: no
    sizing, layout or mode: those are the launch's settings), a batch and the seed of the guards' canaries."""

    config: Config
    batch: Batch
    canary_seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "config", self.config.unbound())
        self.batch.check_fits(self.config)
        require(_is_int(self.canary_seed) and 0 <= self.canary_seed < 2**31,
                "case.canary_seed must be an integer in [0, 2**31)")

    def __hash__(self) -> int:
        return _cached_hash(self, ("config", "batch", "canary_seed"))

    def __getstate__(self) -> dict:
        return _state_without_hash(self)

    def runtime(self, sizing: str, mode: str, layout: str, kernel: str) -> Case:
        """The runner's case: the config bound to the launch's settings, with the kernel it runs (the same object
        for the same settings: the engine asks the record of one launch several times, and the runner's case
        keeps what it computed, its padded batch and its need)."""
        cache = self.__dict__.setdefault("_runtime", {})
        key = (sizing, mode, layout, kernel)
        found = cache.get(key)
        if found is None:
            if len(cache) > 8:
                cache.clear()
            found = cache[key] = Case(self.config.bind(sizing, mode, layout), self.batch, kernel, self.canary_seed)
        return found

    @classmethod
    def of(cls, case: Case) -> "DraftCase":
        """A runner's case as the contract's (its settings dropped). ``case`` was checked when it was made, so
        nothing is checked again, and it is the runner's case of its own settings (``runtime``)."""
        found = object.__new__(cls)
        found.__dict__.update(config=case.config.unbound(), batch=case.batch, canary_seed=case.canary_seed,
                              _runtime={(case.config.sizing, case.config.mode, case.config.layout, case.kernel): case})
        return found
