"""Pruning curves of five head-selection methods on one model and data, at every 10% step.

    python benchmarks/method_comparison.py --model DIR --task classification --data dev.tsv \\
        --calib-data train.tsv [--calib-limit 512] [--limit N]
    python benchmarks/method_comparison.py --model DIR --task translation --data test.en --data2 test.de \\
        --calib-data train.en --calib-data2 train.de --calib-limit 512 --limit 500
    python benchmarks/method_comparison.py --quick [--task translation]   # tiny random model, seconds

Methods: ``ih`` (the paper's I_h, Michel et al. 2019), ``fisher`` (diagonal Fisher of the mask),
``fisher+rearrange`` (+ per-site swaps with the Fisher block), ``fisher+tune`` (+ least-squares
scales of the kept heads, as the folded model computes them), ``random`` (mean over ``--seeds``).
Scores and tuning use only ``--calib-data``, which must differ from ``--data`` (the evaluation set).
Every point is the evaluator's score with the plan applied as a head mask (folding and removal give
the same outputs, tested); budgets count heads (``keep = 1 - fraction``), global across sites.
Writes benchmarks/results/method_comparison.json: signature, unpruned score, one row per
(method, seed, step), a summary (mean over seeds), paired tests of each method against I_h per step,
and the time each method's scoring and planning took; and the curves as a PNG beside it.

``--quick``: a tiny random BERT (or Marian with ``--task translation``) with a word tokenizer over
made-up sentences; the labels (references) are the unpruned model's own predictions (translations),
so the unpruned score is 100% and the curves measure how faithfully each pruned model follows it.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

import headprune as hp
from headprune.compression import PruneSettings, plan_heads, score_heads
from headprune.compression.compensation import get_compensations
from headprune.errors import ConfigError
from headprune.evaluation.data import same_data
from headprune.evaluation.multiplicity import adjust_rows
from headprune.evaluation.significance import compare
from headprune.methods import with_settings
from headprune.provenance import versions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import command, repo_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("ih", "fisher", "fisher+rearrange", "fisher+tune", "random")
WORDS = ("the a film movie story actor plot scene music good bad great dull long short fine funny sad "
         "charming bleak it is was and but not very quite really").split()


def _compensate(method: str) -> str:
    """The compensation of a method name (``fisher+tune`` -> ``tune``; ``ih`` -> ``none``)."""
    return method.split("+", 1)[1] if "+" in method else "none"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, help="Model directory (with tokenizer).")
    p.add_argument("--task", default="classification", choices=("classification", "translation", "lm"))
    p.add_argument("--data", help="Evaluation data (translation: sources, or a source/target table).")
    p.add_argument("--data2", type=Path, help="Translation: evaluation targets.")
    p.add_argument("--calib-data", help="Calibration data for scores and tuning (disjoint from --data).")
    p.add_argument("--calib-data2", type=Path, help="Translation: calibration targets.")
    p.add_argument("--allow-same-data", action="store_true", help="Allow --calib-data == --data.")
    p.add_argument("--limit", type=int, help="Evaluate on the first N examples.")
    p.add_argument("--calib-limit", type=int, default=512, help="Calibration examples (the first N).")
    p.add_argument("--batch-size", type=int, help="Batch size of evaluation and calibration.")
    p.add_argument("--metric", help="Classification: accuracy (default), f1 or matthews.")
    p.add_argument("--beams", type=int, default=1, help="Translation: beam size.")
    p.add_argument("--text-column")
    p.add_argument("--text-pair-column")
    p.add_argument("--label-column")
    p.add_argument("--methods", default=",".join(METHODS), help="Comma-separated subset of " + ", ".join(METHODS))
    p.add_argument("--step", type=float, default=0.1, help="Share of heads pruned per step.")
    p.add_argument("--seeds", type=int, default=3, help="Random method: number of seeds.")
    p.add_argument("--min-per-site", type=int, default=0)
    p.add_argument("--damping", type=float, default=1e-2, help="fisher+tune: ridge towards unit scales.")
    p.add_argument("--quick", action="store_true", help="Tiny random model and made-up data (seconds).")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "method_comparison.json")
    args = p.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if bad := [m for m in args.methods if m not in METHODS]:
        p.error(f"--methods: unknown {bad}; allowed: {', '.join(METHODS)}")
    if not 0 < args.step <= 1:
        p.error(f"--step {args.step}; allowed: 0 < step <= 1")
    if not args.quick:
        missing = [f for f in ("model", "data", "calib_data") if getattr(args, f) is None]
        if missing:
            p.error("needs " + ", ".join("--" + f.replace("_", "-") for f in missing) + " (or --quick)")
        if same_data(args.data, args.calib_data) and not args.allow_same_data:
            p.error(f"--calib-data {args.calib_data!r} is the evaluation data; give a disjoint set "
                    "(or --allow-same-data)")
    return args


# ---------------------------------------------------------------- the real model, or a tiny one

def real_setup(args):
    from headprune.core.io import load_model, load_tokenizer
    from headprune.evaluation.build import EvalOptions, TaskData, build_task

    model, tok = load_model(args.model), load_tokenizer(args.model)
    if tok is None:
        raise ConfigError(f"model directory {str(args.model)!r} has no tokenizer")
    columns = {"text_column": args.text_column, "text_pair_column": args.text_pair_column,
               "label_column": args.label_column, "source_column": None, "target_column": None}

    def task(data, data2, limit):
        return build_task(args.task, tok, model.config, TaskData(data, data2, columns=columns, limit=limit),
                          EvalOptions(batch_size=args.batch_size, metric=args.metric, beams=args.beams))

    evaluator = task(args.data, args.data2, args.limit)
    calib = task(args.calib_data, args.calib_data2, args.calib_limit)
    signature = {"model": repo_path(args.model), "data": [repo_path(args.data)] + ([repo_path(args.data2)] if args.data2 else []),
                 "calib_data": [repo_path(args.calib_data)] + ([repo_path(args.calib_data2)] if args.calib_data2 else []),
                 "n": len(evaluator), "calib_n": len(calib)}
    return model, evaluator, list(calib.batches()), signature


def _sentences(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def _tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for t in texts for w in t.split()})
    table = {w: i for i, w in enumerate(["<pad>", "<s>", "</s>", "<unk>", *words][:vocab])}
    core = Tokenizer(models.WordLevel(table, unk_token="<unk>"))
    core.normalizer, core.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.WhitespaceSplit()
    core.post_processor = TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def _train(model, tok, rng: random.Random, steps: int = 80) -> None:
    """A few seconds of training on "more positive than negative words?", a task that needs attention."""
    from headprune.evaluation import Classification

    positive, negative = {"good", "great", "fine", "funny", "charming"}, {"bad", "dull", "sad", "bleak", "long"}
    texts = _sentences(rng, 512)
    gold = [str(int(sum(w in positive for w in t.split()) > sum(w in negative for w in t.split()))) for t in texts]
    batches = list(Classification(tok, (texts, gold), config=model.config, batch_size=32).batches())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        loss = model(**batches[step % len(batches)]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def quick_setup(args):
    """A tiny model (the classifier trained for seconds, the translator random); its own unpruned
    outputs are the gold labels / references."""
    import transformers as T

    from headprune.evaluation import Classification, Translation

    rng = random.Random(0)
    evaluation, calibration = _sentences(rng, 48), _sentences(rng, 48)
    tok = _tokenizer(evaluation + calibration, 64)
    torch.manual_seed(0)
    common = dict(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=64)
    if args.task == "translation":
        model = T.MarianMTModel(T.MarianConfig(
            d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, decoder_start_token_id=0, **common)).eval()
        model.generation_config.max_new_tokens = 8
        probe = Translation(tok, (evaluation + calibration, ["x"] * 96), batch_size=16, max_new_tokens=8)
        refs = probe.evaluate(model).extra["hypotheses"]
        refs = [r or "the" for r in refs]  # an empty reference cannot be tokenised
        evaluator = Translation(tok, (evaluation, refs[:48]), batch_size=16, max_new_tokens=8)
        calib = Translation(tok, (calibration, refs[48:]), batch_size=16, max_new_tokens=8)
    else:
        model = T.BertForSequenceClassification(T.BertConfig(
            hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64, num_labels=2,
            **common))
        _train(model, tok, rng)
        probe = Classification(tok, (evaluation + calibration, ["0"] * 96), config=model.config, batch_size=16)
        pred = [str(p) for p in probe.evaluate(model).per_example["pred"]]
        evaluator = Classification(tok, (evaluation, pred[:48]), config=model.config, batch_size=16)
        calib = Classification(tok, (calibration, pred[48:]), config=model.config, batch_size=16)
    signature = {"model": f"tiny random {type(model).__name__} (--quick)", "data": "made-up sentences (48)",
                 "calib_data": "other made-up sentences (48)", "n": len(evaluator), "calib_n": len(calib)}
    return model, evaluator, list(calib.batches()), signature


# ---------------------------------------------------------------- curves

def curves(model, evaluator, calib, args) -> tuple[object, list[dict], dict, dict]:
    sites = hp.find_sites(model)
    total = sum(s.num_heads for s in sites)
    steps = int(round(1 / args.step))
    fractions = sorted({min(1.0, round(i * args.step, 6)) for i in range(steps + 1)} | {1.0})
    unpruned = evaluator.evaluate(model)
    higher = unpruned.higher_is_better
    rows, timing = [], {}
    seen: dict[tuple, object] = {}  # plan -> its EvalResult (the same plan is scored once)
    results: dict[tuple, object] = {}  # (method, fraction) -> EvalResult of seed 0, for the paired tests
    for method in args.methods:
        family = "fisher" if method.startswith("fisher") else method
        for seed in range(args.seeds) if method == "random" else (0,):
            start = time.perf_counter()
            scored = score_heads(model, calib, family, seed=seed)
            timing.setdefault(method, {"score_s": scored.seconds, "plan_s": []})
            for fraction in fractions:
                n_keep = total - int(round(fraction * total))
                compensate = [with_settings(c, {"damping": args.damping}) for c in get_compensations(_compensate(method))]
                settings = PruneSettings(n_keep=max(n_keep, 1), scores=family, compensate=compensate,
                                         min_per_site=args.min_per_site, seed=seed)
                t0 = time.perf_counter()
                plan = plan_heads(model, calib, settings, scored=scored, n_keep=n_keep)  # 0 at the last step
                timing[method]["plan_s"].append(time.perf_counter() - t0)
                key = (tuple(sorted((k, tuple(v)) for k, v in plan.drop.items())),
                       None if plan.scales is None else tuple(round(float(x), 7) for v in plan.scales.values()
                                                              for x in v))
                if not plan.drop:
                    result = unpruned
                elif key in seen:
                    result = seen[key]
                else:
                    result = evaluator.evaluate(model, plan.mask(model))
                seen[key] = result
                score = result.score
                if seed == 0:
                    results[(method, fraction)] = result
                rows.append({"method": method, "seed": seed, "fraction": fraction, "pruned": total - n_keep,
                             "of": total, "score": score, "relative": _relative(score, unpruned.score, higher),
                             "loss_estimate": plan.loss_estimate, "dropped": plan.drop,
                             "fallback_sites": [t["site"] for t in plan.tuning if t["fallback"]],
                             "calib_loss": plan.losses, "rejected": plan.rejected})
            timing[method].setdefault("total_s", 0.0)
            timing[method]["total_s"] += time.perf_counter() - start
            print(f"{method} seed {seed}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return unpruned, rows, timing, results


def paired_tests(results: dict, against: str = "ih") -> list[dict]:
    """Per step, each method against ``against`` on the same examples: score difference, two-sided
    p-value, its Holm adjustment over that method's steps (``p_adjusted``, ``significant`` at 0.05) and
    the 95% interval of the difference (paired t-test on correctness for accuracy, sacreBLEU's paired
    bootstrap of corpus BLEU)."""
    out = []
    for (method, fraction), other in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        base = results.get((against, fraction))
        if method == against or base is None:
            continue
        same = base.per_example.keys() == other.per_example.keys() and all(
            np.array_equal(base.per_example[k], other.per_example[k]) for k in base.per_example)
        test = None if same else compare(base, other, n_resamples=1000, seed=0)
        out.append({"method": method, "against": against, "fraction": fraction, "diff": other.score - base.score,
                    **({"test": None, "p_value": 1.0, "ci_low": 0.0, "ci_high": 0.0} if test is None else test)})
    for method in {t["method"] for t in out}:  # Holm over each method's tested steps (two-sided p)
        adjust_rows([t for t in out if t["method"] == method and t["test"] is not None], "holm", alpha=0.05)
    return out


def _relative(score: float, base: float, higher: bool) -> float:
    if not base or not score:
        return 0.0
    return score / base if higher else base / score


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        for fraction in sorted({r["fraction"] for r in rows if r["method"] == method}):
            group = [r for r in rows if r["method"] == method and r["fraction"] == fraction]
            scores = torch.tensor([r["score"] for r in group], dtype=torch.float64)
            out.append({"method": method, "fraction": fraction, "pruned": group[0]["pruned"], "of": group[0]["of"],
                        "score": float(scores.mean()), "std": float(scores.std()) if len(group) > 1 else 0.0,
                        "relative": sum(r["relative"] for r in group) / len(group), "seeds": len(group)})
    return out


def table(summary: list[dict], metric: str) -> str:
    methods = list(dict.fromkeys(r["method"] for r in summary))
    fractions = sorted({r["fraction"] for r in summary})
    scale = 100.0 if metric in ("accuracy", "f1", "matthews") else 1.0
    lines = [f"{'pruned':>7} " + " ".join(f"{m:>17}" for m in methods)]
    for f in fractions:
        cells = [next((r for r in summary if r["method"] == m and r["fraction"] == f), None) for m in methods]
        lines.append(f"{f:>7.0%} " + " ".join(f"{c['score'] * scale:>9.2f} ({c['relative']:>5.1%})" if c else
                                              f"{'-':>17}" for c in cells))
    return "\n".join(lines)


def plot(summary: list[dict], metric: str, path: Path, signature: dict) -> Path:
    """The curves of every method in one figure (I_h as the paper's "importance" order)."""
    from headprune.report.figures import pruning_curves

    rows = [{**r, "order": "importance" if r["method"] == "ih" else r["method"]} for r in summary]
    return pruning_curves(rows, metric, path, title=f"{Path(str(signature['model'])).parent.name or signature['model']}"
                          f": {signature['n']} evaluation / {signature['calib_n']} calibration examples")


def main(argv=None) -> int:
    args = parse(argv)
    start = time.perf_counter()
    model, evaluator, calib, signature = quick_setup(args) if args.quick else real_setup(args)
    unpruned, rows, timing, results = curves(model, evaluator, calib, args)
    tests = paired_tests(results) if "ih" in args.methods else []
    for t in tests:
        if t["method"] == "fisher+tune":
            print(f"fisher+tune - ih at {t['fraction']:.0%}: {t['diff']:+.4f} (p = {t['p_value']:.3f})")
    summary = summarize(rows)
    text = table(summary, unpruned.metric)
    print(text)
    at_half = {r["method"]: r["relative"] for r in summary if abs(r["fraction"] - 0.5) < 1e-9}
    result = {
        "benchmark": "method_comparison",
        "signature": {**signature, "task": args.task, "metric": unpruned.metric, "methods": args.methods,
                      "step": args.step, "seeds": args.seeds, "seed": 0, "min_per_site": args.min_per_site,
                      "damping": args.damping, "versions": versions(),
                      "command": command(__file__, argv)},
        "unpruned": unpruned.score, "metric": unpruned.metric, "higher_is_better": unpruned.higher_is_better,
        "relative_at_50_percent_pruned": at_half, "summary": summary, "table": text, "paired_tests": tests, "timing": timing,
        "rows": rows, "seconds": time.perf_counter() - start,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, default=lambda v: v.tolist()))
    figure = plot(summary, unpruned.metric, args.output.with_suffix(".png"), signature)
    print(f"wrote {args.output} and {figure}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
