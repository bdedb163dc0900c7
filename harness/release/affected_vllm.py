"""``kvfence affected VERSION vllm serve MODEL ...``: is this vLLM deployment affected?

The vLLM twin of ``kvfence.release.affected``: it reads vLLM's own flags (``--block-size``, ``--max-model-len``,
``--speculative-config`` as JSON or dotted keys, ``--decode-context-parallel-size`` / ``-dcp``,
``--cp-kv-cache-interleave-size``, ``--model`` or ``vllm serve``'s positional model, ``--hf-config-path``) from
the launch command (``vllm serve ...`` or ``python -m vllm.entrypoints...``; or the flags alone under
``--project vllm``), and the model's ``config.json`` where it is on this host (a local model folder,
``--hf-config-path``, the Hugging Face cache): its ``architectures``, and ``max_position_embeddings`` when
``--max-model-len`` is not given. What the flags and the config do not say, the line says it assumed.

Each contract whose release knowledge answers vLLM deployments (``Shipped.vllm_affected``) gives its lines; the
verdicts, their rules and the exit codes are ``affected``'s (``Verdict``, ``exit_code``). ``kv_groups``: KV-cache
groups the deployer declares (``--kv-cache-group BLOCK_SIZE:BLOCKS``): a cache type of the model's own, which
neither the flags nor vLLM's own spec classes say, whose rows hold ``BLOCKS`` blocks of ``BLOCK_SIZE`` tokens.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from kvfence.errors import BadInput, require
from kvfence.release.affected_verdict import exit_code, progress

#: vLLM's default block size on CUDA when ``--block-size`` is not given (an attention backend may choose another).
ASSUMED_BLOCK = 16
ASSUMED_MAX_MODEL_LEN = 4096
#: The flags kvfence reads (for help texts and errors), vLLM's spellings (0.34.0 ``engine/arg_utils.py``).
FLAGS = ("--model", "--block-size", "--max-model-len", "--speculative-config", "--decode-context-parallel-size",
         "--cp-kv-cache-interleave-size", "--hf-config-path")
#: vLLM flags close in spelling to one kvfence reads, so not taken for its misspelling.
NEAR_FLAGS = ("--mamba-block-size", "--max-num-seqs", "--max-num-batched-tokens", "--prefill-context-parallel-size")
MAX_LEN = 1 << 24


@dataclass(frozen=True)
class KvGroup:
    """A KV-cache group the deployer declares: rows of ``blocks`` blocks of ``block_size`` tokens."""

    block_size: int
    blocks: int


@dataclass(frozen=True)
class VllmDeployment:
    """One vLLM deployment as its flags (and its model's config, where on this host) describe it."""

    version: str
    model: Optional[str]
    architectures: Tuple[str, ...]        # () where no config.json was read
    config_source: str                    # where the architectures were read, or why not
    block_size: int
    max_model_len: int
    spec_method: Optional[str]
    spec_tokens: int
    draft_model: Optional[str]
    draft_architectures: Tuple[str, ...]
    draft_config_source: str
    dcp: int
    cp_interleave: int
    kv_groups: Tuple[KvGroup, ...] = ()
    assumed: Tuple[str, ...] = ()

    project = "vllm"

    def describe(self) -> str:
        arch = f" ({', '.join(self.architectures)})" if self.architectures else ""
        spec = (f", {self.spec_method or 'speculative'} {self.spec_tokens} tokens"
                if self.spec_method or self.spec_tokens else "")
        return (f"vllm {self.version}, {self.model or 'model not named'}{arch}, block {self.block_size}, "
                f"max_model_len {self.max_model_len}{spec}" + (f", dcp {self.dcp}" if self.dcp > 1 else "")
                + "".join(f", group {g.block_size}x{g.blocks}" for g in self.kv_groups))

    def to_json(self) -> dict:
        return {"project": "vllm", "version": self.version, "model": self.model,
                "architectures": list(self.architectures), "config_source": self.config_source,
                "block_size": self.block_size, "max_model_len": self.max_model_len,
                "speculative_method": self.spec_method, "num_speculative_tokens": self.spec_tokens,
                "draft_model": self.draft_model, "draft_architectures": list(self.draft_architectures),
                "dcp": self.dcp, "cp_interleave": self.cp_interleave,
                "kv_cache_groups": [[g.block_size, g.blocks] for g in self.kv_groups], "assumed": list(self.assumed)}


def is_vllm_command(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is a vLLM launch command: ``vllm serve ...`` or ``python -m vllm.entrypoints...``."""
    tokens = list(argv)
    return (any(a.rsplit("/", 1)[-1] == "vllm" and b == "serve" for a, b in zip(tokens, tokens[1:]))
            or any(t.startswith("vllm.entrypoints") for t in tokens))


class _Refuse(argparse.ArgumentParser):
    def error(self, message):
        raise BadInput(f"vLLM flags: {message}")


def _parser() -> argparse.ArgumentParser:
    p = _Refuse(prog="vllm flags", add_help=False, allow_abbrev=False)
    p.add_argument("--model", default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--max-model-len", default=None)
    p.add_argument("--speculative-config", "-sc", default=None)
    p.add_argument("--decode-context-parallel-size", "-dcp", type=int, default=None)
    p.add_argument("--cp-kv-cache-interleave-size", type=int, default=None)
    p.add_argument("--hf-config-path", default=None)
    return p


def human_int(text: str, flag: str) -> Optional[int]:
    """vLLM's ``human_readable_int_or_auto`` (0.34.0 ``utils/argparse_utils.py``): ``4096``, ``32k`` (10^3),
    ``32K`` (2^10), ``1.5m``; ``-1`` or ``auto`` for the model's (None)."""
    text = text.strip()
    if text == "-1" or text.lower() == "auto":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", text)
    if match is None:
        raise BadInput(f"{flag} {text!r}: expected an integer such as 4096, 32k or 32K")
    number, suffix = match.groups()
    require(len(number) <= 20, f"{flag} {text[:40]!r}: a number of more than 20 digits")  # float() would be inf
    mult = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30,
            "T": 2**40}[suffix]
    require(suffix or "." not in number, f"{flag} {text!r}: a decimal needs a suffix (k, m, K, M)")
    return int(float(number) * mult)


def _spec_config(text: Optional[str], dotted: dict) -> dict:
    """``--speculative-config`` (JSON) with its dotted keys (``--speculative-config.method eagle``) on top."""
    spec = {}
    if text is not None:
        try:
            spec = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            raise BadInput(f"--speculative-config {text[:80]!r}: not JSON (or nested too deep)") from None
        require(isinstance(spec, dict), "--speculative-config: expected a JSON object")
    for key, value in dotted.items():
        try:
            spec[key] = json.loads(value)
        except (ValueError, RecursionError):
            spec[key] = value
    return spec


def _model_of(tokens: List[str], model_flag: Optional[str]) -> Optional[str]:
    """``--model``, else ``vllm serve``'s positional model (the first word after ``serve`` that is no flag)."""
    if model_flag:
        return model_flag
    for i, (a, b) in enumerate(zip(tokens, tokens[1:])):
        after = tokens[i + 2] if i + 2 < len(tokens) else "-"
        if a.rsplit("/", 1)[-1] == "vllm" and b == "serve" and not after.startswith("-"):
            return after
    return None


def hf_cache_dirs() -> List[Path]:
    """Where the Hugging Face hub keeps downloaded models on this host (``HF_HUB_CACHE``, ``HF_HOME/hub``)."""
    out = []
    if os.environ.get("HF_HUB_CACHE"):
        out.append(Path(os.environ["HF_HUB_CACHE"]))
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    out.append(Path(home) / "hub")
    return out


#: The largest config.json read (a model's is a few KiB; the bound keeps a hostile file from holding the run).
MAX_CONFIG_BYTES = 4 << 20


def read_config(model: Optional[str], config_path: Optional[str] = None) -> Tuple[Optional[dict], str]:
    """``(config.json, where)`` of a model on this host: ``config_path`` (a file or a folder), the model's own
    folder, or its snapshot in the Hugging Face cache; ``(None, why not)`` otherwise. Nothing is downloaded."""
    candidates = []
    if config_path:
        path = Path(config_path)
        candidates.append(path / "config.json" if path.is_dir() else path)
    if model:
        candidates.append(Path(model) / "config.json")
        if re.fullmatch(r"[A-Za-z0-9._-]+/[A-Za-z0-9._-]+", model):
            for cache in hf_cache_dirs():
                snaps = cache / f"models--{model.replace('/', '--')}" / "snapshots"
                if snaps.is_dir():
                    candidates += sorted(snaps.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in candidates:
        if path.is_file():
            require(path.stat().st_size <= MAX_CONFIG_BYTES,
                    f"{path}: a config.json larger than {MAX_CONFIG_BYTES} bytes is not read")
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested past the parser
                raise BadInput(f"{path}: not a readable config.json ({type(exc).__name__})") from None
            require(isinstance(doc, dict), f"{path}: not a config.json (expected an object)")
            return doc, str(path)
    if not model and not config_path:
        return None, "the command names no model"
    return None, (f"no config.json of {model or config_path} on this host (a local model folder, --hf-config-path, "
                  "or the Hugging Face cache)")


def _architectures(doc: Optional[dict], where: str) -> Tuple[str, ...]:
    if doc is None:
        return ()
    archs = doc.get("architectures")
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        raise BadInput(f"{where}: no architectures list")
    return tuple(archs)


def parse_vllm(version: str, argv: Sequence[str], kv_groups: Sequence[str] = ()) -> VllmDeployment:
    """The deployment of ``argv`` (vLLM's flags, or a whole launch command) on vLLM ``version``."""
    from kvfence.release.wheels import check_version

    check_version(version, "vllm")
    tokens = list(argv)
    launch = is_vllm_command(tokens)
    dotted, rest_tokens = {}, []
    i = 0
    while i < len(tokens):  # --speculative-config.KEY VALUE | --speculative-config.KEY=VALUE
        t = tokens[i]
        if t.startswith("--speculative-config."):
            key, eq, value = t[len("--speculative-config."):].partition("=")
            if not eq:
                require(i + 1 < len(tokens), f"vLLM flags: {t} needs a value")
                value, i = tokens[i + 1], i + 1
            dotted[key.replace("-", "_")] = value
        else:
            rest_tokens.append(t)
        i += 1
    try:
        args, rest = _parser().parse_known_args(rest_tokens)
    except SystemExit:
        raise BadInput(f"vLLM flags: cannot read {' '.join(tokens)[:200]!r}") from None
    unknown = [t for t in rest if t.startswith("-")]
    for token in unknown:
        name = token.split("=", 1)[0]
        close = [] if name in NEAR_FLAGS else difflib.get_close_matches(name, FLAGS, n=1, cutoff=0.85)
        if close:
            raise BadInput(f"vLLM flags: {token!r} is not a flag vLLM has; did you mean {close[0]}?")
    if rest and not launch:
        raise BadInput(f"vLLM flags: {(unknown or rest)[0]!r} is not one kvfence reads (it reads {', '.join(FLAGS)}; "
                       "or pass the whole launch command, vllm serve MODEL ...)")
    assumed = []
    model = _model_of(tokens, args.model)
    doc, where = read_config(model, args.hf_config_path)
    archs = _architectures(doc, where)
    block = args.block_size
    if block is None:
        block = ASSUMED_BLOCK
        assumed.append(f"--block-size {ASSUMED_BLOCK} (vLLM's default on CUDA; an attention backend may pick another)")
    require(1 <= block <= 1 << 16, f"--block-size {block}: must be 1..65536")
    max_len = human_int(args.max_model_len, "--max-model-len") if args.max_model_len is not None else None
    if max_len is None:
        from_config = doc.get("max_position_embeddings") if doc else None
        if type(from_config) is int and from_config > 0:
            max_len = from_config
            assumed.append(f"max_model_len {max_len} (the config's max_position_embeddings; vLLM derives it from "
                           "the config)")
        else:
            max_len = ASSUMED_MAX_MODEL_LEN
            assumed.append(f"--max-model-len {ASSUMED_MAX_MODEL_LEN} (vLLM takes the model's)")
    require(1 <= max_len <= MAX_LEN, f"--max-model-len {max_len}: must be 1..2^24")
    spec = _spec_config(args.speculative_config, dotted)
    method = spec.get("method")
    require(method is None or isinstance(method, str), "--speculative-config: method must be a string")
    tokens_n = spec.get("num_speculative_tokens", 0 if not spec else None)
    if tokens_n is None:
        tokens_n = 1
        assumed.append("num_speculative_tokens 1 (the draft's config decides it in vLLM)")
    require(type(tokens_n) is int and 0 <= tokens_n <= 64, "--speculative-config: num_speculative_tokens must be "
                                                           "an integer 0..64")
    draft = spec.get("model")
    require(draft is None or isinstance(draft, str), "--speculative-config: model must be a string")
    draft_doc, draft_where = read_config(draft) if draft else (None, "no draft model")
    dcp = args.decode_context_parallel_size or 1
    require(1 <= dcp <= 64, f"--decode-context-parallel-size {dcp}: must be 1..64")
    interleave = args.cp_kv_cache_interleave_size or 1
    require(1 <= interleave <= block and block % interleave == 0,
            f"--cp-kv-cache-interleave-size {interleave}: must divide the block size {block}")
    groups = tuple(parse_group(g) for g in kv_groups)
    return VllmDeployment(version, model, archs, where, block, max_len, method, tokens_n, draft,
                          _architectures(draft_doc, draft_where), draft_where, dcp, interleave, groups, tuple(assumed))


def parse_group(text: str) -> KvGroup:
    """``BLOCK_SIZE:BLOCKS`` of ``--kv-cache-group``."""
    match = re.fullmatch(r"(\d+):(\d+)", text.strip()) if isinstance(text, str) else None
    if match is None:
        raise BadInput(f"--kv-cache-group {text!r}: expected BLOCK_SIZE:BLOCKS, e.g. 16:1")
    block, blocks = int(match.group(1)), int(match.group(2))
    require(1 <= block <= 1 << 16 and 1 <= blocks <= 1 << 22,
            f"--kv-cache-group {text!r}: block size 1..65536, blocks 1..2^22")
    return KvGroup(block, blocks)


def assess(dep: VllmDeployment, *, out: Path, device: str, announce: Callable[[str], None]) -> list:
    """Every contract's verdict for ``dep`` (``Shipped.vllm_affected``)."""
    from kvfence.release.knowledge import names, shipped

    with progress(announce) as shown:
        verdicts = []
        for name in names():
            answer = shipped(name).vllm_affected
            if answer is not None:
                shown.step(f"{name}: vllm=={dep.version}")
                verdicts += answer(dep, Path(out), device)
        return verdicts


def deployment_json(dep: VllmDeployment, verdicts: list) -> dict:
    return {"deployment": dep.to_json(), "verdicts": [v.to_json() for v in verdicts],
            "exit_code": exit_code(verdicts)}


def vllm_releases() -> List[str]:
    """The vLLM releases kvfence has on this host: ``KVFENCE_WHEEL_DIR``'s wheels and the cache's entries."""
    from kvfence.release.release_matrix import version_key
    from kvfence.release.wheels import cache_root, is_version

    found = set()
    folders = [Path(os.environ["KVFENCE_WHEEL_DIR"])] if os.environ.get("KVFENCE_WHEEL_DIR") else []
    for folder in folders:
        for wheel in folder.glob("vllm-*.whl"):
            found.add(wheel.name.split("-")[1])
    contracts = cache_root() / "contracts"
    if contracts.is_dir():
        found.update(p.name[len("vllm-"):] for p in contracts.glob("vllm-*") if p.is_dir())
    return sorted((v for v in found if is_version(v)), key=version_key)
