"""What aligned widths cost: headprune's selected LLM configuration with every pruned width a multiple of N
(``PruneSettings(multiple_of=N)``, ``--multiple-of N``) against unaligned widths, on held-out calibration text
(issue #37 item 1).

    python benchmarks/aligned_cost.py                 # SmolLM2-135M, 10/20/30/50%, N = 1, 32, 64, 128, 256
    python benchmarks/aligned_cost.py --quick         # the tiny random GQA Llama of llm_peers --quick (seconds)
    python benchmarks/aligned_cost.py --write-docs docs/llms.md   # the table between this file's markers

The model, the calibration batches (32 blocks of 256 tokens of the WMT21 de-en English references) and the
held-out blocks (the 8 blocks after them, which no method reads) are those of ``benchmarks/llm_peers.py``;
the evaluation texts of the peer comparison are not read. The configuration's scores (Fisher over heads and FFN
neurons, with the channel statistics of the linear stand-ins gathered in the same pass) are computed once and
handed to every ``compress`` call as a scorer object, so the rows differ only in the selection's block size:
1 (unaligned), 32 (llama.cpp's Q4_0 / Q8_0 blocks), 64 and 128 (GPU tiles) and 256 (K-quants). Per row: the
non-embedding parameters removed (an aligned selection stops at a whole block, so it may remove a little less
than the target), the FFN and attention widths, and the held-out perplexity with its ratio to the unaligned
row's (paired bootstrap over the held-out blocks, 95%).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_peers  # noqa: E402
from doc_tables import markdown_table  # noqa: E402
from peers import protocol  # noqa: E402
from peers.headprune_rows import settings_for  # noqa: E402
from peers.plan import nonembedding_params  # noqa: E402
from peers.results_io import save, write_section  # noqa: E402
from recorded import opening  # noqa: E402

from headprune import compress  # noqa: E402
from headprune.bench.machine import loadavg  # noqa: E402
from headprune.core.model.ffn import find_ffns  # noqa: E402
from headprune.core.model.sites import find_sites  # noqa: E402
from headprune.core.model.unit_cost import unit_costs  # noqa: E402
from headprune.scoring.scorer import ScoreRequest, UnitScores  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "aligned_cost.json"
BEGIN, END = "<!-- aligned_cost.json: begin -->", "<!-- aligned_cost.json: end -->"
CONFIG = "headprune-fisher+linear"


@dataclass(frozen=True)
class Precomputed:
    """A scorer that returns scores computed once (the pipeline's Scorer protocol), so every row of this
    benchmark selects from the same numbers."""

    found: UnitScores
    name: str = "fisher-precomputed"
    plan: bool = False
    pool: bool = True
    fisher: bool = False
    label_free: bool = False

    def score(self, model, batches, request: ScoreRequest) -> UnitScores:
        return self.found


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--budgets", default="0.1,0.2,0.3,0.5", help="Shares of non-embedding parameters removed.")
    p.add_argument("--multiples", default="1,32,64,128,256", help="Block sizes of the widths (1: unaligned).")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="The tiny random GQA Llama of llm_peers --quick.")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--write-docs", type=Path, default=None, help="Write the table from the JSON into this page, exit.")
    return p.parse_args(argv)


def _data(quick: bool):
    """(model, calibration batches, held-out blocks [n, T], description)."""
    return llm_peers.held_out_data(quick, quick_held=4)


def widths(model) -> dict:
    return {"ffn": [int(f.down.weight.shape[1]) for f in find_ffns(model)],
            "attention": [int(s.num_heads * s.head_dim) for s in find_sites(model)]}


def main(argv=None) -> dict | None:
    args = parse(argv)
    if args.write_docs:
        write_docs(args.write_docs, json.loads(OUTPUT.read_text()))
        return None
    budgets = llm_peers._numbers(args.budgets, "--budgets", float, lambda v: 0 < v < 1,
                                 "comma-separated numbers in (0, 1)")
    multiples = llm_peers._numbers(args.multiples, "--multiples", int, lambda v: v >= 1,
                                   "comma-separated integers >= 1")
    head = opening("aligned_cost", __file__, argv, threads=args.threads, python=True)
    model, batches, held, described = _data(args.quick)
    output = args.output or (OUTPUT.with_name("aligned_cost_quick.json") if args.quick else OUTPUT)
    out = {**head,
           "settings": {**described, "config": CONFIG, "multiples": multiples, "budgets": budgets, "seed": 0,
                        "judged_on": "held-out calibration blocks (the evaluation texts are not read)",
                        "bootstrap": "95% percentile, 1000 resamples of held-out blocks, paired, seed 0"},
           "unpruned": {"perplexity": protocol.perplexity(protocol.window_nll(model, held))}, "rows": []}
    base_settings = settings_for(CONFIG, model, budgets[0])
    request = ScoreRequest(units="both", costs=unit_costs(model, base_settings.price), stats=True, gram=True)
    scores = Precomputed(base_settings.scorer.score(model, list(batches), request))
    total = nonembedding_params(model)
    for budget in budgets:
        reference = None
        for multiple in multiples:
            settings = dataclasses.replace(settings_for(CONFIG, model, budget), scores=scores, multiple_of=multiple)
            pruned = compress(model, list(batches), settings).model
            nll = protocol.window_nll(pruned, held)
            row = {"budget": budget, "multiple_of": multiple, "removed_share": 1 - nonembedding_params(pruned) / total,
                   "perplexity": protocol.perplexity(nll), "widths": widths(pruned), "nll": nll}
            if reference is None:
                reference = nll
            r, lo, hi = protocol.ratio_interval(reference, nll)
            row |= {"ratio_to_unaligned": r, "ratio_ci95": [lo, hi]}
            out["rows"].append(row)
            print(f"{budget:.0%} multiple_of={multiple}: removed {row['removed_share']:.3f}, held-out perplexity "
                  f"{row['perplexity']:.2f} (x{r:.3f} [{lo:.3f}, {hi:.3f}] of unaligned)", flush=True)
            save(output, out)
    out["machine"]["loadavg_at_end"] = loadavg()
    save(output, out)
    print(f"wrote {output}")
    return out


def table(data: dict) -> str:
    s = data["settings"]
    lines = [f"{s['config']} on {s['model']}, judged on {s['held_out_blocks']} held-out calibration blocks of "
             f"{s['calib_block']} tokens (unpruned perplexity {data['unpruned']['perplexity']:.2f}); "
             f"`{data['command']}`.", ""]
    rows = []
    for r in data["rows"]:
        lo, hi = r["ratio_ci95"]
        ratio = "1 (reference)" if r["multiple_of"] == 1 else f"{r['ratio_to_unaligned']:.3f} [{lo:.3f}, {hi:.3f}]"
        rows.append([f"{r['budget']:.0%}", r["multiple_of"], f"{r['removed_share']:.1%}", f"{r['perplexity']:.2f}", ratio])
    return "\n".join(lines + markdown_table(["removed (target)", "multiple of", "removed (actual)", "held-out perplexity",
                                             "x unaligned [95% interval]"], rows))


def write_docs(page: Path, data: dict) -> None:
    write_section(page, BEGIN, END, table(data))


if __name__ == "__main__":
    main()
