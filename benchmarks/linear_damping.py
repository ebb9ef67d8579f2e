"""How ``compensate="linear"``'s damping was chosen for the peer comparison: on held-out *calibration* text only.

    python benchmarks/linear_damping.py                    # SmolLM2-135M, 20% of non-embedding params (~15 min)
    python benchmarks/linear_damping.py --quick            # a tiny random GQA Llama (seconds)

The same model, calibration batches (32 blocks of 256 tokens of the WMT21 de-en English references) and held-out
blocks (the next 8, which no method sees) as ``benchmarks/llm_peers.py``; headprune's fluctuation scores with
the mean stand-in (``compensate="bias"``, FLAP's) and with linear stand-ins at each ``--dampings`` value; per row
the perplexity on the held-out blocks. The evaluation text of the peer comparison is not read. Writes
``benchmarks/results/linear_damping.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_peers  # noqa: E402
from peers import protocol, results_io  # noqa: E402
from peers.headprune_rows import CONFIGURATIONS, settings_for  # noqa: E402
from recorded import opening  # noqa: E402

from headprune import compress  # noqa: E402

OUTPUT = Path(__file__).resolve().parent / "results" / "linear_damping.json"
BASE = {"units": "both", "price": "params", "scores": "fluctuation"}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=0.2, help="Share of non-embedding parameters removed.")
    p.add_argument("--dampings", default="0.001,0.01,0.1,0.3,1,3")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        dampings = [float(v) for v in args.dampings.split(",") if v.strip()]
    except ValueError:
        dampings = []
    if not dampings or any(d < 0 for d in dampings):
        raise SystemExit(f"--dampings {args.dampings!r}; allowed: comma-separated numbers >= 0")
    if not 0 < args.budget < 1:
        raise SystemExit(f"--budget {args.budget}; allowed: a number in (0, 1)")
    head = opening("linear_damping", __file__, argv, threads=args.threads)
    model, batches, held, described = llm_peers.held_out_data(args.quick)
    unpruned = protocol.perplexity(protocol.window_nll(model, held))
    rows = []
    for name, extra in [("bias", {"compensate": "bias"}),
                        *((f"linear {d:g}", {"compensate": "linear", "damping": d}) for d in dampings)]:
        CONFIGURATIONS["_sweep"] = BASE | extra
        settings = settings_for("_sweep", model, args.budget)
        start = time.perf_counter()
        pruned = compress(model, batches, settings).model
        seconds = time.perf_counter() - start
        ppl = protocol.perplexity(protocol.window_nll(pruned, held))
        rows.append({"compensate": extra["compensate"], "damping": extra.get("damping"), "held_out_perplexity": ppl,
                     "ratio": ppl / unpruned, "prune_seconds": seconds})
        print(f"{name}: held-out perplexity {ppl:.3f} (x{ppl / unpruned:.4f}), {seconds:.0f} s", flush=True)
    best = min((r for r in rows if r["compensate"] == "linear"), key=lambda r: r["held_out_perplexity"])
    out = {**head,
           "settings": {**{k: v for k, v in described.items() if not k.startswith("eval")}, "budget": args.budget,
                        "scores": "fluctuation", "quick": args.quick},
           "unpruned_held_out_perplexity": unpruned, "rows": rows, "best_damping": best["damping"]}
    results_io.save(args.output or (OUTPUT.with_name("linear_damping_quick.json") if args.quick else OUTPUT), out)
    return out


if __name__ == "__main__":
    main()
