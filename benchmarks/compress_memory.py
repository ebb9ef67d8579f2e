"""Peak memory of ``headprune compress`` against the model's float32 weights (issue #47 item 4).

    python benchmarks/compress_memory.py --model /path/to/gemma-3-270m-q4_k_m.gguf   # a .gguf, HF directory or package
    python benchmarks/compress_memory.py --quick                                      # a tiny random Llama, seconds

The library's ``compress`` with the configuration ``headprune-fisher+linear`` of ``benchmarks/peers/headprune_rows.py``
removing 20% of the non-embedding parameters, on the calibration blocks of ``benchmarks/llm_peers.py`` (its
``--calib`` text, ``--calib-blocks`` blocks of ``--calib-block`` tokens, batches of 4; the quick run: 8 blocks of 64
tokens of CPython's docs). Recorded: the peak growth of the process's resident set while compress runs
(``headprune.bench.machine.peak_rss_delta``: the model and the batches are loaded before), the model's weight bytes
in float32 (every parameter once, tied ones once), their ratio, and what one batch's ``[B, T, V]`` float32 logits
would take, which the chunked losses (``headprune.core.model.chunked``) never hold at once: with Gemma-3's 262,144-token
vocabulary, 1.07 GB for a batch of 4 x 256 tokens. With ``--cli``, the same configuration runs instead as a user runs it,
``headprune compress MODEL --task lm ... 2>log`` in a child process with stderr to a file (not a terminal): the
child's peak resident set (``getrusage``, the whole process: loading, evaluation, compress, saving) over the
float32 weights, and the progress lines the log holds. Written to ``benchmarks/results/compress_memory.json`` (the quick
run: ``compress_memory_quick.json``), one entry per model, replaced when run again.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_peers  # noqa: E402
from apply_replay import cli_flags  # noqa: E402
from peers.headprune_rows import headprune_row, settings_for  # noqa: E402
from recorded import command, repo_path  # noqa: E402

from headprune.bench.machine import loadavg, machine_info, peak_rss_delta  # noqa: E402
from headprune.core.model.chunked import LOGIT_BYTES, chunk_rows  # noqa: E402
from headprune.evaluation.lm import LanguageModelling  # noqa: E402
from headprune.provenance import versions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "compress_memory.json"
CONFIGURATION = "headprune-fisher+linear"
BUDGET = 0.2
BATCH = 4  # blocks per calibration batch, as llm_peers.py's


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="A .gguf file, a Hugging Face directory or a package shipping one "
                                                  "(as llm_peers.py --model); required unless --quick.")
    p.add_argument("--quick", action="store_true", help="A tiny random Llama on CPython's docs (seconds).")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cli", action="store_true", help="Also run headprune compress in a child process, stderr to a file.")
    p.add_argument("--work", type=Path, default=Path("runs") / "compress_memory", help="The --cli run's folder.")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    if (args.model is None) == (not args.quick):
        raise SystemExit("give exactly one of --model PATH and --quick")
    if args.cli and args.quick:
        raise SystemExit("--cli with --quick; allowed: --cli with --model (the quick model is not a folder)")
    if args.threads < 1:
        raise SystemExit(f"--threads {args.threads}; allowed: >= 1")
    return args


def calibration(args: argparse.Namespace) -> tuple:
    """(model, calibration batches, description): llm_peers.py's model loading and calibration blocks."""
    peer_args = llm_peers.parse(["--quick"] if args.quick else ["--model", str(args.model)])
    model, tok, calib_text, _, described = llm_peers.load(peer_args)
    block, blocks = (64, 8) if args.quick else (peer_args.calib_block, peer_args.calib_blocks)
    calib = LanguageModelling(tok, [calib_text], block_size=block, max_blocks=blocks, batch_size=BATCH,
                              prefix=peer_args.prefix_token)
    if len(calib) < blocks:
        raise SystemExit(f"calibration text: {len(calib)} blocks of {block} tokens; {blocks} needed")
    described = {k: v for k, v in described.items() if not k.startswith("eval")}
    return model, list(calib.batches(limit=blocks)), {**described, "calib_block": block, "calib_blocks": blocks,
                                                      "batch_size": BATCH, "prefix_token": calib.prefix_token}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters in float32, each parameter once (tied ones once)."""
    return 4 * sum(p.numel() for p in model.parameters())


def measure(args: argparse.Namespace) -> dict:
    model, batches, described = calibration(args)
    vocab = model.get_output_embeddings().weight.shape[0]
    b, t = batches[0]["input_ids"].shape
    weights = weight_bytes(model)
    peak, (pruned, info) = peak_rss_delta(lambda: headprune_row(CONFIGURATION, model, batches, BUDGET))
    return {**described, "configuration": CONFIGURATION, "budget": BUDGET, "vocab": vocab,
            "weights_float32_bytes": weights, "peak_rss_delta_bytes": peak,
            "peak_over_weights": None if peak is None else peak / weights,
            "full_logits_bytes": 4 * b * t * vocab, "chunk_rows": chunk_rows(vocab), "chunk_logits_bytes": LOGIT_BYTES,
            "params_after": sum(p.numel() for p in pruned.parameters()), "compress_seconds": info["seconds"],
            "heads_removed": info["heads"], "neurons_removed": info["neurons"]}


def cli_run(args: argparse.Namespace, model: torch.nn.Module, weights: int) -> dict:
    """``headprune compress`` in a child process, stderr to a file: its peak RSS and the progress lines it left."""
    peer_args = llm_peers.parse(["--model", str(args.model)])
    path = llm_peers.model_path(str(args.model))
    share = settings_for(CONFIGURATION, model, BUDGET).share
    args.work.mkdir(parents=True, exist_ok=True)
    out, log = args.work / "compressed", args.work / "compress.log"
    argv = ["compress", str(path), "--task", "lm", "--data", str(peer_args.eval), "--limit", "4", "--calib-data",
            str(peer_args.calib), "--calib-limit", str(peer_args.calib_blocks), "--share", repr(share),
            *cli_flags(CONFIGURATION), "--no-bench", "--device", "cpu", "-o", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    start = time.perf_counter()
    with open(log, "w") as err:
        done = subprocess.run([sys.executable, "-m", "headprune", *argv], stdout=subprocess.DEVNULL, stderr=err,
                              cwd=ROOT, env=env)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kB on Linux
    lines = [line.rstrip() for line in log.read_text().splitlines() if line.strip()]
    progress = [line for line in lines if line.startswith("headprune: ") and line.endswith("elapsed")]
    return {"command": "headprune " + " ".join(repo_path(w) for w in argv), "exit_code": done.returncode,
            "seconds": seconds, "peak_rss_bytes": peak, "peak_over_weights": peak / weights,
            "stderr_lines": len(lines), "progress_lines": len(progress), "progress_sample": progress[:3] + progress[-2:]}


def main(argv=None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    output = args.output or (OUTPUT.with_name("compress_memory_quick.json") if args.quick else OUTPUT)
    start = {"machine": machine_info() | {"loadavg_at_start": loadavg()}}
    if args.cli:  # as a user runs it: the whole child process, loading and saving included
        model, _, described = calibration(args)
        weights = weight_bytes(model)
        row = {**described, "mode": "cli", "configuration": CONFIGURATION, "budget": BUDGET,
               "weights_float32_bytes": weights, "cli": cli_run(args, model, weights)}
        del model
    else:
        row = measure(args) | {"mode": "library"}
    row |= start | {"loadavg_at_end": loadavg(), "threads": args.threads}
    out = json.loads(output.read_text()) if output.is_file() else {"name": "compress_memory", "rows": []}
    out["rows"] = [r for r in out["rows"] if (r.get("model"), r.get("mode", "library")) != (row["model"], row["mode"])]
    out["rows"].append(row)
    out.update({"command": command(__file__, sys.argv[1:] if argv is None else argv), "versions": versions()})
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(out, indent=1) + "\n")
    if args.cli:
        c = row["cli"]
        print(f"{row['model']}: headprune compress exit {c['exit_code']}, peak RSS {c['peak_rss_bytes']} bytes = "
              f"{c['peak_over_weights']:.2f}x the float32 weights, {c['progress_lines']} progress lines -> {output}")
        return out
    ratio = row["peak_over_weights"]
    print(f"{row['model']}: peak RSS growth {row['peak_rss_delta_bytes']} bytes, float32 weights "
          f"{row['weights_float32_bytes']} bytes, ratio {'n/a' if ratio is None else f'{ratio:.2f}'} -> {output}")
    return out


if __name__ == "__main__":
    main()
