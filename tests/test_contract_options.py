"""Options a contract declares (``kvfence.contract.Option``): the declaration checked when it is made, the command
line built from the named contract's options (``fuzz --contract C --help`` lists C's and only C's), a contract's own
flag (the toy fixture's ``--stride``) parsed, validated, pinned into its draws, kept in its case file and replayed by
``repro``, and ``campaign``/``check-contract``/``--shard``/``sweep`` taking them as ``fuzz`` does."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvfence.cli import build_parser
from kvfence.contract import Domain, Option
from kvfence.engine import registry
from kvfence.engine.plan import RunPlan
from kvfence.engine.record_check import static_problems
from kvfence.errors import BadInput

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "tests" / "fixtures" / "toy_contract"
#: The draft kernel's flags before they were its declared options (``kvfence fuzz --help`` listed them for all).
DRAFT_FLAGS = ("--topk", "--num-steps", "--page-size", "--ctx", "--max-bs", "--window", "--sink", "--entry-page-size",
               "--translate", "--family", "--seq-len-limit")


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.syspath_prepend(str(TOY))
    with registry.registered("toy-copy", "toy_contract:TOY"):
        yield registry.get("toy-copy")


def _kvfence(*argv, cwd, timeout=600):
    """``python -m kvfence`` seeing the toy contract registered, as an installed package's entry point would be."""
    sys.path.insert(0, str(TOY))
    try:
        with registry.registered("toy-copy", "toy_contract:TOY"):
            env = dict(os.environ, TRITON_INTERPRET="1", **registry.child_env())
    finally:
        sys.path.remove(str(TOY))
    return subprocess.run([sys.executable, "-m", "kvfence", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("kwargs, said", [
    (dict(name="no-dash"), "the name must be a Python identifier"),
    (dict(name="n", type=list), "type must be int, float or str"),
    (dict(name="n", default=0, bounds=(1, None)), "its default 0 is refused by its own rules (expected a positive "
                                                  "integer, got 0)"),
    (dict(name="n", type=str, choices=("a", 2)), "choices must be a non-empty tuple of str values"),
    (dict(name="n", type=str, bounds=(0, 1)), "bounds must be (low, high) numbers"),
    (dict(name="n", bounds=(3, 1)), "bounds must be (low, high) numbers"),
    (dict(name="n", shard=(1, 2)), "shard must be a callable"),
])
def test_a_declaration_that_breaks_the_rules_is_one_line_when_made(kwargs, said):
    with pytest.raises(BadInput) as exc:
        Option(**kwargs)
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_a_value_is_parsed_and_checked_in_one_line_naming_what_it_must_be():
    stride = Option("stride", int, None, bounds=(1, 8))
    assert stride.flag == "--stride" and stride.key == "stride" and stride.parse("3") == 3
    for text, said in (("0", "expected an integer in [1, 8], got 0"), ("x", "expected an integer in [1, 8], got 'x'"),
                       ("²", "got '²'"), ("9" * 30, "expected an integer")):
        with pytest.raises(BadInput, match=r"^" + "expected"):
            stride.parse(text)
        assert said in str(pytest.raises(BadInput, stride.parse, text).value)
    with pytest.raises(BadInput, match=r"^--stride: expected an integer in \[1, 8\], got True$"):
        stride.check(True)
    mode = Option("fill_mode", str, "zeros", choices=("zeros", "ones"), pin="fill")
    assert mode.flag == "--fill-mode" and mode.key == "fill" and mode.parse("ones") == "ones"
    with pytest.raises(BadInput, match="expected one of zeros, ones, got 'twos'"):
        mode.parse("twos")
    assert Option("rate", float, bounds=(0, 1)).parse("0.5") == 0.5
    with pytest.raises(BadInput):
        Option("rate", float, bounds=(0, 1)).parse("nan")


def test_the_record_check_refuses_options_that_are_no_tuple_of_options_or_declare_a_flag_twice(toy):
    for options, said in (({"stride": None}, "options must be a tuple of kvfence.contract.Option"),
                          ((Option("stride"), Option("stride", pin="other")), "declare the flag --stride twice"),
                          ((Option("a", pin="k"), Option("b", pin="k")), "declare the draw field k twice")):
        type(toy).options = options
        try:
            problems = static_problems("toy-copy", "toy_contract:TOY", toy)
        finally:
            del type(toy).options
        assert any(said in p for p in problems), problems


def _help(*words) -> str:
    fuzz = build_parser("kvfence", ["fuzz", *words], child=True)._subparsers._group_actions[0].choices["fuzz"]
    return fuzz.format_help()


def test_fuzz_help_lists_the_named_contracts_options_and_no_other(toy):
    draft, toy_help, pages = _help(), _help("--contract", "toy-copy"), _help("--contract=flashmla-page-table")
    assert all(flag in draft for flag in DRAFT_FLAGS) and "--stride" not in draft and "--dcp-size" not in draft
    assert "contract toy-copy's options" in toy_help and "--stride STRIDE" in toy_help
    assert not any(flag in toy_help for flag in DRAFT_FLAGS)
    assert not any(flag in pages for flag in DRAFT_FLAGS + ("--stride",))
    assert "--dcp-size" in _help("--contract", "req-to-token")


def test_a_contracts_option_that_is_one_of_kvfences_own_flags_is_one_line(toy):
    for name in ("seed", "func", "fuzz_defaults"):
        type(toy).options = (Option(name),)
        try:
            with pytest.raises(BadInput, match=f"contract 'toy-copy': its option --{name.replace('_', '-')} ") as exc:
                _help("--contract", "toy-copy")
        finally:
            del type(toy).options
        assert "rename it" in str(exc.value)


def test_the_toy_contracts_stride_is_pinned_into_its_draws_and_dealt_by_a_shard(toy):
    from hypothesis import given, settings

    from kvfence.engine.run import check_pins, shard_fields

    seen = []

    @settings(max_examples=20, database=None)
    @given(toy.cases(Domain("cpu", pins={"stride": 3})))
    def draw(case):
        seen.append(case.stride)

    draw()
    assert set(seen) == {3}
    assert shard_fields(toy, RunPlan(contract="toy-copy")) == {"stride": (1, 2, 3)}
    assert shard_fields(toy, RunPlan(contract="toy-copy", pins={"stride": 2})) == {"stride": (2,)}
    with pytest.raises(BadInput, match=r"^--stride: expected an integer in \[1, 8\], got 9$"):
        check_pins(toy, {"stride": 9})  # a plan's pin (the API, a plan file) is checked as the flag is
    with pytest.raises(BadInput, match=r"--contract toy-copy takes no --topk \(its options: --stride\)"):
        check_pins(toy, {"topk": 2})


def test_campaign_and_check_contract_take_the_contracts_own_flag(toy):
    from kvfence.cli import campaign
    from kvfence.cli.check_contract import _pins
    from kvfence.cli.common import parse_command_line

    words = ["campaign", "--contract", "toy-copy", "--stride", "2", "--device", "cpu"]
    args = parse_command_line(build_parser("kvfence", words, child=True), words)
    assert campaign._command_line_target(args)["stride"] == 2  # handed to every shard's fuzz as --stride 2
    assert campaign._check_target(["--contract", "toy-copy", "--stride", "2"]).stride == 2
    with pytest.raises(BadInput, match="unrecognized arguments: --stride 2"):
        campaign._check_target(["--contract", "flashmla-page-table", "--stride", "2"])
    with pytest.raises(BadInput, match=r"--contract flashmla-page-table takes no --topk \(its options: none;"):
        campaign._check_target(["--contract", "flashmla-page-table", "--topk", "2"])  # a flag of kvfence's draft
    assert _pins(toy, ["stride=2"]) == {"stride": 2}
    with pytest.raises(BadInput, match=r"--pin 'stride=0': expected an integer in \[1, 8\], got 0"):
        _pins(toy, ["stride=0"])


def test_the_sweeps_canary_pins_what_the_options_declare_for_it():
    from kvfence.cli.sweep import cmd_sweep  # noqa: F401 - the command whose canary phase reads Option.canary

    draft = registry.get("draft")
    assert {o.key: o.canary for o in draft.options if o.canary is not None} == {"family": "off"}


def test_a_plug_ins_flag_is_parsed_in_its_child_and_refused_on_another_contract(tmp_path):
    """A plug-in's record is loaded only in the boundary child, which parses the command line: a bad ``--stride`` is
    its one line, exit 2; on the draft kernel ``--stride`` is argparse's line. (``fuzz --stride 3`` pinned, kept
    in case files and replayed: tests/test_contract_isolation.py, on the toy installed as a package.)"""
    bad = _kvfence("fuzz", "--contract", "toy-copy", "--stride", "0", "--device", "cpu", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr == "kvfence: error: fuzz: argument --stride: expected an integer in " \
                                                 "[1, 8], got 0\n", bad.stderr
    other = _kvfence("fuzz", "--stride", "3", "--device", "cpu", cwd=tmp_path)
    assert other.returncode == 2 and other.stderr == "kvfence: error: unrecognized arguments: --stride 3\n"
