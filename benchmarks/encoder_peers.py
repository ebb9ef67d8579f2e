"""headprune against the structured-pruning methods an encoder user would pick instead, at matched FLOPs, on one
fine-tuned classifier, one calibration set and one evaluation protocol (issue #26, the encoder side).

    python benchmarks/encoder_peers.py --threads 1          # MiniLM fine-tuned on SST-2, SST-2 dev
    python benchmarks/encoder_peers.py --quick              # a tiny BERT trained for seconds (CI)
    python benchmarks/encoder_peers.py --methods kwon,headprune-fisher --budgets 0.5
    python benchmarks/encoder_peers.py --write-docs docs/peers.md   # the table from the committed JSON

Budget: ``--budgets`` shares of the *prunable FLOPs* kept -- the FLOPs per example, at ``--seq-len`` tokens, of
every attention head (its query/key/value rows, output-projection columns and two attention products) and
every FFN neuron (its up row and down column): headprune's ``price="flops"`` pool
(:func:`headprune.core.model.unit_cost.unit_costs`, built on :func:`headprune.core.model.cost.flop_breakdown`); the
embeddings, pooler and classifier are outside it. Every method is given the same pool and target, and every
row reports the pool FLOPs and the whole model's FLOPs its pruned model actually keeps, counted on it by the
same counter.

Methods (``benchmarks/peers``):

- ``kwon``: Kwon et al. 2022 re-implemented (:mod:`peers.kwon`): mask Fisher, FLOPs-constrained search,
  rearrangement, layerwise mask tuning; ``kwon-no-tuning``: the same without the tuning (an ablation);
- ``torch-pruning``: Torch-Pruning 1.6.1's BERT recipe (:mod:`peers.tp_encoder`), its own surgery (heads,
  FFN and hidden size at one ratio), the ratio bisected to the FLOPs target, in a child process under
  ``--tp-timeout``;
- ``headprune-*``: ``headprune.compress(model, batches, PruneSettings(units="both", price="flops", ...))``
  configurations (:data:`CONFIGURATIONS`). ``compensate="tune"`` is not among them: PruneSettings allows it only
  for the heads-only plan, which cannot meet these budgets (heads hold about 37% of MiniLM's pool).

Protocol: one model load; calibration = the first ``--calib-limit`` examples of ``--calib-data`` with their task
labels, the same batches for every method (headprune's reconstruction holds out its own ``val_share`` of them
for its guard); every plan is made before ``--data`` (SST-2 dev) is read. Per row: accuracy, the difference to
the unpruned model with McNemar's mid-p and its 95% interval (:func:`headprune.evaluation.significance.compare`),
pool and total FLOPs kept, parameters, heads and neurons kept, pruning wall time, and the measured speed-up:
batched CPU inference of the evaluation set, pruned and unpruned in alternating rounds (``--speed-rounds``),
ratio of median wall times. Rows are written as they finish; a rerun with the same settings resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers import encoder_report as report  # noqa: E402
from peers import results_io  # noqa: E402
from peers.headprune_rows import as_settings  # noqa: E402
from peers.kwon import kwon_prune  # noqa: E402
from peers.torch_pruning_run import installed_version  # noqa: E402
from peers.tp_encoder import torch_pruning_encoder  # noqa: E402
from recorded import opening  # noqa: E402

from headprune import PruneSettings, compress, find_ffns, find_sites  # noqa: E402
from headprune.core.model.cost import flop_breakdown  # noqa: E402
from headprune.core.model.unit_cost import unit_costs  # noqa: E402
from headprune.errors import HeadpruneError  # noqa: E402
from headprune.evaluation.significance import compare  # noqa: E402
from headprune.provenance import file_sha256  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("HEADPRUNE_SHARED_DATA", "/work/shared/data"))
MODEL = Path("/work/main/runs/sst2-minilm/final")
OUTPUT = ROOT / "benchmarks" / "results" / "encoder_peers.json"
BUDGETS = (0.6, 0.5)
CONFIGURATIONS: dict[str, dict] = {
    "headprune-fisher": {"units": "both", "price": "flops", "scores": "fisher", "compensate": "none"},
    "headprune-fisher+reconstruct": {"units": "both", "price": "flops", "scores": "fisher", "compensate": "reconstruct"},
    "headprune-fluctuation+bias": {"units": "both", "price": "flops", "scores": "fluctuation", "compensate": "bias"},
    "headprune-fluctuation+bias+reconstruct": {"units": "both", "price": "flops", "scores": "fluctuation",
                                               "compensate": "bias+reconstruct"},
    # removed units replaced by their least-squares affine prediction from the kept ones (headprune.core.cut.standins);
    # damping as chosen for SmolLM2 on its held-out calibration text (benchmarks/peers/headprune_rows.py)
    "headprune-fisher+linear": {"units": "both", "price": "flops", "scores": "fisher", "compensate": "linear",
                                "damping": 0.3},
    "headprune-fluctuation+linear": {"units": "both", "price": "flops", "scores": "fluctuation",
                                     "compensate": "linear", "damping": 0.3},
}
PEERS = {"kwon": {"peer": "kwon", "rearranged": True, "tuned": True},
         "kwon-no-tuning": {"peer": "kwon", "rearranged": True, "tuned": False}}
METHODS = (*PEERS, "torch-pruning", *CONFIGURATIONS)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=MODEL, help="A fine-tuned sequence classifier (with tokenizer).")
    p.add_argument("--data", type=Path, default=SHARED / "sst2" / "dev.tsv", help="Evaluation data (read last).")
    p.add_argument("--calib-data", type=Path, default=SHARED / "sst2" / "train.tsv")
    p.add_argument("--calib-limit", type=int, default=512, help="Calibration examples (the first N).")
    p.add_argument("--select-limit", type=int, default=512,
                   help="The next N examples of --calib-data, seen by no method: headprune's configuration per "
                        "budget is the most accurate on them (the evaluation data is read for no choice).")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="Shares of the prunable FLOPs kept.")
    p.add_argument("--seq-len", type=int, default=128, help="Tokens per example at which FLOPs are priced.")
    p.add_argument("--methods", default=",".join(METHODS), help="Comma-separated subset of: " + ", ".join(METHODS))
    p.add_argument("--speed-rounds", type=int, default=3, help="Timed passes over the evaluation set per model.")
    p.add_argument("--tp-timeout", type=float, default=600.0, help="Seconds Torch-Pruning's recipe may run.")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="A tiny BERT trained for seconds, made-up sentences.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--write-docs", type=Path, default=None, help="Write the docs block from the JSON, exit.")
    return p.parse_args(argv)


def _choices(args) -> tuple[list[str], list[float]]:
    methods = [v.strip() for v in args.methods.split(",") if v.strip()]
    if not methods or any(m not in METHODS for m in methods):
        raise SystemExit(f"--methods {args.methods!r}; allowed: a comma-separated subset of {', '.join(METHODS)}")
    try:
        budgets = [float(v) for v in args.budgets.split(",") if v.strip()]
    except ValueError:
        budgets = []
    if not budgets or not all(0 < b < 1 for b in budgets):
        raise SystemExit(f"--budgets {args.budgets!r}; allowed: comma-separated shares of the prunable FLOPs in (0, 1)")
    for flag, value, low in (("--calib-limit", args.calib_limit, 1), ("--select-limit", args.select_limit, 1),
                             ("--speed-rounds", args.speed_rounds, 1),
                             ("--seq-len", args.seq_len, 1), ("--batch-size", args.batch_size, 1)):
        if value < low:
            raise SystemExit(f"{flag} {value}; allowed: an integer >= {low}")
    return methods, budgets


def load(args):
    """(model, calibration batches, the selection evaluator, a function building the evaluator, described), the
    evaluation data unread."""
    if args.quick:
        import method_comparison

        model, evaluator, calib, sig = method_comparison.quick_setup(argparse.Namespace(task="classification"))
        return model.eval(), calib, _BatchEvaluator(calib), lambda: evaluator, {
            "model": sig["model"], "calib": sig["calib_data"], "eval": sig["data"] + ", labels = the unpruned "
            "model's own predictions", "select": "the calibration batches themselves (--quick: no held-out split)"}
    from headprune.core.io import load_model, load_tokenizer
    from headprune.evaluation import Classification
    from headprune.evaluation.data import load_classification, same_data

    if same_data(args.data, args.calib_data):
        raise SystemExit(f"--calib-data {args.calib_data} is the evaluation data; give a disjoint set")
    for flag, path in (("--model", args.model), ("--data", args.data), ("--calib-data", args.calib_data)):
        if not path.exists():
            raise SystemExit(f"{flag} {path}: not found")
    model, tok = load_model(args.model), load_tokenizer(args.model)
    train = load_classification(str(args.calib_data), limit=args.calib_limit + args.select_limit)
    n = args.calib_limit
    if len(train.texts) < n + args.select_limit:
        raise SystemExit(f"--calib-data {args.calib_data}: {len(train.texts)} examples; --calib-limit {n} + "
                         f"--select-limit {args.select_limit} needed")
    calib = Classification(tok, (train.texts[:n], train.labels[:n]), config=model.config, batch_size=args.batch_size)
    select = Classification(tok, (train.texts[n:], train.labels[n:]), config=model.config, batch_size=args.batch_size)

    def evaluator():
        return Classification(tok, load_classification(str(args.data)), config=model.config,
                              batch_size=args.batch_size)

    return model.eval(), list(calib.batches()), select, evaluator, {
        "model": args.model.name if args.model.name != "final" else f"{args.model.parent.name}/final",
        "model_sha256": file_sha256(args.model / "model.safetensors"),
        "calib": f"{args.calib_data.name} rows 0..{n - 1}", "calib_sha256": file_sha256(args.calib_data),
        "select": f"{args.calib_data.name} rows {n}..{n + args.select_limit - 1}",
        "eval": args.data.name, "eval_sha256": file_sha256(args.data)}


class _BatchEvaluator:
    """Accuracy on labelled batches (``--quick``'s selection set: its calibration batches)."""

    def __init__(self, batches):
        self.batches = list(batches)

    @torch.no_grad()
    def evaluate(self, model):
        right = total = 0
        for b in self.batches:
            logits = model(**{k: v for k, v in b.items() if k != "labels"}).logits
            right += int((logits.argmax(-1) == b["labels"]).sum())
            total += int(b["labels"].numel())
        return argparse.Namespace(score=right / total)


def sizes(model, seq_len: int) -> dict:
    """What a model keeps, by one counter: pool FLOPs (heads + neurons), total matmul FLOPs, parameters, units."""
    return {"pool_flops": unit_costs(model, "flops", seq_len=seq_len).total(),
            "total_flops": flop_breakdown(model, seq_len)["total"],
            "params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
            "heads": sum(s.num_heads for s in find_sites(model)), "neurons": sum(f.width for f in find_ffns(model)),
            "heads_per_layer": [s.num_heads for s in sorted(find_sites(model), key=lambda s: s.layer)],
            "neurons_per_layer": [f.width for f in sorted(find_ffns(model), key=lambda f: f.layer)]}


def prune(method: str, model, batches, budget: float, base: dict, args) -> tuple[object, dict]:
    """(pruned model or None, the row's record) for one method at one budget."""
    row = {"method": method, "tool": tool_of(method), "config": config_of(method), "budget": budget}
    start = time.perf_counter()
    try:
        if method in PEERS:
            cfg = PEERS[method]
            result = kwon_prune(model, batches, budget, seq_len=args.seq_len, rearranged=cfg["rearranged"],
                                tuned=cfg["tuned"])
            pruned, info = result.model, result.info
        elif method == "torch-pruning":
            example = {k: v[:1] for k, v in batches[0].items() if k != "labels"}
            pruned, info = torch_pruning_encoder(model, example, budget * base["pool_flops"], seq_len=args.seq_len,
                                                 timeout=args.tp_timeout)
            if pruned is None:
                return None, row | {"status": info["status"], "torch_pruning": info,
                                    "error": info.get("error") or info.get("reason")}
            info = {"torch_pruning": info}
        else:
            settings = PruneSettings(share=budget, seq_len=args.seq_len, **as_settings(CONFIGURATIONS[method]))
            result = compress(model, batches, settings)
            d = result.to_dict()
            pruned, info = result.model, {"stages": d.get("stages"), "seconds": d.get("seconds"),
                                          "rejected": d.get("rejected"), "settings": settings.to_dict()}
    except (HeadpruneError, ValueError, RuntimeError) as e:
        return None, row | {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    row |= {"status": "ok", "prune_seconds": time.perf_counter() - start, "info": info}
    return pruned.eval(), row


def timed_passes(models: dict, batches: list[dict], rounds: int) -> dict[str, list[float]]:
    """Wall seconds of a forward pass over ``batches`` per model and round, the models alternating (one warm-up
    pass each first), under ``torch.inference_mode``."""
    times = {k: [] for k in models}
    with torch.inference_mode():
        for r in range(rounds + 1):
            order = list(models) if r % 2 == 0 else list(reversed(models))
            for name in order:
                start = time.perf_counter()
                for b in batches:
                    models[name](**b)
                if r:
                    times[name].append(time.perf_counter() - start)
    return times


def finish(row: dict, pruned, base_model, base: dict, base_eval, evaluator, speed_batches, args) -> dict:
    """Evaluate a planned row: sizes, accuracy and its test against the unpruned model, measured speed-up."""
    sz = sizes(pruned, args.seq_len)
    ev = evaluator.evaluate(pruned)
    test = compare(base_eval, ev)
    times = timed_passes({"unpruned": base_model, "pruned": pruned}, speed_batches, args.speed_rounds)
    med = {k: statistics.median(v) for k, v in times.items()}
    return row | {"sizes": sz, "flops_kept": sz["pool_flops"] / base["pool_flops"],
                  "total_flops_kept": sz["total_flops"] / base["total_flops"],
                  "params_kept": sz["params"] / base["params"], "accuracy": ev.score,
                  "delta": ev.score - base_eval.score, "ci95": [test["ci_low"], test["ci_high"]],
                  "p": test["p_value"], "test": test, "correct": ev.per_example["correct"].tolist(),
                  "speed": {"seconds": times, "median_s": med, "speedup": med["unpruned"] / med["pruned"]},
                  "speedup": med["unpruned"] / med["pruned"]}


def main(argv=None) -> dict | None:
    args = parse(argv)
    output = args.output or (OUTPUT.with_name("encoder_peers_quick.json") if args.quick else OUTPUT)
    if args.write_docs:
        data = json.loads(OUTPUT.read_text()) if OUTPUT.is_file() else None
        if data is not None:
            summarise(data)  # the derived tables from the rows, by today's code
        report.write_docs(args.write_docs, data)
        return None
    methods, budgets = _choices(args)
    if args.quick:
        args.seq_len = min(args.seq_len, 16)  # the tiny model's positions
        args.tp_timeout = min(args.tp_timeout, 60.0)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, batches, selector, make_evaluator, described = load(args)
    base = sizes(model, args.seq_len)
    settings = {**described, "calib_examples": sum(int(b["input_ids"].shape[0]) for b in batches),
                "batch_size": args.batch_size, "seq_len": args.seq_len, "speed_rounds": args.speed_rounds,
                "tp_timeout_s": args.tp_timeout, "quick": args.quick, "seed": 0, "threads": args.threads,
                "budget": f"share of the prunable FLOPs kept: heads and FFN neurons (headprune's price='flops' pool) "
                          f"at {args.seq_len} tokens per example",
                "test": "McNemar mid-p of paired correctness, 95% interval of the same test (headprune compare)"}
    out = results_io.resume(output, settings, config_of)
    head = opening("encoder_peers", __file__, argv, python=True)
    head["versions"]["torch_pruning"] = installed_version()
    out.update({**head, "settings": settings, "unpruned_sizes": base})
    done = {(r["method"], r["budget"]) for r in out["rows"]}
    todo = [(m, b) for b in budgets for m in methods if (m, b) not in done]
    planned = []
    for method, budget in todo:  # every plan before the evaluation data is read
        print(f"{method} keeping {budget:.0%} of the prunable FLOPs", flush=True)
        pruned, row = prune(method, model, batches, budget, base, args)
        if pruned is not None:
            row["selection_accuracy"] = selector.evaluate(pruned).score
        planned.append((pruned, row))
        print(f"  {row['status']}" + (f" in {row['prune_seconds']:.1f} s" if row["status"] == "ok" else
                                      f": {row.get('error')}"), flush=True)
    evaluator = make_evaluator()
    base_eval = evaluator.evaluate(model)  # deterministic: a resumed run finds the same
    out["unpruned"] = {"accuracy": base_eval.score, "n": base_eval.n, "correct": base_eval.per_example["correct"].tolist()}
    speed_batches = [{k: v for k, v in b.items() if k != "labels"} for b in evaluator.batches()]
    for pruned, row in planned:
        if pruned is not None:
            row = finish(row, pruned, model, base, base_eval, evaluator, speed_batches, args)
        out["rows"].append(row)
        summarise(out)
        results_io.save(output, out)
        print("  " + report.row_line(row), flush=True)
    summarise(out)
    results_io.save(output, out)
    print(f"wrote {output}")
    return out


def tool_of(method: str) -> str:
    return "headprune" if method in CONFIGURATIONS else "kwon (re-implemented)" if method in PEERS else method


def config_of(method: str) -> dict:
    """What a row depends on beyond the shared settings."""
    if method in CONFIGURATIONS:
        return dict(CONFIGURATIONS[method])
    if method == "torch-pruning":
        return {"peer": method, "version": installed_version()}
    return dict(PEERS[method])


def summarise(out: dict) -> None:
    """``results``: one flat entry per finished row (tool, method, budget, flops_kept, accuracy, delta, ci95, p,
    speedup); ``selected``: per budget, the headprune configuration most accurate on the held-out selection
    examples; ``verdicts``: per budget, that row against the peer most accurate *on the evaluation set* (a choice
    that favours the peers), McNemar mid-p of the two rows' paired correctness with its 95% interval."""
    from headprune.evaluation.exact_tests import mcnemar_midp

    ok = [r for r in out["rows"] if r.get("status") == "ok"]
    out["results"] = [{k: r.get(k) for k in ("tool", "method", "budget", "flops_kept", "total_flops_kept", "accuracy",
                                             "delta", "ci95", "p", "speedup", "prune_seconds", "selection_accuracy")}
                      for r in ok]
    out.pop("best", None)
    out["selected"], out["verdicts"] = {}, {}
    for budget in sorted({r["budget"] for r in ok}):
        here = [r for r in ok if r["budget"] == budget]
        mine = [r for r in here if r["tool"] == "headprune" and "selection_accuracy" in r]
        peers = [r for r in here if r["tool"] != "headprune"]
        if not mine:
            continue
        chosen = max(mine, key=lambda r: r["selection_accuracy"])  # ties: the first configuration run
        out["selected"][str(budget)] = chosen["method"]
        tied = [r["method"] for r in mine if r is not chosen and r["selection_accuracy"] == chosen["selection_accuracy"]]
        if not peers:
            continue
        rival = max(peers, key=lambda r: r["accuracy"])
        test = mcnemar_midp(rival["correct"], chosen["correct"])
        out["verdicts"][str(budget)] = {
            "headprune": chosen["method"], "accuracy": chosen["accuracy"], "best_peer": rival["method"],
            "best_peer_accuracy": rival["accuracy"], "difference": chosen["accuracy"] - rival["accuracy"],
            "ci95": [test.ci_low, test.ci_high], "p": test.p_value, "test": "McNemar mid-p, headprune vs the peer",
            "higher_than_every_peer": all(chosen["accuracy"] > r["accuracy"] for r in peers),
            "tied_on_selection": tied}
    if out["verdicts"]:  # one comparison per budget: Holm over the budgets
        from headprune.evaluation.multiplicity import holm

        keys = sorted(out["verdicts"])
        for k, adjusted in zip(keys, holm([out["verdicts"][k]["p"] for k in keys]), strict=True):
            out["verdicts"][k]["p_holm"] = float(adjusted)


if __name__ == "__main__":
    main()
