"""Memory envelope of I_h on a 1B-parameter grouped-query decoder: peak RSS / float32 weight bytes.

    python benchmarks/billion_envelope.py                  # Llama-3.2-1B shape, 512 tokens: ~5 min, ~7 GB
    python benchmarks/billion_envelope.py --quick --output /tmp/envelope.json   # a small shape, seconds

The model is ``LlamaForCausalLM`` built from a config with Llama-3.2-1B's shape (16 layers, hidden 2048,
32 query / 8 key-value heads, MLP 8192, vocabulary 128256, tied embeddings) and random weights; nothing
is downloaded. ``headprune.head_importance(..., checkpoint=True)`` scores every head over sequences of
512 random tokens (the model's own next-token loss): parameters frozen (no parameter gradients), each
block under activation checkpointing (only block inputs kept; the block is recomputed in the backward).
Peak RSS is the process's high-water mark (VmHWM) while scoring, weights included; the goal is
<= 1.5 x the float32 weight bytes. Writes benchmarks/results/billion_envelope.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch
import transformers as T

import headprune as hp
from headprune.bench import machine_info
from headprune.provenance import versions

ROOT = Path(__file__).resolve().parents[1]
GOAL = 1.5
LLAMA_1B = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                intermediate_size=8192, vocab_size=128256, max_position_embeddings=2048, tie_word_embeddings=True,
                rope_theta=500000.0)
QUICK = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=1024, vocab_size=8192, max_position_embeddings=1024, tie_word_embeddings=True)


def status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--sequences", type=int, default=2, help="Sequences scored (one per batch).")
    ap.add_argument("--no-checkpoint", action="store_true", help="Keep every activation (for comparison).")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "billion_envelope.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    shape = QUICK if args.quick else LLAMA_1B
    config = T.LlamaConfig(**shape, attn_implementation="sdpa")
    start = time.perf_counter()
    model = T.LlamaForCausalLM(config).eval()
    built_s = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * 4 for p in model.parameters())  # float32
    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(3, config.vocab_size, (1, args.seq_len), generator=g)}
               for _ in range(args.sequences)]
    for b in batches:
        b["attention_mask"] = torch.ones_like(b["input_ids"])
    import ctypes

    ctypes.CDLL(None).malloc_trim(0)
    rss_before = status_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current RSS (weights in memory)
    start = time.perf_counter()
    scores = hp.head_importance(model, batches, checkpoint=not args.no_checkpoint)
    seconds = time.perf_counter() - start
    peak = status_bytes("VmHWM")
    result = {
        "benchmark": "I_h memory envelope, Llama-3.2-1B-shaped GQA decoder (random weights)" if not args.quick
        else "I_h memory envelope (quick shape)",
        "config": shape, "params": params, "float32_weight_bytes": weight_bytes,
        "seq_len": args.seq_len, "sequences": args.sequences, "checkpoint": not args.no_checkpoint,
        "rss_before_scoring_bytes": rss_before, "peak_rss_bytes": peak,
        "peak_rss_over_weights": peak / weight_bytes, "goal": GOAL, "meets_goal": peak / weight_bytes <= GOAL,
        "scoring_seconds": seconds, "build_seconds": built_s,
        "heads": sum(len(v) for v in scores.values()), "finite": all(bool(torch.isfinite(v).all()) for v in scores.values()),
        "machine": machine_info(), "versions": versions(), "command": shlex.join([sys.executable, *sys.argv]),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine", "versions", "config")}, indent=2))


if __name__ == "__main__":
    main()
