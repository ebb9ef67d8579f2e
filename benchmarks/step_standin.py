"""How ``headprune-fisher+linear-2steps+obs-seq`` (issue #34, 50%) was set: on held-out *calibration* blocks only.

    python benchmarks/step_standin.py                 # SmolLM2-135M, 50% of non-embedding params (~15 min)
    python benchmarks/step_standin.py --quick         # a tiny random GQA Llama (seconds)

Two rounds of Fisher scores and linear stand-ins choose the units (``PruneSettings(step_standin="linear")``), then
``obs-seq`` runs once on the unpruned model; each variant changes one setting of it: how many of the 8 calibration
batches the Fisher scores of each round read (``score_batches``), the rounds' damping (``step_damping``), the rounds' stand-in.
The same model, calibration batches and held-out blocks (the 8 after them) as ``benchmarks/llm_peers.py``; per
variant the perplexity on the held-out blocks and the pruning seconds (the machine's load recorded; the speed
protocol is ``benchmarks/prune_time.py``'s). The evaluation texts are not read. Resumes: variants already in the
output are kept. Writes ``benchmarks/results/step_standin.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_peers  # noqa: E402
from peers import protocol, results_io  # noqa: E402
from peers.headprune_rows import CONFIGURATIONS, settings_for  # noqa: E402

from headprune import compress  # noqa: E402
from headprune.bench.machine import loadavg  # noqa: E402

OUTPUT = Path(__file__).resolve().parent / "results" / "step_standin.json"
SELECTED = "headprune-fisher+linear-2steps+obs-seq"
VARIANTS = {  # name -> the settings changed from SELECTED's
    "selected (Fisher on 2 of 8 batches, then 1)": {},
    "Fisher on 2 of 8 batches in both rounds": {"score_batches": 2},
    "Fisher on all 8 batches": {"score_batches": 0},
    "Fisher on 1 of 8 batches": {"score_batches": 1},
    "rounds at obs-seq's damping 0.01": {"step_damping": 0.01},
    "rounds folding the mean (bias)": {"step_standin": "bias", "step_damping": None},
}


def main(argv=None) -> dict:
    args = llm_peers.held_out_args(__doc__.splitlines()[0], argv)
    model, batches, held, described = llm_peers.held_out_data(args.quick)
    output, out = llm_peers.held_out_study("step_standin", args, argv, described, OUTPUT,
                                           {"selected": SELECTED, "selected_config": CONFIGURATIONS[SELECTED]},
                                           lambda name: _config(VARIANTS.get(name, {"missing": True})))
    if "unpruned_held_out_perplexity" not in out:
        out["unpruned_held_out_perplexity"] = protocol.perplexity(protocol.window_nll(model, held))
    done = {r["method"] for r in out["rows"]}
    for name, change in VARIANTS.items():
        if name in done:
            continue
        CONFIGURATIONS["_variant"] = _config(change)
        start, load = time.perf_counter(), loadavg()
        pruned = compress(model, batches, settings_for("_variant", model, args.budget)).model
        seconds = time.perf_counter() - start
        ppl = protocol.perplexity(protocol.window_nll(pruned, held))
        out["rows"].append({"method": name, "config": CONFIGURATIONS["_variant"], "held_out_perplexity": ppl,
                            "prune_seconds": seconds, "loadavg_before": load, "loadavg_after": loadavg()})
        print(f"{name}: held-out perplexity {ppl:.3f}, {seconds:.0f} s", flush=True)
        results_io.save(output, out)
    CONFIGURATIONS.pop("_variant", None)
    return out


def _config(change: dict) -> dict:
    """SELECTED's configuration with ``change`` (a None value: the setting left out)."""
    return {k: v for k, v in (CONFIGURATIONS[SELECTED] | change).items() if v is not None}


if __name__ == "__main__":
    main()
