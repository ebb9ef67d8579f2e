"""Cost of scoring every head (I_h) relative to one evaluation pass over the same examples.

    python benchmarks/importance_cost.py            # 6 x 12 BERT, hidden 384, seq 128, 128 examples: ~2 min on 2 cores
    python benchmarks/importance_cost.py --quick --output /tmp/importance_cost.json   # tiny, seconds

Numerator: ``headprune.head_importance`` over N labelled examples (one forward + one backward to the
mask variables per batch, parameters frozen). Denominator: a plain ``torch.no_grad`` forward over
the same batches (what an evaluation pass costs). The two alternate in rounds (E I, I E, ...); the
ratio is the median over rounds of the paired ratio. Goal <= 2.2; the physical floor is about 2
(forward + activation backward). Writes benchmarks/results/importance_cost.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers as T

import headprune as hp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import opening  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOAL = 2.2
FULL = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)  # MiniLM-like
QUICK = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def build(shape: dict, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return T.BertForSequenceClassification(T.BertConfig(**shape, num_labels=3, max_position_embeddings=512)).eval()


def make_batches(vocab: int, n: int, batch_size: int, seq_len: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, seq_len), generator=g)
    labels = torch.randint(0, 3, (n,), generator=g)
    return [{"input_ids": ids[i : i + batch_size], "attention_mask": torch.ones_like(ids[i : i + batch_size]),
             "labels": labels[i : i + batch_size]} for i in range(0, n, batch_size)]


def evaluation_pass(model, batches) -> None:
    with torch.no_grad():
        for b in batches:
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])


def importance_pass(model, batches) -> None:
    hp.head_importance(model, batches)


def timed(fn, *args) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes and few repeats (a test that it runs)")
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "importance_cost.json")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all CPUs)")
    ap.add_argument("--n", type=int, default=None, help="examples (default 128; 8 with --quick)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 5; 2 with --quick)")
    args = ap.parse_args()

    head = opening("importance_cost", __file__, threads=args.threads, load=False)
    quick = args.quick
    n, seq_len = args.n or (8 if quick else 128), 16 if quick else 128
    batch_size = 4 if quick else args.batch_size
    repeats = args.repeats or (2 if quick else 5)
    shape = QUICK if quick else FULL
    model = build(shape)
    batches = make_batches(model.config.vocab_size, n, batch_size, seq_len)
    passes = {"evaluation": evaluation_pass, "importance": importance_pass}
    load_start = list(os.getloadavg())
    for fn in passes.values():  # warm-up
        fn(model, batches[:1])
    seconds: dict[str, list[float]] = {name: [] for name in passes}
    for r in range(repeats):
        for name in (list(passes) if r % 2 == 0 else list(passes)[::-1]):
            seconds[name].append(timed(passes[name], model, batches))
    ratios = [i / e for i, e in zip(seconds["importance"], seconds["evaluation"], strict=True)]
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    ratio = statistics.median(ratios)
    head["machine"] |= {"loadavg_start": load_start, "loadavg_end": list(os.getloadavg())}
    out = {
        **head,
        "settings": {"quick": quick, "threads": args.threads, "n": n, "batch_size": batch_size, "seq_len": seq_len,
                     "repeats": repeats, "shape": shape, "attn_implementation": model.config._attn_implementation,
                     "model": "BertForSequenceClassification, random weights, 3 labels",
                     "importance": "head_importance(model, batches): normalize='l2', absolute='example'",
                     "evaluation": "torch.no_grad() forward of the same batches, no loss"},
        "seconds": seconds,
        "ratio": ratio,
        "ratio_q25": q[0],
        "ratio_q75": q[2],
        "ratio_of_medians": statistics.median(seconds["importance"]) / statistics.median(seconds["evaluation"]),
        "examples_per_s": {name: n / statistics.median(s) for name, s in seconds.items()},
        "goal": f"importance time / evaluation time <= {GOAL} (floor about 2: forward + activation backward)",
        "goal_met": ratio <= GOAL,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2) + "\n")
    print(f"importance / evaluation = {ratio:.3f} (IQR {q[0]:.3f}-{q[2]:.3f}) over {n} examples, "
          f"{repeats} rounds; goal <= {GOAL}: {'met' if out['goal_met'] else 'NOT met'}; wrote {args.output}")


if __name__ == "__main__":
    main()
