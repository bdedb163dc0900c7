"""Shipped sizing (kvfence.contracts.draft.shipped_wheel): the buffer sizing a release ships, read from its wheel,
and used.

The wheels here are synthetic: tiny backends and a CUDA-graph runner written for these tests (no SGLang
code), zipped with the classic-ABI kernel of tests/test_upstream.py. They cover the call-site rule (request
count vs token count), a helper function for the width, a host check (right and wrong), a constructor
refusing topk > 1, an unknown name (unreadable) and a malicious body that must never run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_upstream import FAKE_MODULE, MODULE, kvfence, make_wheel, one_line_exit_2

from kvfence.contracts.draft import shipped_sizing, shipped_wheel
from kvfence.errors import BadInput
from kvfence.release import wheel_ast

VERSION = "0.0.7"
BACKENDS = "sglang/srt/layers/attention/toy_backends.py"
UTILS = "sglang/srt/speculative/toy_utils.py"
RUNNER = "sglang/srt/speculative/eagle_draft_cuda_graph_runner.py"
MARKER_NAME = "kvfence-shipped-pwned"

# Width and check helpers the backends call (their return expressions are read, never run).
TOY_UTILS = '''\
def row_width(num_seqs, topk, ctx):
    """A helper with a docstring, an assert and a local before its return."""
    assert num_seqs > 0
    per_branch = ctx
    return num_seqs * topk * per_branch


def used_len(seq_lens_sum, topk, bs, num_steps):
    return seq_lens_sum * topk + bs * num_steps


def used_len_wrong(seq_lens_sum, topk, bs, num_steps):
    return seq_lens_sum * topk


def fits(used, capacity, what=""):
    assert used <= capacity, what


def sneaky(n):
    open("MARKER", "w").write("ran")
    return n
'''.replace("MARKER", MARKER_NAME)

# The runner passes both counts: which one a backend's parameter gets is the call-site rule.
TOY_RUNNER = '''\
class EAGLEDraftCudaGraphRunner:
    def __init__(self, eagle_worker):
        self.model_runner = model_runner = eagle_worker.model_runner
        server_args = model_runner.server_args
        self.topk = server_args.speculative_eagle_topk
        self.max_bs = max(self.capture_bs)
        self.max_num_token = self.max_bs * self.topk
        self.model_runner.draft_attn_backend.init_cuda_graph_state(self.max_bs, self.max_num_token)
'''

_LAUNCH = '''
    def common_template(self, forward_batch, kv_indices_buffer, call_fn):
        num_seqs = forward_batch.batch_size
        bs = self.topk * num_seqs
        seq_lens_sum = forward_batch.seq_lens_sum
        {check}
        self.generate_draft_decode_kv_indices[(self.speculative_num_steps, num_seqs, self.topk)](
            forward_batch.req_pool_indices, forward_batch.req_to_token, forward_batch.seq_lens,
            kv_indices_buffer, self.kv_indptr, forward_batch.positions, self.pool_len,
            kv_indices_buffer.shape[1], self.kv_indptr.shape[1], 1, 1, 1, 1)

    def init_forward_metadata(self, forward_batch):
        kv_indices = torch.zeros((self.speculative_num_steps, {eager}), dtype=torch.int32)
        self.common_template(forward_batch, kv_indices, None)

    def init_cuda_graph_state(self, max_bs, max_num_tokens):
        self.cuda_graph_kv_indices = torch.zeros((self.speculative_num_steps, {graph}), dtype=torch.int32)
'''


def backend(name: str, graph: str, *, eager: str = "forward_batch.batch_size * self.topk * self.max_context_len",
            check: str = "pass", init: str = "pass", base: str = "") -> str:
    head = (f"class {name}{f'({base})' if base else ''}:\n"
            "    def __init__(self, model_runner, topk, speculative_num_steps):\n")
    head += f"        {init}\n        self.topk = topk\n        self.speculative_num_steps = speculative_num_steps\n"
    return head + _LAUNCH.format(check=check, eager=eager, graph=graph)


GOOD_CHECK = "fits(used_len(seq_lens_sum, self.topk, bs, self.speculative_num_steps), kv_indices_buffer.shape[1])"
LAX_CHECK = ("assert used_len_wrong(seq_lens_sum, self.topk, bs, self.speculative_num_steps) "
             "<= kv_indices_buffer.shape[1]")
TOY_BACKENDS = "\n\n".join([
    "import torch\nfrom sglang.srt.speculative.toy_utils import row_width, used_len, used_len_wrong, fits, sneaky\n"
    "open('" + MARKER_NAME + "', 'w')  # module-level code: runs only if the module is imported\n",
    # The seed's bug: a request count times ctx, no topk factor.
    backend("RequestsBackend", "max_bs * self.max_context_len"),
    # The same expression text, given a token count by the runner: correct (up to the context limit).
    backend("TokensBackend", "max_num_tokens * self.max_context_len"),
    # Through a helper of the wheel, with the fix's host check.
    backend("HelperCheckedBackend", "row_width(max_bs, self.topk, self.max_context_len)", check=GOOD_CHECK),
    # A check that forgets the draft tokens: admits overflows at the context limit.
    backend("LaxCheckBackend", "row_width(max_bs, self.topk, self.max_context_len)", check=LAX_CHECK),
    # Room for the draft tokens: never overflows.
    backend("SafeBackend", "max_bs * self.topk * (self.max_context_len + self.speculative_num_steps)",
            eager="forward_batch.batch_size * self.topk * (self.max_context_len + self.speculative_num_steps)"),
    backend("RefusingBackend", "max_bs * (self.max_context_len + self.speculative_num_steps)",
            init="if topk > 1:\n            raise ValueError('topk > 1 is not supported')"),
    backend("MysteryBackend", "max_bs * self.topk * self.mystery_factor"),
    backend("SneakyBackend", "sneaky(max_bs) * __import__('os').system('touch " + MARKER_NAME + "')"),
])
# A subclass in another file (found by its base, not by a list of paths), inheriting buffers and launch.
TOY_SUBCLASS = ("from sglang.srt.layers.attention.toy_backends import RequestsBackend\n\n\n"
                "class RenamedBackend(RequestsBackend):\n    def extra(self):\n        return 0\n")


def toy_wheel(folder: Path, version: str = VERSION, *, backends: bool = True) -> Path:
    modules = {MODULE: FAKE_MODULE, UTILS: TOY_UTILS, RUNNER: TOY_RUNNER}
    if backends:
        modules[BACKENDS] = TOY_BACKENDS
        modules["sglang/srt/layers/moved/renamed.py"] = TOY_SUBCLASS
    return make_wheel(folder, version, modules)


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shipped")
    return shipped_wheel.read_wheel(toy_wheel(folder))["backends"]


def test_backends_are_found_by_what_launches_the_kernel(record):
    assert sorted(record) == sorted(["RequestsBackend", "TokensBackend", "HelperCheckedBackend", "LaxCheckBackend",
                                     "SafeBackend", "RefusingBackend", "MysteryBackend", "SneakyBackend",
                                     "RenamedBackend"])
    assert record["RenamedBackend"]["file"] == "sglang/srt/layers/moved/renamed.py"
    assert record["RenamedBackend"]["graph"]["formula"] == record["RequestsBackend"]["graph"]["formula"]


def test_call_site_rule_request_count_vs_token_count(record):
    requests, tokens = record["RequestsBackend"]["graph"], record["TokensBackend"]["graph"]
    assert requests["backend_formula"] == "max_bs * ctx" and requests["params"]["max_bs"]["unit"] == "requests"
    assert (tokens["backend_formula"] == "max_num_tokens * ctx"
            and tokens["params"]["max_num_tokens"]["unit"] == "tokens")
    values = {"requests": 3, "topk": 4, "ctx": 10, "steps": 2}
    assert wheel_ast.evaluate(requests["tree"], values) == 30
    assert wheel_ast.evaluate(tokens["tree"], values) == 120
    assert requests["params"]["max_bs"]["source"] == f"{RUNNER}:8"


def test_helper_width_and_host_check_are_read_through_their_returns(record):
    b = record["HelperCheckedBackend"]
    assert b["graph"]["formula"] == "requests * topk * ctx"
    assert b["host_check"]["formula"] == "sum_seq_lens * topk + topk * requests * steps"
    assert record["LaxCheckBackend"]["host_check"]["formula"] == "sum_seq_lens * topk"
    assert record["RequestsBackend"]["host_check"] is None


def test_refusal_and_unreadable_names(record):
    assert record["RefusingBackend"]["refuses"]["refuses"] == "topk > 1"
    state, text = shipped_sizing.site_state(record["MysteryBackend"]["graph"])
    assert state == "unreadable" and "self.mystery_factor" in text and f"{BACKENDS}:" in text


def test_malicious_body_never_runs(record, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    again = shipped_wheel.read_wheel(toy_wheel(tmp_path / "w"))["backends"]["SneakyBackend"]
    assert shipped_sizing.site_state(again["graph"])[0] == "unreadable"
    assert not list(tmp_path.rglob(MARKER_NAME)) and not Path(MARKER_NAME).exists()


def test_upstream_sizing_prints_formulas_and_sources(tmp_path):
    cache = tmp_path / "cache"
    wheel = toy_wheel(tmp_path / "wheels")
    proc = kvfence("upstream", "sizing", VERSION, cache=cache, wheel_dir=wheel.parent)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "RequestsBackend: " in out and "graph  W = requests * ctx" in out and "[requests]" in out
    assert "refuses topk > 1" in out and "unreadable" in out
    assert not list(Path(__file__).resolve().parents[1].glob(MARKER_NAME))
    record = json.loads((cache / f"sglang-{VERSION}" / shipped_wheel.RECORD_FILE).read_text())
    assert record["format"] == shipped_wheel.FORMAT


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_bad_input_unknown_backend_and_release_without_backends(tmp_path):
    cache = tmp_path / "cache"
    wheels = tmp_path / "wheels"
    toy_wheel(wheels)
    toy_wheel(wheels, "0.0.8", backends=False)
    proc = kvfence("fuzz", "--sizing", f"sglang=={VERSION}:NoSuchBackend", "--max-examples", "1", "--device", "cpu",
                   "--out", str(tmp_path / "o"), cache=cache, wheel_dir=wheels)
    one_line_exit_2(proc, "NoSuchBackend", "RequestsBackend")
    one_line_exit_2(kvfence("upstream", "sizing", "0.0.8", cache=cache, wheel_dir=wheels), "no draft backend")


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_matrix_shipped_names_each_failure_class_and_its_case_replays(tmp_path):
    cache = tmp_path / "cache"
    wheel = toy_wheel(tmp_path / "wheels")
    out = tmp_path / "m"
    # An earlier run's report in the folder moves aside; what the matrix did not write stays.
    (out / VERSION).mkdir(parents=True)
    (out / "report.md").write_text("the earlier report\n")
    (out / "notes.txt").write_text("the user's own file\n")
    proc = kvfence("upstream", "matrix", "--shipped", "--versions", VERSION, "--device", "cpu", "--out", str(out),
                   "--shipped-ctx", "8", "--shipped-steps", "2", "--shipped-max-bs", "2", "--shipped-max-topk", "2",
                   "--json", str(tmp_path / "asked.json"), cache=cache, wheel_dir=wheel.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    earlier = list((out / "earlier").iterdir())
    assert len(earlier) == 1 and (earlier[0] / "report.md").read_text() == "the earlier report\n"
    assert (earlier[0] / VERSION).is_dir() and (out / "notes.txt").is_file()
    assert f"moved to {earlier[0]}" in proc.stderr
    # The printed report fits 120 columns, names backends as SGLang's flag does where one does, and lists
    # each failure's case file relative to the report.
    assert max(len(line) for line in proc.stdout.splitlines()[:-1]) <= 120, proc.stdout  # the last: a path
    assert "| releases | " in proc.stdout and "./" + VERSION + "/RequestsBackend-graph/cases/" in proc.stdout
    assert sum(line.startswith("kvfence [") for line in proc.stderr.splitlines()) == 1  # one release: one line
    doc = json.loads((out / "shipped.json").read_text())
    assert json.loads((tmp_path / "asked.json").read_text()) == doc  # --json is written, not only checked
    cells = {(c["backend"], c["mode"]): c for c in doc["rows"][0]["cells"]}
    buggy = cells[("RequestsBackend", "graph")]
    assert buggy["status"] == "silent overflow" and not buggy["case"]["at_context_limit"]
    assert "SIZING_VIOLATION" in buggy["kinds"] and "GUARD_OVERWRITE" in buggy["kinds"]
    limit = cells[("TokensBackend", "graph")]
    assert limit["status"] == "silent overflow" and limit["case"]["at_context_limit"]
    assert cells[("HelperCheckedBackend", "graph")]["status"] == "host check fires"
    assert cells[("HelperCheckedBackend", "graph")]["kinds"] == ["HOST_CHECK_FIRED"]
    lax = cells[("LaxCheckBackend", "graph")]
    assert lax["status"] == "silent overflow" and "HOST_CHECK_ADMITS_OVERFLOW" in lax["kinds"]
    assert cells[("SafeBackend", "graph")]["status"] == "clean"
    assert cells[("SafeBackend", "eager")]["status"] == "clean"
    assert cells[("RefusingBackend", "graph")]["status"] == "topk > 1 refused"
    assert cells[("MysteryBackend", "graph")]["status"] == "unreadable"
    # The failing cell's case file replays on its own, naming the shipped sizing.
    replay = kvfence("repro", buggy["case_file"], "--device", "cpu", cache=cache)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "SIZING_VIOLATION" in replay.stdout and f"sglang=={VERSION}:RequestsBackend" in replay.stdout
    assert not list(tmp_path.rglob(MARKER_NAME))


#: The newer runner API: each replay calls ``init_forward_metadata_out_graph`` (capture: with ``in_capture=True``).
REPLAYING_RUNNER = TOY_RUNNER + '''
    def replay(self, forward_batch):
        self.model_runner.draft_attn_backend.init_forward_metadata_out_graph(forward_batch)
'''
REPLAY_BACKENDS = "\n\n".join([
    "import torch\n",
    backend("ReplayingBackend", "max_bs * self.max_context_len") + '''
    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        self.common_template(forward_batch, self.cuda_graph_kv_indices, None)
''',
    # As TRTLLM-MLA's draft backend from 0.5.13: the kernel only under in_capture, per-step planning at replay.
    '''class CaptureOnlyBackend(ReplayingBackend):
    def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
        if in_capture:
            return super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
        for step in self.attn_backends:
            step.init_forward_metadata_out_graph(forward_batch)
'''])


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_a_graph_site_whose_replay_never_launches_the_kernel_is_not_judged_by_its_width(tmp_path):
    """A backend whose replay path reaches no launch (only capture does) is ``not launched at replay`` in
    graph mode, named with its file:line, though its buffer is as small as its base's, which overflows."""
    modules = {MODULE: FAKE_MODULE, RUNNER: REPLAYING_RUNNER, BACKENDS: REPLAY_BACKENDS}
    wheel = make_wheel(tmp_path / "wheels", VERSION, modules)
    record = shipped_wheel.read_wheel(wheel)["backends"]
    assert "replay" not in record["ReplayingBackend"]["graph"]
    note = record["CaptureOnlyBackend"]["graph"]["replay"]
    assert f"CaptureOnlyBackend.init_forward_metadata_out_graph ({BACKENDS}:" in note and "if in_capture:" in note
    assert record["CaptureOnlyBackend"]["graph"]["formula"] == record["ReplayingBackend"]["graph"]["formula"]
    out = tmp_path / "m"
    proc = kvfence("upstream", "matrix", "--shipped", "--versions", VERSION, "--device", "cpu", "--out", str(out),
                   "--shipped-ctx", "8", "--shipped-steps", "2", "--shipped-max-bs", "2", "--shipped-max-topk", "2",
                   cache=tmp_path / "cache", wheel_dir=wheel.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    cells = {(c["backend"], c["mode"]): c for c in json.loads((out / "shipped.json").read_text())["rows"][0]["cells"]}
    assert cells[("ReplayingBackend", "graph")]["status"] == "silent overflow"
    assert cells[("CaptureOnlyBackend", "graph")]["status"] == "not launched at replay"
    assert cells[("CaptureOnlyBackend", "graph")]["detail"] == note
    assert cells[("CaptureOnlyBackend", "eager")]["status"] == "silent overflow"  # eager still launches it
    assert "| cap/wall | OVF/wall |" in proc.stdout and "`cap`: graph mode" in proc.stdout


#: FAKE_MODULE with its kv_indices stores taken out: a kernel that writes nothing, past its row or in it.
WRITES_NOTHING = [("        tl.store(row + t, tl.load(src + t, mask=t < L), mask=t < L)\n",
                   "        tl.load(src + t, mask=t < L)\n"),
                  ("    tl.store(row + L + j, tl.load(src + e + j, mask=j < n), mask=j < n)\n",
                   "    tl.load(src + e + j, mask=j < n)\n")]


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_a_silent_overflow_cell_needs_the_kernel_seen_writing_past_its_row(tmp_path):
    """The arithmetic (need > width) only predicts an overflow: a release whose kernel writes nothing is an
    ``error`` cell naming what the witness showed, never ``silent overflow``."""
    source = FAKE_MODULE
    for old, new in WRITES_NOTHING:
        assert old in source
        source = source.replace(old, new)
    modules = {MODULE: source, UTILS: TOY_UTILS, RUNNER: TOY_RUNNER, BACKENDS: TOY_BACKENDS}
    wheel = make_wheel(tmp_path / "wheels", VERSION, modules)
    out = tmp_path / "m"
    proc = kvfence("upstream", "matrix", "--shipped", "--versions", VERSION, "--device", "cpu", "--out", str(out),
                   "--shipped-ctx", "8", "--shipped-steps", "2", "--shipped-max-bs", "2", "--shipped-max-topk", "2",
                   cache=tmp_path / "cache", wheel_dir=wheel.parent)
    doc = json.loads((out / "shipped.json").read_text())
    cells = {(c["backend"], c["mode"]): c for c in doc["rows"][0]["cells"]}
    blind = cells[("RequestsBackend", "graph")]
    assert blind["status"] == "error", (blind, proc.stdout + proc.stderr)
    assert "wrote nothing past its row" in blind["detail"] and "MISSING_WRITE" in blind["detail"], blind
    assert "SIZING_VIOLATION" in blind["kinds"] and not {"GUARD_OVERWRITE", "STRAY_WRITE"} & set(blind["kinds"])
    assert not any(c["status"] == "silent overflow" for c in cells.values()), cells
    assert cells[("SafeBackend", "graph")]["status"] == "clean"


def test_config_sizes_each_mode_from_its_own_site_and_strategies_take_the_spec(tmp_path, monkeypatch):
    from hypothesis import given, settings

    from kvfence.contracts.draft.case import Config
    from kvfence.contracts.draft.strategies import configs

    wheel = toy_wheel(tmp_path / "wheels")
    monkeypatch.setenv("KVFENCE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVFENCE_WHEEL_DIR", str(wheel.parent))
    monkeypatch.setenv("KVFENCE_OFFLINE", "1")
    shipped_sizing.policy.cache_clear()
    spec = f"sglang=={VERSION}:RequestsBackend"
    graph = Config(topk=3, num_steps=2, ctx=10, max_bs=4, sizing=spec, mode="graph")
    eager = Config(topk=3, num_steps=2, ctx=10, max_bs=4, sizing=spec, mode="eager")
    assert graph.row_width(2) == 4 * 10  # max_bs * ctx: the request count, no topk factor
    assert eager.row_width(2) == 2 * 3 * 10  # batch_size * topk * ctx
    refusing = Config(topk=2, num_steps=2, ctx=10, max_bs=4, sizing=f"sglang=={VERSION}:RefusingBackend")
    with pytest.raises(Exception, match="refuses topk > 1"):
        refusing.row_width(1)

    @settings(max_examples=5, database=None, deadline=None)
    @given(configs(sizing=spec, mode="graph", topk=2))
    def widths_follow_the_shipped_formula(config):
        assert config.row_width(1) == config.max_bs * config.ctx

    widths_follow_the_shipped_formula()
    shipped_sizing.policy.cache_clear()


def test_names_that_refer_to_each_other_are_unreadable_not_a_hang(tmp_path):
    runner = TOY_RUNNER.replace("self.max_num_token = self.max_bs * self.topk",
                                "self.a = self.b\n        self.b = self.a\n        self.max_num_token = self.b")
    loop = backend("LoopBackend", "max_num_tokens * loop(max_bs)")
    utils = "def loop(n):\n    return loop(n) + 1\n"
    wheel = make_wheel(tmp_path, VERSION, {MODULE: FAKE_MODULE, RUNNER: runner, UTILS: utils,
                                           BACKENDS: "from sglang.srt.speculative.toy_utils import loop\n\n" + loop})
    graph = shipped_wheel.read_wheel(wheel)["backends"]["LoopBackend"]["graph"]
    assert shipped_sizing.site_state(graph)[0] == "unreadable"


def test_old_cache_format_is_fetched_again_and_a_tampered_record_is_one_line_exit_2(tmp_path):
    cache = tmp_path / "cache"
    wheel = toy_wheel(tmp_path / "wheels")
    assert kvfence("upstream", "fetch", VERSION, cache=cache, wheel_dir=wheel.parent).returncode == 0
    folder = cache / f"sglang-{VERSION}"
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / shipped_wheel.RECORD_FILE).unlink()
    (folder / "manifest.json").write_text(json.dumps({**manifest, "format": 1}))  # as kvfence before shipped sizing
    proc = kvfence("upstream", "sizing", VERSION, cache=cache, wheel_dir=wheel.parent)
    assert proc.returncode == 0 and "RequestsBackend" in proc.stdout, proc.stderr
    record = folder / shipped_wheel.RECORD_FILE
    record.write_text(record.read_text().replace('"max_bs * ctx"', '"max_bs * topk * ctx"'))
    one_line_exit_2(kvfence("upstream", "sizing", VERSION, cache=cache), "corrupt", shipped_wheel.RECORD_FILE)


def _tampered(record: dict):
    """Records of the right format whose fields have the wrong types or shapes, one per kind of damage."""
    name = sorted(record["backends"])[0]

    def edit(fn):
        r = json.loads(json.dumps(record))
        fn(r["backends"][name])
        return r
    yield {"format": shipped_wheel.FORMAT, "backends": []}
    yield {"format": shipped_wheel.FORMAT, "backends": {name: 7}}
    yield edit(lambda b: b.update(graph=None))
    yield edit(lambda b: b.update(graph={"formula": 3, "source": "x", "tree": ["int", 1]}))
    yield edit(lambda b: b["graph"].update(tree=["sym", "__import__"]))
    yield edit(lambda b: b["graph"].update(tree=["**", ["int", 2], ["int", 3]]))
    yield edit(lambda b: b["graph"].update(tree=["int", "9" * 30]))
    yield edit(lambda b: b["graph"].update(params=[1]))
    yield edit(lambda b: b["eager"].update(unreadable=5) if "unreadable" in b["eager"]
               else b.update(eager={"unreadable": 5}))
    yield edit(lambda b: b.update(bases="A"))
    yield edit(lambda b: b.update(line="12"))
    yield edit(lambda b: b.update(host_check={"formula": "x", "source": "y", "tree": ["sym", "requests"]}))
    yield edit(lambda b: b.update(refuses={"refuses": 1}))
    deep = ["int", 1]
    for _ in range(5000):
        deep = ["+", deep, ["int", 1]]
    yield edit(lambda b: b["graph"].update(tree=deep))


def test_a_tampered_record_with_its_sha256_in_the_manifest_is_one_line_exit_2(tmp_path):
    """A record someone edited and re-hashed into the manifest is read only after its schema and types are
    checked: every kind of damage is one line naming the record, exit 2, never a traceback."""
    from kvfence.release.wheels import sha256_hex as _sha256

    cache = tmp_path / "cache"
    wheel = toy_wheel(tmp_path / "wheels")
    assert kvfence("upstream", "fetch", VERSION, cache=cache, wheel_dir=wheel.parent).returncode == 0
    folder = cache / f"sglang-{VERSION}"
    record_path, manifest_path = folder / shipped_wheel.RECORD_FILE, folder / "manifest.json"
    original, manifest = json.loads(record_path.read_text()), json.loads(manifest_path.read_text())
    assert shipped_wheel.validate_record(original) is original
    for bad in _tampered(original):
        with pytest.raises(BadInput):
            shipped_wheel.validate_record(bad)
    for bad in list(_tampered(original))[2:5]:  # the command users run, on three of them
        text = json.dumps(bad)
        record_path.write_text(text)
        manifest_path.write_text(json.dumps({**manifest, "shipped_sha256": _sha256(text.encode())}))
        one_line_exit_2(kvfence("upstream", "sizing", VERSION, cache=cache), "corrupt", shipped_wheel.RECORD_FILE)


# -- a hostile wheel stays harmless: bounded work, bounded memory, the kernel still extracted --------------
def _hostile_wheel(folder: Path, version: str, graph: str, helpers: str = "", extra=None) -> Path:
    import re

    utils = TOY_UTILS + "\n\n" + helpers
    names = ", ".join(re.findall(r"^def (\w+)", helpers, re.M)) or "row_width"
    text = f"import torch\nfrom sglang.srt.speculative.toy_utils import {names}\n\n" + backend("HostileBackend", graph)
    modules = {MODULE: FAKE_MODULE, UTILS: utils, RUNNER: TOY_RUNNER, BACKENDS: text, **(extra or {})}
    return make_wheel(folder, version, modules)


def _chain(n: int) -> str:
    """``a1 = a0 * a0`` ... ``an``: each line doubles what a by-value expansion does."""
    lines = ["def chained(max_bs):", "    a0 = max_bs"]
    lines += [f"    a{i} = a{i - 1} * a{i - 1}" for i in range(1, n + 1)] + [f"    return a{n}"]
    return "\n".join(lines) + "\n"


def _nested_helpers(n: int) -> str:
    out = ["def h0(x):\n    return x * x\n"]
    out += [f"def h{i}(x):\n    return h{i - 1}(x) * h{i - 1}(x)\n" for i in range(1, n + 1)]
    return "\n".join(out)


@pytest.mark.parametrize("graph,helpers,why", [
    ("chained(max_bs)", _chain(22), "evaluation steps"),
    ("h11(max_bs)", _nested_helpers(11), ""),  # too many steps or too deep: unreadable either way
    ("max_bs" + " + 1" * 2000, "", ""),  # 2,000 operators deep: parses, then too deep to expand, not a traceback
    ("max_bs * 10 ** 400", "", ""),
    ("max_bs * 123456789012345678901234567890", "", "larger than 2^62"),
    # 200 operators: expandable, but deeper than a record may hold (the reader wrote it, and then refused
    # to read its own record back as a corrupt cache entry)
    ("max_bs" + " * max_bs" * 200, "", "nested more than 64 deep"),
])
def test_a_runaway_site_is_unreadable_on_time_and_the_kernel_is_still_extracted(tmp_path, graph, helpers, why):
    import resource
    import time

    wheel = _hostile_wheel(tmp_path / "w", "0.0.9", graph, helpers)
    start, peak = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    record = shipped_wheel.read_wheel(wheel)["backends"]["HostileBackend"]
    assert time.monotonic() - start < 10
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200 * 1024  # KiB: under 200 MB more
    assert "unreadable" in record["graph"], record["graph"]
    assert why in record["graph"]["unreadable"]["why"]
    cache = tmp_path / "cache"
    proc = kvfence("upstream", "fetch", "0.0.9", cache=cache, wheel_dir=wheel.parent)
    assert proc.returncode == 0, proc.stderr  # extracting the kernel does not wait on the sizing
    sizing = kvfence("upstream", "sizing", "0.0.9", cache=cache, wheel_dir=wheel.parent)
    assert sizing.returncode == 0 and "unreadable" in sizing.stdout, sizing.stdout + sizing.stderr


def test_a_zip_bomb_member_is_left_out_not_inflated(tmp_path):
    """A member that inflates past ``MAX_MEMBER_BYTES`` is never read whole: it is left out, named, and the
    kernel (another member) is extracted as usual."""
    import resource
    import zipfile

    bomb = "x = 0\n" + "#" * (wheel_ast.MAX_MEMBER_BYTES + 1024)
    wheel = _hostile_wheel(tmp_path / "w", "0.0.9", "max_bs * self.max_context_len")
    with zipfile.ZipFile(wheel, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("sglang/srt/layers/attention/bomb.py", bomb)
    assert wheel.stat().st_size < 1 << 20  # a small file that inflates past the bound
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    doc = shipped_wheel.read_wheel(wheel)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 100 * 1024
    assert "sglang/srt/layers/attention/bomb.py" in doc["skipped_members"]
    assert doc["backends"]["HostileBackend"]["graph"]["formula"]


def test_kernel_extraction_reads_no_member_past_the_bound_and_names_what_it_left_out(tmp_path, monkeypatch):
    """The kernel's search reads every ``sglang/*.py`` member: each within ``MAX_MEMBER_BYTES`` (a bomb is
    left out, not inflated), and a release whose kernel is not found says which members were not read."""
    import zipfile

    from kvfence.contracts.draft import release_kernels

    monkeypatch.setattr(wheel_ast, "MAX_MEMBER_BYTES", 64 << 10)
    bomb = "x = 0\n" + "#" * (1 << 20)
    wheel = _hostile_wheel(tmp_path / "w", "0.0.9", "max_bs * self.max_context_len")
    with zipfile.ZipFile(wheel, "a", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("sglang/srt/layers/attention/bomb.py", bomb)
    reads = []
    real_open = zipfile.ZipFile.open

    def counting_open(self, member, *args, **kwargs):
        handle = real_open(self, member, *args, **kwargs)
        real_read = handle.read
        handle.read = lambda n=-1: reads.append(n) or real_read(n)
        return handle

    monkeypatch.setattr(zipfile.ZipFile, "open", counting_open)
    name, source = release_kernels._find_kernel_module("0.0.9", wheel)
    assert name == MODULE and "def generate_draft_decode_kv_indices(" in source
    assert reads and all(0 <= n <= wheel_ast.MAX_MEMBER_BYTES + 1 for n in reads)  # never a whole-member read
    without = make_wheel(tmp_path / "w2", "0.0.8", {"sglang/srt/x.py": "x = 1\n", "sglang/srt/bomb.py": bomb})
    with pytest.raises(release_kernels.Refused,
                       match=r"1 member\(s\) not read: sglang/srt/bomb.py \(\d+ bytes, more than 65536"):
        release_kernels._find_kernel_module("0.0.8", without)


def test_a_member_that_does_not_parse_is_named_when_no_backend_is_found(tmp_path):
    """A backend file nested past the parser reads as absent; the release's "no draft backend" line says
    which member could not be read (it may hold the backend)."""
    wheel = make_wheel(tmp_path / "w", "0.0.6", {MODULE: FAKE_MODULE, UTILS: TOY_UTILS, RUNNER: TOY_RUNNER,
                                                 BACKENDS: "from k import generate_draft_decode_kv_indices\n"
                                                           + "x = " + "(" * 300 + "1" + ")" * 300 + "\n"})
    record = shipped_wheel.validate_record(shipped_wheel.read_wheel(wheel))
    assert record["backends"] == {} and BACKENDS in record["skipped_members"]
    assert f"1 member(s) not read: {BACKENDS} (does not parse" in shipped_wheel.unread_note(record)


@pytest.mark.interpreter  # runs --device cpu in a subprocess
def test_one_shipped_matrix_command_runs_the_draft_family_and_a_table_contract(tmp_path):
    """``--contracts draft,trtllm-mha-page-table``: the draft family's tables (read per backend class) and the
    table contract's (read from its shipped sites) from one command, each in its own folder; --json holds the
    table contracts' document; exit 1 (both find overflows in this wheel)."""
    from test_contracts import _ADMISSION, TRTLLM_BACKEND

    ours = (Path(__file__).resolve().parents[1] / "kernels" / "page_table" / "trtllm_mha_page_table.py").read_text()
    modules = {MODULE: FAKE_MODULE, UTILS: TOY_UTILS, RUNNER: TOY_RUNNER, BACKENDS: TOY_BACKENDS, **_ADMISSION,
               "sglang/kernels/ops/attention/trtllm_mha_page_table.py": ours,
               "sglang/srt/layers/attention/trtllm_mha_backend.py":
                   TRTLLM_BACKEND.format(WIDTH="(self.max_context_len + self.page_size - 1) // self.page_size")}
    wheel = make_wheel(tmp_path / "wheels", VERSION, modules)
    out = tmp_path / "m"
    proc = kvfence("upstream", "matrix", "--shipped", "--contracts", "draft,trtllm-mha-page-table", "--versions",
                   VERSION, "--device", "cpu", "--out", str(out), "--shipped-ctx", "8", "--shipped-steps", "2",
                   "--shipped-max-bs", "2", "--shipped-max-topk", "2", "--json", str(tmp_path / "j.json"),
                   cache=tmp_path / "cache", wheel_dir=wheel.parent)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (out / "draft" / "shipped.json").is_file() and (out / "contracts" / "shipped.json").is_file()
    assert "RequestsBackend" in proc.stdout and "## trtllm-mha-page-table" in proc.stdout
    doc = json.loads((tmp_path / "j.json").read_text())
    assert doc["contracts"] == ["trtllm-mha-page-table"]
    assert doc == json.loads((out / "contracts" / "shipped.json").read_text())
    cell = doc["rows"][0]["cells"][0]
    assert "GUARD_OVERWRITE" in cell["kinds"], cell


def test_upstream_sizing_says_when_backend_classes_were_left_unread(tmp_path):
    """A wheel with more backend classes than kvfence reads: ``upstream sizing`` says so on its first line
    beside the count, instead of a count that reads as the whole wheel."""
    many = "\n\n".join(backend(f"Backend{i}", "max_bs * self.topk") for i in range(shipped_wheel.MAX_BACKENDS + 6))
    wheel = _hostile_wheel(tmp_path / "w", "0.0.9", "max_bs * self.topk",
                           extra={BACKENDS.replace(".py", "_more.py"): "import torch\n\n" + many})
    cache = tmp_path / "cache"
    sizing = kvfence("upstream", "sizing", "0.0.9", cache=cache, wheel_dir=wheel.parent)
    first = sizing.stdout.splitlines()[0]
    assert sizing.returncode == 0 and f"{shipped_wheel.MAX_BACKENDS} draft backend(s)" in first, sizing.stdout[:400]
    assert f"more than {shipped_wheel.MAX_BACKENDS}: the rest were not read" in first, first
