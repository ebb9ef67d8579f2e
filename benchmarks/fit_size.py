"""How many examples the least-squares reconstruction should be fitted on, chosen on data no test saw.

    python benchmarks/fit_size.py            # ~5 min on 2 CPU cores
    python benchmarks/fit_size.py --quick    # tiny random BERT, seconds

The refit of every pruned output / down projection has ``k x d_out`` numbers per projection and reads
no labels, so it can use more examples than the Fisher scores. Here both study models are pruned once
(Fisher scores on the first 512 training examples, 60% of model FLOPs, no compensation) and the
reconstruction is fitted on the first ``n`` training examples for each ``n`` in ``--sizes``. It is
judged on *selection* data that neither the fit, the guard's validation rows nor any test set is:

- SST-2 MiniLM: 1000 training phrases of >= 15 words from row 30000 on (the classifier was trained on
  rows 0..9999; the dev set, which the benchmark reports on, is full sentences, hence long phrases):
  mean KL divergence from the unpruned model's class distribution and the share of predictions that
  agree with it;
- Multi30k en->fr: the first 500 pairs of the validation split (the model was trained on train and
  looked at test_2016): corpus BLEU and teacher-forced loss.

The fit size of ``benchmarks/heads_and_neurons.py`` (``--fit``) was set from this file's results.
Writes benchmarks/results/fit_size.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from headprune.compression import PruneSettings, compress
from headprune.compression.reconstruct import reconstruct
from headprune.provenance import versions

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from heads_and_neurons import DATA, MODELS, _gz, unit_share  # noqa: E402
from recorded import command as recorded_command  # noqa: E402
from recorded import repo_path  # noqa: E402

RESULTS = ROOT / "results" / "fit_size.json"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="512,2048,4096", help="Fit sizes (first N training examples), comma-separated.")
    p.add_argument("--budget", type=float, default=0.6, help="Model FLOPs kept.")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--quick", action="store_true", help="Tiny random BERT and made-up data (seconds).")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


@torch.no_grad()
def fidelity(teacher, student, batches) -> dict:
    """Mean KL(teacher || student) of the class distributions and the share of agreeing predictions."""
    kl, agree, n = 0.0, 0, 0
    for b in batches:
        x = {k: v for k, v in b.items() if k != "labels"}
        t, s = teacher(**x).logits.log_softmax(-1), student(**x).logits.log_softmax(-1)
        kl += float((t.exp() * (t - s)).sum())
        agree += int((t.argmax(-1) == s.argmax(-1)).sum())
        n += t.shape[0]
    return {"kl": kl / n, "agreement": agree / n, "n": n}


def sst2(args, sizes):
    from headprune.core.io import load_model, load_tokenizer
    from headprune.evaluation import Classification
    from headprune.evaluation.data import load_classification

    model, tok = load_model(MODELS["sst2"]), load_tokenizer(MODELS["sst2"])
    train = load_classification(str(args.data / "sst2" / "train.tsv"))
    long = [(t, y) for t, y in zip(train.texts[30000:], train.labels[30000:], strict=True) if len(t.split()) >= 15][:1000]

    def batches(texts, labels, bs=32):
        return list(Classification(tok, (texts, labels), config=model.config, batch_size=bs).batches())

    select = batches([t for t, _ in long], [y for _, y in long], 64)
    calib = batches(train.texts[:512], train.labels[:512])
    fits = {n: batches(train.texts[:n], train.labels[:n]) for n in sizes}
    return model, calib, fits, lambda m: fidelity(model, m, select), 128, None, \
        {"selection": "sst2/train.tsv: 1000 phrases of >= 15 words from row 30000", "calibration": "rows 0..511"}


def enfr(args, sizes):
    from headprune.core.io import load_model, load_tokenizer
    from headprune.evaluation import Translation
    from headprune.scoring.gradients import mean_loss

    model, tok = load_model(MODELS["enfr"]), load_tokenizer(MODELS["enfr"])
    d = args.data / "multi30k"
    src, ref = _gz(d / "train.en.gz", max(sizes)), _gz(d / "train.fr.gz", max(sizes))
    calib = list(Translation(tok, (src[:512], ref[:512]), batch_size=32).batches())
    fits = {n: list(Translation(tok, (src[:n], ref[:n]), batch_size=32).batches()) for n in sizes}
    select = Translation(tok, (_gz(d / "val.en.gz", 500), _gz(d / "val.fr.gz", 500)), batch_size=64)
    sel_batches = list(select.batches())
    base = select.evaluate(model).score

    def judge(m):
        bleu = select.evaluate(m).score
        return {"bleu": bleu, "bleu_relative": bleu / base, "loss": mean_loss(m, sel_batches),
                "loss_unpruned": mean_loss(model, sel_batches)}
    return model, calib, fits, judge, 32, 32, {"selection": "multi30k/val.{en,fr}: first 500 pairs",
                                                "calibration": "train lines 0..511"}


def quick(args, sizes):
    sys.path.insert(0, str(ROOT.parent / "tests"))
    from tiny import build, inputs, labels

    model = build("bert")
    data = [{**x, "labels": labels("bert", x, seed=s)} for s in range(8) for x in [inputs("bert", batch=8, seed=s)]]
    fits = {8 * n: data[:n] for n in sizes}  # batches of 8
    return model, data[:2], fits, lambda m: fidelity(model, m, data[6:]), 16, None, {"selection": "random ids"}


def main(argv=None):
    args = parse(argv)
    torch.manual_seed(0)
    sizes = [int(x) for x in args.sizes.split(",")] if not args.quick else [2, 4]
    entries = {}
    for task, setup in ((("quick", quick),) if args.quick else (("sst2", sst2), ("enfr", enfr))):
        model, calib, fits, judge, seq, tgt, data = setup(args, sizes)
        pruned = compress(model, calib, PruneSettings(units="both", share=unit_share(model, args.budget, seq, tgt),
                                                      seq_len=seq, tgt_len=tgt, compensate="none")).model
        rows = [{"fit_examples": 0, **judge(pruned)}]
        for n, fit in fits.items():
            m = copy.deepcopy(pruned)
            t = time.perf_counter()
            reconstruct(m, model, fit)
            rows.append({"fit_examples": n, "seconds": time.perf_counter() - t, **judge(m)})
            print(task, rows[-1], flush=True)
        entries[task] = {"model": repo_path(MODELS.get(task, "tiny random BERT")), "data": data, "budget": args.budget,
                         "rows": rows}
    out = {"command": command(argv), "versions": versions(), "torch_threads": torch.get_num_threads(), **entries}
    save(args, out, RESULTS)
    return out


def command(argv) -> str:
    return recorded_command(sys.argv[0], argv or sys.argv[1:])


def save(args, out: dict, default: Path) -> None:
    """Write ``out`` to ``args.out`` (a quick run only where asked: never over the committed file)."""
    if not args.quick or args.out != default:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
