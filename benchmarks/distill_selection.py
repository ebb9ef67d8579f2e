"""Does distillation after the reconstruction help, and at which learning rate? Judged on selection data.

    python benchmarks/distill_selection.py --task enfr    # ~6 min on 2 CPU cores
    python benchmarks/distill_selection.py --quick        # tiny random BERT, seconds

Same models, selection data and pruning as ``benchmarks/fit_size.py`` (Fisher scores on 512 training
examples, 60% of model FLOPs), the reconstruction fitted on the first 4096 training examples, then one
pass of distillation (:mod:`headprune.compression.distill`) over those 4096 at each learning rate of
``--lrs``. Judged on the selection data only (no guard, no test set). Writes
benchmarks/results/distill_selection.json (one entry per task, merged).
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
from headprune.compression.distill import distill
from headprune.compression.reconstruct import reconstruct
from headprune.provenance import versions

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from fit_size import DATA, command, enfr, quick, save, sst2  # noqa: E402
from heads_and_neurons import unit_share  # noqa: E402

RESULTS = ROOT / "results" / "distill_selection.json"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=("sst2", "enfr"), default="enfr")
    p.add_argument("--lrs", default="5e-5,2e-4", help="Peak learning rates, comma-separated.")
    p.add_argument("--fit", type=int, default=4096)
    p.add_argument("--budget", type=float, default=0.6)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    torch.manual_seed(0)
    setup = quick if args.quick else {"sst2": sst2, "enfr": enfr}[args.task]
    model, calib, fits, judge, seq, tgt, data = setup(args, [2 if args.quick else args.fit])
    (fit_n, fit), = fits.items()
    pruned = compress(model, calib, PruneSettings(units="both", share=unit_share(model, args.budget, seq, tgt),
                                                  seq_len=seq, tgt_len=tgt, compensate="none")).model
    reconstruct(pruned, model, fit)
    rows = [{"lr": 0.0, **judge(pruned)}]
    print(rows[-1], flush=True)
    for lr in [float(x) for x in args.lrs.split(",")]:
        m = copy.deepcopy(pruned)
        t = time.perf_counter()
        info = distill(m, model, fit, lr=lr)
        rows.append({"lr": lr, "seconds": time.perf_counter() - t, "loss_first": info["losses"][0],
                     "loss_last": info["losses"][-1], **judge(m)})
        print(rows[-1], flush=True)
    name = "quick" if args.quick else args.task
    out = json.loads(args.out.read_text()) if args.out.is_file() else {}
    out[name] = {"command": command(argv), "data": data, "fit_examples": fit_n, "budget": args.budget, "epochs": 1,
                 "rows": rows, "versions": versions(), "torch_threads": torch.get_num_threads()}
    save(args, out, RESULTS)
    return out


if __name__ == "__main__":
    main()
