"""``kvfence affected`` on real SGLang launch commands: one table, each answer with the wheel's lines behind it.

    KVFENCE_WHEEL_DIR=W KVFENCE_CACHE=C python benchmarks/affected_table.py [--device cpu] \
        [--json benchmarks/results/cpu_affected_table.json]

``W`` holds the releases' wheels (``pip download sglang==V --no-deps -d W`` for every release from 0.5.10 to
0.5.23, so that "fixed in" is read from every later release). For each command the script runs ``kvfence
affected --json --offline VERSION <the launch command>`` and keeps its exit code and every line's status,
severity, condition and evidence (the ``file:line`` of each fact, read from the wheel by kvfence). Each command
also names the wheel lines that make its answer right, read by hand from the wheel; the script checks that each
such line holds the text quoted (``cited``: ``file:line``, the text, whether the wheel has it there). The
markdown table is written beside the JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from kvfence.provenance import stamped

LAUNCH = "python -m sglang.launch_server --model-path M --speculative-algorithm EAGLE"
ATT = "sglang/srt/layers/attention"
RUNNER = "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
HOOK = "sglang/srt/arg_groups/speculative_hook.py"
CAPTURE = "sglang/srt/model_executor/runner/base_cuda_graph_runner.py"
MEMORY = "sglang/srt/arg_groups/memory_hook.py"
#: Why a default graph deployment on an H100 runs no batch eagerly for its size (its eager sites NOT LAUNCHED): the
#: graph's largest batch (256 at TP < 4), the request limit SGLang sets for speculative decoding (48), the capture
#: sizes clamped to the request pool (kvfence.release.launch_resolve).
def no_eager(limit_line: int, pool_line: int) -> list:
    return [(MEMORY, 0, "decode_cuda_graph_config.max_bs = 256"), (HOOK, limit_line, "max_running_requests=48"),
            (CAPTURE, pool_line, "num_max_requests = model_runner.req_to_token_pool.size")]

#: SGLang refuses --speculative-num-steps without --speculative-eagle-topk (a TypeError at startup in every release
#: read: kvfence.release.launch_resolve): the rows that give the steps give topk 1.
STEPS5 = "--speculative-num-steps 5 --speculative-eagle-topk 1"
#: (release, the flags after the launch command's model, the lines that make the answer right: (file, line, text)).
COMMANDS = [
    ("0.5.10", "--attention-backend flashinfer --speculative-eagle-topk 4 --speculative-num-steps 3 "
               "--speculative-num-draft-tokens 8",
     [(f"{ATT}/flashinfer_backend.py", 0, "(self.speculative_num_steps, max_bs * self.max_context_len)"),
      ("sglang/srt/speculative/eagle_draft_cuda_graph_runner.py", 92, "self.max_bs, self.max_num_token")]),
    ("0.5.10", "--attention-backend flashinfer --speculative-eagle-topk 4 --speculative-num-steps 3 "
               "--speculative-num-draft-tokens 8 --disable-cuda-graph",
     [(f"{ATT}/flashinfer_backend.py", 0, "forward_batch.batch_size * self.topk * self.max_context_len")]),
    ("0.5.10", f"--attention-backend flashmla {STEPS5} --context-length 4095",
     [(f"{ATT}/flashmla_backend.py", 0, "(self.max_context_len + PAGE_SIZE) // PAGE_SIZE"),
      (f"{ATT}/utils.py", 0, "num_pages_loop = tl.cdiv(kv_end - kv_start, FLASHMLA_CREATE_KV_BLOCK_SIZE_TRITON)")]),
    ("0.5.10", f"--attention-backend fa3 {STEPS5}",
     [(f"{ATT}/flashattention_backend.py", 0, "metadata.page_table[:, :max_seq_pages].copy_(page_indices)")]),
    ("0.5.20", f"--attention-backend trtllm_mha {STEPS5} --context-length 8192 --page-size 16 "
               "--disable-cuda-graph",
     [(f"{ATT}/trtllm_mha_backend.py", 0, "self.max_num_pages")]),
    ("0.5.20", f"--attention-backend flashmla {STEPS5} --context-length 4095",
     [(f"{ATT}/flashmla_backend.py", 0, "(self.max_context_len + PAGE_SIZE) // PAGE_SIZE")]),
    ("0.5.21", f"--attention-backend trtllm_mla {STEPS5} --context-length 8192",
     [(f"{ATT}/trtllm_mla_backend.py", 0, "self._calc_padded_blocks(self.max_context_len)")]),
    ("0.5.21", f"--attention-backend triton {STEPS5}",
     [(f"{ATT}/triton_backend.py", 0, "kv_indices_width")]),
    ("0.5.22", f"--attention-backend fa3 {STEPS5}",
     [("sglang/kernels/ops/attention/metadata.py", 166, "def _fused_metadata_kernel_general(")]),
    ("0.5.22", "--attention-backend triton --speculative-eagle-topk 4 --speculative-num-steps 3 "
               "--speculative-num-draft-tokens 8 --disable-cuda-graph",
     [(f"{ATT}/triton_backend.py", 0, "kv_indices_width")]),
    ("0.5.22", f"--attention-backend trtllm_mha {STEPS5} --context-length 1024 --page-size 16",
     [(RUNNER, 760, "cuda_graph_bs <= self.max_bs"), *no_eager(999, 77)]),
    ("0.5.23", "--attention-backend fa3 --speculative-eagle-topk 4 --speculative-num-steps 3 "
               "--speculative-num-draft-tokens 8",
     [(f"{ATT}/flashattention_backend.py", 3171, "if self.topk <= 1:"),
      ("sglang/srt/mem_cache/allocation_sizing.py", 53, "return max(spec_steps * spec_topk, spec_tokens)"),
      ("sglang/srt/mem_cache/allocation_sizing.py", 105, "extra = 4 + (max_speculative_num_draft_tokens() or 0)"),
      ("sglang/srt/speculative/eagle_utils.py", 891,
       "if page_size > 1 and (get_spec().speculative_eagle_topk or 1) > 1:")]),
    ("0.5.23", f"--attention-backend fa3 {STEPS5} --context-length 8192 --page-size 16",
     [(f"{ATT}/flashattention_backend.py", 196, "self.max_num_pages = ("),
      (f"{ATT}/flashattention_backend.py", 3186, "verify_delta = self.speculative_num_draft_tokens")]),
    ("0.5.23", f"--attention-backend fa4 {STEPS5}",
     [(f"{ATT}/attention_registry.py", 274, "return FlashAttentionBackend(runner, fa_impl_ver=4)")]),
    ("0.5.23", f"--attention-backend trtllm_mha {STEPS5}",
     [(RUNNER, 890, "cuda_graph_bs <= self.max_bs"),
      ("sglang/srt/arg_groups/overrides.py", 1187, "page_size = 64"), *no_eager(1090, 78)]),
    ("0.5.23", f"--attention-backend flashmla {STEPS5} --context-length 1087",
     [(f"{ATT}/flashmla_backend.py", 282, "(self.max_context_len + PAGE_SIZE) // PAGE_SIZE")]),
    ("0.5.23", f"--attention-backend flashmla {STEPS5} --context-length 4095",
     [(f"{ATT}/flashmla_backend.py", 282, "(self.max_context_len + PAGE_SIZE) // PAGE_SIZE")]),
    ("0.5.23", "--attention-backend triton",
     [("sglang/srt/managers/tp_worker.py", 569, "self.model_config.context_len - 1")]),
    ("0.5.23", "--attention-backend flashinfer --speculative-eagle-topk 4 --speculative-num-steps 3 "
               "--speculative-num-draft-tokens 8",
     [(f"{ATT}/flashinfer_backend.py", 0, "draft_kv_indices_buffer_width")]),
    ("0.5.99", "--attention-backend fa3", []),
    # Launches SGLang refuses at startup: exit 2, one line naming the check.
    ("0.5.10", "--attention-backend fa3 --speculative-num-steps 5",
     [("sglang/srt/server_args.py", 3084, "self.speculative_eagle_topk > 1")]),
    ("0.5.23", "--attention-backend fa3 --speculative-num-steps 5",
     [(HOOK, 1274, "cfg.speculative_eagle_topk > 1")]),
    ("0.5.23", "--attention-backend trtllm_mha --speculative-num-steps 5",
     [(HOOK, 1177, "if cfg.speculative_eagle_topk > 1:")]),
]


def _wheel(version: str):
    found = sorted(Path(os.environ["KVFENCE_WHEEL_DIR"]).glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


def cite(version: str, file: str, line: int, text: str) -> dict:
    """Whether the release's wheel has ``text`` at ``file:line`` (``line`` 0: the first line holding it)."""
    wheel = _wheel(version)
    out = {"file": file, "line": line, "text": text, "holds": False}
    if wheel is None:
        out["why"] = "no wheel"
        return out
    with zipfile.ZipFile(wheel) as zf:
        try:
            lines = zf.read(file).decode("utf-8").splitlines()
        except KeyError:
            out["why"] = "no such file in the wheel"
            return out
    if line == 0:
        line = next((i + 1 for i, s in enumerate(lines) if text in s), 0)
        out["line"] = line
    out["holds"] = 0 < line <= len(lines) and text in lines[line - 1]
    return out


def run(version: str, flags: str, device: str, out: Path) -> dict:
    argv = [sys.executable, "-m", "kvfence", "affected", "--json", "--offline", "--device", device, "--out",
            str(out), version, *shlex.split(LAUNCH), *shlex.split(flags)]
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    row = {"version": version, "command": f"kvfence affected {version} {LAUNCH} {flags}",
           "exit_code": proc.returncode, "seconds": round(time.monotonic() - start, 1)}
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        row["error"] = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return row
    row["verdicts"] = doc["verdicts"]
    return row


def answer(row: dict) -> str:
    """The row's answer in a few words: each line's status (and severity), by contract and site."""
    if "verdicts" not in row:
        return f"error: {row.get('error')}"
    parts = []
    for v in row["verdicts"]:
        what = v["status"].upper() + (f" ({v['severity']})" if v["severity"] else "")
        parts.append(f"{v['contract']}{' [' + v['site'] + ']' if v['site'] else ''}: {what}")
    return "; ".join(parts)


def markdown(doc: dict) -> str:
    out = ["| # | command | exit | kvfence's answer | the wheel's lines that make it right |", "|---|---|---|---|---|"]
    for i, row in enumerate(doc["rows"], 1):
        cites = "; ".join(f"`{c['file']}:{c['line']}` `{c['text']}`" + ("" if c["holds"] else " (NOT FOUND)")
                          for c in row["cited"]) or "-"
        out.append(f"| {i} | `{row['command']}` | {row['exit_code']} | {answer(row)} | {cites} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--json", default="benchmarks/results/cpu_affected_table.json")
    parser.add_argument("--out", default="reports/out/affected-table", help="folder for the case files")
    args = parser.parse_args(argv)
    if not os.environ.get("KVFENCE_WHEEL_DIR"):
        parser.error("set KVFENCE_WHEEL_DIR to a folder of sglang wheels (pip download sglang==V --no-deps -d W)")
    start = time.monotonic()
    rows = []
    for version, flags, cited in COMMANDS:
        row = run(version, flags, args.device, Path(args.out))
        row["cited"] = [cite(version, *c) for c in cited]
        rows.append(row)
        print(f"[{len(rows)}/{len(COMMANDS)}] exit {row['exit_code']} in {row['seconds']} s: {row['command']}",
              file=sys.stderr, flush=True)
    doc = {"device": args.device, "rows": rows, "elapsed_s": round(time.monotonic() - start, 1),
           "all_cited_hold": all(c["holds"] for r in rows for c in r["cited"])}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stamped(doc), indent=1) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(markdown(doc), encoding="utf-8")
    print(markdown(doc), end="")
    return 0 if doc["all_cited_hold"] else 1


if __name__ == "__main__":
    sys.exit(main())
