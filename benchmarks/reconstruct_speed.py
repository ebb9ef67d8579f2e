"""The reconstruction replayed layer by layer vs. the whole model run per projection: same fit, less time.

    python benchmarks/reconstruct_speed.py           # ~10 min on 2 CPU cores
    python benchmarks/reconstruct_speed.py --quick   # tiny random Llama, seconds

Each model is pruned once (Fisher scores, heads and FFN neurons, ``--share`` of their FLOPs, no
compensation), then refitted twice in one run from the same copy: ``layerwise=False`` (the whole model
run, cut short, for every projection: ``O(L^2)`` layer passes) and ``layerwise=True`` (each layer run
from its recorded inputs: ``O(L)``). Reports both times, their ratio, and the largest difference of
the refitted weights (the two must give the same fit). Models: the SST-2 MiniLM classifier (6 layers;
2048 SST-2 training phrases) and SmolLM2-135M (30 layers; 16 blocks of 128 tokens of WMT21 English
news), both on the machine's default threads.
Writes benchmarks/results/reconstruct_speed.json.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import platform
import sys
import time
from pathlib import Path

import torch

from headprune.compression import PruneSettings, compress
from headprune.compression.reconstruct import reconstruct
from headprune.provenance import versions

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from fit_size import command, save  # noqa: E402
from heads_and_neurons import DATA, MODELS  # noqa: E402

RESULTS = ROOT / "results" / "reconstruct_speed.json"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--share", type=float, default=0.6, help="Share of the heads' and neurons' FLOPs kept.")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def minilm(args):
    from headprune.core.io import load_model, load_tokenizer
    from headprune.evaluation import Classification
    from headprune.evaluation.data import load_classification

    model, tok = load_model(MODELS["sst2"]), load_tokenizer(MODELS["sst2"])
    train = load_classification(str(args.data / "sst2" / "train.tsv"), limit=2048)
    batches = list(Classification(tok, (train.texts, train.labels), config=model.config, batch_size=32).batches())
    return "SST-2 MiniLM classifier (6 layers)", model, batches, 128, "sst2/train.tsv rows 0..2047"


def smollm2(args):
    from headprune.core.store.gguf import load_gguf, load_gguf_tokenizer
    from headprune.evaluation import LanguageModelling
    from headprune.experiments.demo import SMOLLM2_FILE, SMOLLM2_PACKAGE

    file = Path(importlib.util.find_spec(SMOLLM2_PACKAGE).origin).parent / SMOLLM2_FILE
    model, tok = load_gguf(file), load_gguf_tokenizer(file)
    text = (args.data / "wmt21_newstest" / "newstest2021.de-en.ref.A.en").read_text(encoding="utf-8")
    batches = list(LanguageModelling(tok, [text], block_size=128, max_blocks=16, batch_size=4).batches())
    return "SmolLM2-135M (30 layers)", model, batches, 128, "wmt21 newstest2021.de-en.ref.A.en, 16 blocks of 128"


def tiny(args):
    sys.path.insert(0, str(ROOT.parent / "tests"))
    from tiny import build, inputs, labels

    model = build("llama")
    batches = [{**x, "labels": labels("llama", x, seed=s)} for s in range(4) for x in [inputs("llama", batch=4, seed=s)]]
    return "tiny random Llama", model, batches, 16, "random ids"


def measure(name, model, batches, seq, data, share) -> dict:
    pruned = compress(model, batches, PruneSettings(units="both", share=share, seq_len=seq, compensate="none")).model
    times, fitted = {}, {}
    for mode in (False, True):
        m = copy.deepcopy(pruned)
        t = time.perf_counter()
        reconstruct(m, model, batches, layerwise=mode)
        times[mode], fitted[mode] = time.perf_counter() - t, m
    diff = max(float((p - q).abs().max()) / max(float(q.abs().max()), 1e-12)
               for p, q in zip(fitted[True].parameters(), fitted[False].parameters(), strict=True) if q.numel())
    row = {"model": name, "data": data, "examples": sum(int(b["input_ids"].shape[0]) for b in batches),
           "seconds_whole_model": times[False], "seconds_layerwise": times[True],
           "speedup": times[False] / times[True], "max_relative_weight_difference": diff}
    print(row, flush=True)
    return row


def main(argv=None):
    args = parse(argv)
    torch.manual_seed(0)
    setups = (tiny,) if args.quick else (minilm, smollm2)
    rows = [measure(*setup(args), args.share) for setup in setups]
    out = {"command": command(argv), "share": args.share, "rows": rows, "versions": versions(),
           "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                       "torch_threads": torch.get_num_threads()}}
    save(args, out, RESULTS)
    return out


if __name__ == "__main__":
    main()
