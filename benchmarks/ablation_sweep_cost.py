"""Cost of the full one-head ablation sweep relative to the naive L x H evaluation passes.

    python benchmarks/ablation_sweep_cost.py            # 6 x 12 BERT, hidden 384, 128 examples x 64 tokens
    python benchmarks/ablation_sweep_cost.py --quick --output /tmp/ablation_sweep_cost.json

Numerator: ``headprune.experiments.ablation.one_head_ablation`` with the prefix cache (blocks below the masked
site replayed from one recording pass, which is also the baseline). Denominator: the same sweep
with the cache off (every head a full evaluation pass: L x H passes + the baseline). Both include
the same significance tests. The two sweeps alternate over rounds; the ratio is the median of the
paired ratios. Goal <= 0.65; the floor is about (L + 1) / 2L = 0.58 for L = 6 (embeddings and
the classifier still run for every head). Writes benchmarks/results/ablation_sweep_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers as T

from headprune.evaluation.base import EvalResult
from headprune.experiments.ablation import SweepSettings, one_head_ablation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import opening  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOAL = 0.65
FULL = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)  # MiniLM-like
QUICK = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


class TokenAccuracy:
    """A fixed-batch accuracy evaluator (random tokens, random labels): the sweep's unit of work."""

    metric, higher_is_better = "accuracy", True

    def __init__(self, n: int, seq_len: int, batch_size: int, vocab: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, vocab, (n, seq_len), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.batches_ = [ids[i : i + batch_size] for i in range(0, n, batch_size)]

    def __len__(self) -> int:
        return len(self.labels)

    @torch.no_grad()
    def evaluate(self, model, mask=None, **_) -> EvalResult:
        from headprune.evaluation.base import mask_context

        with mask_context(model, mask):
            pred = torch.cat([model(input_ids=x).logits.argmax(-1) for x in self.batches_])
        correct = (pred == self.labels).long().numpy()
        return EvalResult(metric="accuracy", score=float(correct.mean()), n=len(correct),
                          per_example={"correct": correct})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, seconds (for tests)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "ablation_sweep_cost.json")
    args = parser.parse_args()
    shape = QUICK if args.quick else FULL
    n, seq_len, batch = (16, 16, 8) if args.quick else (128, 64, 32)
    rounds = args.rounds or (1 if args.quick else 2)
    torch.manual_seed(0)
    model = T.BertForSequenceClassification(T.BertConfig(**shape, num_labels=2)).eval()
    evaluator = TokenAccuracy(n, seq_len, batch, model.config.vocab_size)
    settings = dict(alpha=0.01, seed=0)  # resamples sized for the sweep (accuracy: McNemar, none drawn)
    timings = {"cached": [], "naive": []}
    scores = {}
    for r in range(rounds):
        for name in (("cached", "naive") if r % 2 == 0 else ("naive", "cached")):
            start = time.perf_counter()
            sweep = one_head_ablation(model, evaluator, progress=False,
                                      settings=SweepSettings(**settings, prefix_cache=name == "cached"))
            timings[name].append(time.perf_counter() - start)
            scores[name] = [row["score"] for row in sweep.rows]
    if scores["cached"] != scores["naive"]:
        raise SystemExit("the cached sweep gave different scores from the naive one")
    ratios = [c / v for c, v in zip(timings["cached"], timings["naive"], strict=True)]
    layers = shape["num_hidden_layers"]
    result = {
        **opening("ablation_sweep_cost", __file__, load=False, label="benchmark"),
        "settings": {"model": f"BertForSequenceClassification {shape}", "examples": n, "seq_len": seq_len,
                     "batch_size": batch, "rounds": rounds, "heads": len(scores["cached"]), "significance": settings},
        "seconds": timings, "ratio": statistics.median(ratios), "ratios": ratios, "goal": GOAL,
        "floor": (layers + 1) / (2 * layers), "meets_goal": statistics.median(ratios) <= GOAL,
        "scores_identical": True,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    print(f"sweep with prefix cache / naive L x H passes: {result['ratio']:.3f} (goal <= {GOAL}, floor "
          f"{result['floor']:.3f}); seconds {timings}")


if __name__ == "__main__":
    main()
