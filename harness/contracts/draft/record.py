"""The draft kernel's records: ``draft`` (docs/contract.md §2-§4, §6) and ``window-rail`` (§6, the window rail).

A case is a ``DraftCase``: a config (what a CUDA-graph runner fixes once: topk, steps, page size, context,
buckets, the §6 fields) and a batch (lengths, pool rows, the slot table's seed). The launch adds the sizing, the
mode (``graph``: buffers sized once at ``max_bs``, batches padded to a capture bucket and replayed from CUDA
graphs, docs/contract.md §4) and the layout. The record answers the engine (``kvfence.contract.Contract``):

* ``cases``: ``strategies`` (``configs`` with the run's pins, then ``cases``, or ``case_runs``: several batches
  of one config per example, and the bulk), on the domains of ``domain``;
* ``tables``/``expected``/``launch``: the plain path, one launch of the padded batch in guarded tables against
  the oracle (``oracle``), what ``repro --verbose`` and the checker's equality tests run;
* ``checker``: the production path, ``DraftChecker``: the CUDA-graph runner of §4 (``runner``), guarded buffers,
  the verdict (``verdict``) and, on CUDA, the device verifier (``device_verify``); ``checker_bytes`` the memory it
  holds (``runner_buffers``);
* ``report``: the buffer map of report.html (``buffer_map``).

Its planted bugs live in ``kernels/draft/mutants/`` (each file one bug, its docstring and ``DETECTS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Dict, List

from kvfence.contract import Contract, Keys, Launch, Table
from kvfence.contracts.draft.case import Case, DraftCase, batch_from_dict, config_from_dict
from kvfence.contracts.draft.domain import boundary_classes
from kvfence.contracts.draft.launches import launch_of  # noqa: F401 (where callers have always found it)
from kvfence.contracts.draft.mutants import REFERENCE_KERNELS, kernel_spec, mutants
from kvfence.contracts.draft.options import OPTIONS
from kvfence.contracts.draft.runner_buffers import runner_bytes
from kvfence.contracts.draft.sizing import POLICIES
from kvfence.contracts.draft.tokens import req_to_token_rows, v2p_table
from kvfence.engine.kernels import is_plugin, release_source
from kvfence.errors import require


class DraftSizings(Mapping):
    """The draft's sizings: the builtin policies by name (``kvfence.contracts.draft.sizing``), and on lookup also a
    release's shipped sizing (``sglang==V:BACKEND``) or a plug-in ``(n, topk, ctx, num_steps) -> width`` (each call
    under the engine's boundary: ``sizing.resolve_sizing``). Each answers ``(case, mode) -> width`` as the engine
    asks: ``n`` is ``max_bs`` in graph mode, the batch's requests in eager mode."""

    def __iter__(self):
        return iter(POLICIES)

    def __len__(self) -> int:
        return len(POLICIES)

    def __contains__(self, spec) -> bool:
        return isinstance(spec, str) and (spec in POLICIES or bool(release_source(spec)) or is_plugin(spec))

    def __getitem__(self, spec: str):
        from kvfence.contracts.draft.sizing import resolve_sizing

        if not (isinstance(spec, str) and spec in self):
            raise KeyError(spec)
        resolve_sizing(spec)  # BadInput now for a plug-in that cannot be used
        policy = POLICIES.get(spec)

        def width(case: DraftCase, mode: str) -> int:
            config = case.config.bind(spec, mode)
            return config.row_width(config.bucket_for(case.batch.raw_bs) if mode == "graph" else case.batch.raw_bs)

        width.__doc__ = policy.__doc__ if policy is not None else f"the sizing {spec}"
        return width


class DraftContract(Contract[DraftCase]):
    """The draft kernel (``draft``) or the window rail (``window-rail``): one record class, the config's
    ``contract`` field picks the oracle and the kernel's launch."""

    options = OPTIONS
    sizings = DraftSizings()
    #: A GPU-domain example of the draft kernel is up to ``kvfence.selftest.mutants.GPU_BATCHES`` batches of one
    #: config, and Hypothesis mutates the config rarely from one example to the next, so 60 examples see only a
    #: dozen or so configs: a bug that needs pages of 128 tokens was reached in 17-18 of 20 seeds with 60, in 20 of
    #: 20 with 150 (``benchmarks/prior_reach.py``).
    selftest_examples = {"cpu": 60, "gpu": 150}

    def __init__(self, name: str, doc: str, kernel_module: str, attr: str):
        self.name, self.doc = name, doc
        spec = kernel_spec(kernel_module, attr)
        # reference-blocked: the same kernel launched over token blocks (docs/contract.md §2's variant)
        self.reference = {"reference": spec, "reference-blocked": spec}
        self.mutants = mutants(name)
        # The pins the mutation self-test runs under (``kvfence.selftest.mutants.self_test``): the rail refuses a run
        # without its window (``draws.check``); four splits its paths at the draft depth, so windows longer and
        # shorter than the chain both occur (``benchmarks/plain_fuzz_mutants.py``'s RAIL_FLAGS).

    # -- drawing ----------------------------------------------------------------------------------------
    def cases(self, domain):
        from kvfence.contracts.draft.draws import draws

        return draws(self, domain)

    # -- cases as data ----------------------------------------------------------------------------------
    def to_json(self, case: DraftCase) -> dict:
        return {"config": case.config.to_dict(), "batch": case.batch.to_dict(), "canary_seed": case.canary_seed}

    def from_json(self, data):
        """A ``DraftCase`` from its JSON; given a whole launch record of the format before launches (a config
        holding sizing, layout and mode, and the case's kernel), the bound ``Launch``."""
        require(isinstance(data, dict), "case must be a JSON object")
        unknown = sorted(set(data) - {"config", "batch", "kernel", "canary_seed"})
        require(not unknown, f"case has unknown fields {unknown}")
        missing = sorted({"config", "batch"} - set(data))
        require(not missing, f"case lacks fields {missing}")
        config_data = data["config"]
        require(isinstance(config_data, dict), "config must be a JSON object")
        legacy = "kernel" in data or any(k in config_data for k in ("sizing", "layout", "mode"))
        fields = dict(config_data)
        if not legacy:
            fields.update(sizing=None, layout=None, mode=None)
        try:
            config = config_from_dict(fields)
            case = DraftCase(config, batch_from_dict(data["batch"]), data.get("canary_seed", 0))
        except TypeError as exc:  # a value of the wrong type deep inside a field
            from kvfence.errors import BadInput

            raise BadInput(f"case has a value of the wrong type: {exc}") from None
        require(config.contract == self.name, f"case: its config is of contract {config.contract}, not {self.name}")
        if not legacy:
            return case
        from kvfence.engine.launch import bind

        kernel = data.get("kernel", "reference")
        require(isinstance(kernel, str) and kernel, f"case.kernel must be a non-empty string, got {kernel!r}")
        # A plug-in sizing is not run to learn the width (a case file never makes kvfence import what it names):
        # 0 until the user names it again (``repro --sizing``, which computes it).
        plugin = is_plugin(config.sizing)
        return bind(self, case, config.sizing, kernel, config.mode, config.layout, 0 if plugin else None)

    # -- the plain path: tables, oracle, launch ---------------------------------------------------------
    @staticmethod
    def runtime(launch: Launch) -> Case:
        """The runner's case of a launch: the config bound to its sizing, mode and layout, with its kernel."""
        return launch.case.runtime(launch.sizing, launch.mode, launch.layout, launch.kernel)

    def tables(self, launch: Launch) -> List[Table]:
        """kv_indices ``(num_steps, width)`` and kv_indptr ``(num_steps, bs + 1)`` written; req_to_token, the
        lengths, pool rows and positions read (and TRANSLATE's page table), for one launch of the batch (padded
        to its bucket in graph mode). The plain path launches it once, as an eager launch of those rows: the
        CUDA-graph runner's stale buffers and replays are the checker's (``DraftChecker``)."""
        from kvfence.contracts.draft.targets import CLASSIC_REQUEST_AXIS, pool_row_owners

        case, c = launch.case, launch.case.config
        lb = self.runtime(launch).launch()
        prefix = "window_" if c.is_rail else ""
        # The classic ABI passes req_to_token's row length as its row stride: its rows are contiguous.
        # Each request's programs read only its own pool row (the classic ABI's grid: abi_launcher in launch).
        out = [Table("req_to_token", c.pool_cols, c.pool_rows, "input",
                     lambda: req_to_token_rows(c, case.batch.token_seed), guards="ends",
                     row_owners=pool_row_owners(CLASSIC_REQUEST_AXIS, lb.req_pool_indices)),
               Table("seq_lens", lb.num_seqs, None, "input", list(lb.seq_lens)),
               Table("req_pool_indices", lb.num_seqs, None, "input", list(lb.req_pool_indices), "int64"),
               Table("positions", lb.num_seqs * c.topk, None, "input", list(lb.positions), "int64")]
        if c.translate:
            # v2p_table is a list when the config translates, as here
            out.append(Table("v2p", c.v2p_pages, None, "input", lambda: v2p_table(c, case.batch.v2p_seed) or []))
        return out + [Table(prefix + "kv_indices", launch.width, c.num_steps, "output"),
                      Table(prefix + "kv_indptr", lb.num_seqs * c.topk + 1, c.num_steps, "output")]

    def expected(self, launch: Launch) -> Dict[str, Dict]:
        """docs/contract.md §2 and §6 (``oracle``): every kv_indices element of every program's segment and the
        kv_indptr columns ``1..bs`` of every step row; elements two programs write differently (the rail's
        padding) accept either value."""
        writes = self._writes(launch)
        prefix = "window_" if launch.case.config.is_rail else ""
        indices = dict(writes.kv_indices)
        indices.update((key, frozenset(values)) for key, values in writes.either.items())
        return {prefix + "kv_indices": indices, prefix + "kv_indptr": dict(writes.kv_indptr)}

    def need(self, launch: Launch) -> int:
        return self.runtime(launch).need()

    def launch(self, kernel, buffers, launch: Launch) -> None:
        from kvfence.contracts.draft.targets import abi_launcher

        c = launch.case.config
        prefix = "window_" if c.is_rail else ""
        launcher = abi_launcher(None if c.is_rail else kernel, kernel if c.is_rail else None,
                                launch.kernel == "reference-blocked")
        kw = dict(req_pool_indices=buffers["req_pool_indices"], req_to_token=buffers["req_to_token"],
                  seq_lens=buffers["seq_lens"], kv_indices=buffers[prefix + "kv_indices"],
                  kv_indptr=buffers[prefix + "kv_indptr"], positions=buffers["positions"], topk=c.topk,
                  num_steps=c.num_steps, page_size=c.page_size)
        if c.is_family:
            kw.update(contract=c.contract, window_size=c.window_size, sink_size=c.sink_size,
                      entry_page_size=c.entry_page_size, v2p=buffers.get("v2p"))
        launcher(**kw)

    def segments(self, launch: Launch):
        """The oracle's program segments of the launch (``s, b, k, start, stop`` each)."""
        return self._writes(launch).segments

    def _writes(self, launch: Launch):
        """The oracle's write set of the launch (computed once per launch: ``owner`` asks it per element)."""
        runtime = self.runtime(launch)
        cache = launch.case.__dict__.setdefault("_writes", {})
        key = (runtime.config.mode, runtime.launch().num_seqs)
        if key not in cache:
            cache.clear()
            cache[key] = runtime.expected()
        return cache[key]

    # -- what the engine counts ---------------------------------------------------------------------------
    def keys(self, launch: Launch) -> Keys:
        """Config: the runner's config (topk first: the coverage plot's panels); structure: the lengths (and so
        positions: the kernel makes the same stores at the same addresses whatever pool rows and token table it
        reads); reads: the pool rows; edges: ``domain.boundary_classes``; requests: the launched rows."""
        case = launch.case
        config = case.config.bind(launch.sizing, launch.mode, launch.layout)
        data = case.config.to_dict()
        data.pop("buckets", None)
        raw = case.batch.raw_bs
        return Keys(config=tuple((k, v) for k, v in data.items()) + (("buckets", case.config.buckets),),
                    structure=case.batch.seq_lens, reads=case.batch.req_pool_indices,
                    edges=tuple(sorted(boundary_classes(config, case.batch.seq_lens, raw))),
                    requests=config.bucket_for(raw) if launch.mode == "graph" else raw)

    def owner(self, launch: Launch, table: str, row: int, column: int):
        """Program ``(s, b, k)`` whose segment of step row ``s`` holds ``column`` (kv_indices), or whose column it is
        (kv_indptr)."""
        c = launch.case.config
        if table.endswith("kv_indptr"):
            bs = self.runtime(launch).launch().num_seqs * c.topk
            if not 1 <= column <= bs:
                return None
            b, k = (0, 0) if column == bs else divmod(column, c.topk)
            return (row, b, k)
        return next(((s.s, s.b, s.k) for s in self._writes(launch).segments
                     if s.s == row and s.start <= column < s.stop), None)

    # -- the production path ------------------------------------------------------------------------------
    def checker(self, plan):
        from kvfence.contracts.draft.checker import DraftChecker

        return DraftChecker(self, plan)

    def checker_bytes(self, launch: Launch) -> int:
        """What ``DraftChecker`` holds for the launch's config beside the tables (``runner_buffers.runner_bytes``:
        the runner's guarded outputs at ``max_bs``, its guarded pool with the verifier's copy and graph temporaries;
        a dirty case's full verdict reads host snapshots). Its buffers stand in for the tables there, so the engine's
        sum of the two (``launch_bytes``) bounds what either path allocates."""
        return runner_bytes(launch.case.config.bind(launch.sizing, launch.mode, launch.layout))

    def report(self, record: dict, findings: List[dict]) -> str:
        from kvfence.contracts.draft.buffer_map import case_map_with_legend

        return str(case_map_with_legend(_runtime_record(record), findings))


def _runtime_record(record: dict) -> dict:
    """A summary's case record as the buffer map reads it: the runner's config (with the launch's settings) and
    the batch; a record written before launches has them at its top already."""
    if "batch" in record:
        return record
    launch = record.get("case") or {}
    case = launch.get("case") or {}
    config = dict(case.get("config") or {}, sizing=launch.get("sizing"), mode=launch.get("mode"),
                  layout=launch.get("layout", "redzone"))
    return dict(record, config=config, batch=case.get("batch"), kernel=launch.get("kernel"))


DRAFT = DraftContract("draft", "docs/contract.md §2-§4", *REFERENCE_KERNELS["draft"])
WINDOW_RAIL = DraftContract("window-rail", "docs/contract.md §6", *REFERENCE_KERNELS["window-rail"])
