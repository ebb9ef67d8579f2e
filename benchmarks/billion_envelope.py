"""Peak memory of head scoring on a Llama-3.2-1B-shaped decoder: I_h and a block-by-block one-head sweep.

    python benchmarks/billion_envelope.py                # 1.24B params, 2 sequences x 512 tokens (minutes)
    python benchmarks/billion_envelope.py --quick --output /tmp/billion_envelope.json

The model is built from a config (16 layers, hidden 2048, 32 query / 8 key-value heads, intermediate
8192, vocabulary 128256, tied embeddings; nothing downloaded) on the meta device, materialised with
``to_empty`` (the output head tied to the embeddings, never a copy) and filled with a small normal init. Every case runs in its own subprocess, so each peak
RSS (``ru_maxrss``) starts from a clean process; ``peak_over_weights`` = peak RSS / float32 weight bytes
(goal <= 1.5). Cases, one after another:

* ``weights``: build the model only (the floor: weights + Python + torch);
* ``importance_plain``: ``head_importance`` as it is (parameters frozen, every block's activations kept);
* ``importance_checkpointed``: the same inside ``headprune.scoring.checkpointed_blocks`` (one input per
  block kept, activations recomputed); its scores are compared with the plain ones (``max_rel_diff``);
* ``sweep_stream``: a few units of a one-head sweep through ``PrefixStream`` (the prefix cache holding
  one layer's input): the baseline pass, heads of the last two layers, perplexity per unit.
* ``compress_selected`` (not in the default list): headprune's selected LLM configuration
  (``benchmarks/peers/headprune_rows.py``'s ``headprune-fisher+linear``, 20% of the non-embedding parameters
  removed) with ``low_memory=True`` (:mod:`headprune.compression.blockwise`: activation checkpointing, the linear
  stand-ins' second moments one block at a time, the cut in place) on ``--calib-blocks`` random sequences of
  ``--calib-length`` tokens, one per batch; wall seconds and the cores other processes kept busy meanwhile.

Writes benchmarks/results/billion_envelope.json (machine, command, config, figures).

    python benchmarks/billion_envelope.py --growth            # compress_selected at three shapes -> compress_scale.json
    python benchmarks/billion_envelope.py --growth --quick    # three tiny shapes (seconds)
    python benchmarks/billion_envelope.py --write-docs docs/llms.md   # its section, from the committed JSON

``--growth`` runs ``compress_selected`` at SmolLM2-135M's shape, Qwen2.5-0.5B's (as a Llama) and the 1B shape, and
fits ``seconds ~ params^alpha`` by least squares on logarithms (benchmarks/results/compress_scale.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers as T

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # peers.headprune_rows: the selected configuration
from doc_tables import markdown_table  # noqa: E402
from recorded import opening  # noqa: E402

GOAL = 1.5
FULL = dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
            intermediate_size=8192, vocab_size=128256, max_position_embeddings=131072, tie_word_embeddings=True,
            rope_theta=500000.0, rms_norm_eps=1e-5)
QUICK = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=128, vocab_size=1000, max_position_embeddings=256, tie_word_embeddings=True)
CASES = ("weights", "importance_plain", "importance_checkpointed", "sweep_stream", "compress_selected")
DEFAULT_CASES = CASES[:4]
# --growth: compress_selected at three shapes, tied embeddings as the 1B (name -> LlamaConfig fields)
GROWTH = {
    "SmolLM2-135M": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         intermediate_size=1536, vocab_size=49152, max_position_embeddings=8192,
                         tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5),
    "Qwen2.5-0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "Llama-3.2-1B": FULL,
}
GROWTH_QUICK = {f"tiny-{h}": dict(QUICK, hidden_size=h, intermediate_size=2 * h) for h in (32, 64, 128)}
SELECTED, BUDGET = "headprune-fisher+linear", 0.2  # llm_peers' selected configuration, 20% removed
SCALE_OUTPUT = ROOT / "benchmarks" / "results" / "compress_scale.json"
BEGIN, END = "<!-- compress_scale.json: begin -->", "<!-- compress_scale.json: end -->"


def build(shape: dict, seed: int = 0) -> T.LlamaForCausalLM:
    """The model with random weights, without the slow default init: meta -> to_empty -> normal_(0, 0.02)."""
    config = T.LlamaConfig(**shape)
    with torch.device("meta"):
        model = T.LlamaForCausalLM(config)
    model.model.to_empty(device="cpu")  # not model.to_empty: that would give the tied output head its own copy
    model.lm_head.weight = model.model.embed_tokens.weight
    model.model.rotary_emb = type(model.model.rotary_emb)(config)  # its buffers were left empty
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model.eval()


def weight_bytes(model) -> int:
    """Bytes of the parameters as float32, each tensor counted once (tied embeddings share one)."""
    seen = {p.data_ptr(): p.numel() * 4 for p in model.parameters()}
    return sum(seen.values())


def sequences(n: int, length: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (n, length), generator=torch.Generator().manual_seed(seed))  # [n, T]


class _Ids:
    """A tokenizer of space-separated token ids, so that LanguageModelling reads prepared ids."""

    eos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [int(t) for t in text.split()]}


def hwm_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: kilobytes


def run_case(case: str, shape: dict, n: int, length: int, units: int) -> dict:
    from headprune.scoring import checkpointed_blocks, head_importance

    start = time.perf_counter()
    model = build(shape)
    out = {"case": case, "build_seconds": time.perf_counter() - start, "weight_bytes": weight_bytes(model),
           "params": sum(p.numel() for p in model.parameters()), "peak_after_build_bytes": hwm_bytes()}
    ids = sequences(n, length, shape["vocab_size"])
    start = time.perf_counter()
    if case.startswith("importance"):
        batches = [{"input_ids": ids[i : i + 1], "attention_mask": torch.ones_like(ids[i : i + 1])} for i in range(n)]
        with checkpointed_blocks(model) if case == "importance_checkpointed" else _nothing():
            scores = head_importance(model, batches, normalize=None)
        out["scores"] = {k: v.tolist() for k, v in scores.items()}
        out["parameter_grads"] = sum(p.grad is not None for p in model.parameters())
    elif case == "sweep_stream":
        out.update(_sweep(model, ids, units))
    elif case == "compress_selected":
        out.update(_compress_selected(model, ids))
    out["seconds"] = time.perf_counter() - start
    out["peak_rss_bytes"] = hwm_bytes()
    out["peak_over_weights"] = out["peak_rss_bytes"] / out["weight_bytes"]
    out["peak_above_build_bytes"] = out["peak_rss_bytes"] - out["peak_after_build_bytes"]  # what scoring added
    return out


def _sweep(model, ids: torch.Tensor, units: int) -> dict:
    """The baseline pass and ``units`` one-head units over the last two layers, streamed."""
    import headprune as hp
    from headprune.evaluation.lm import LanguageModelling
    from headprune.experiments.prefix_stream import replay, streaming

    ev = LanguageModelling(_Ids(), [" ".join(map(str, ids.flatten().tolist()))], block_size=ids.shape[1], batch_size=1,
                           prefix=False)  # the prepared random sequences as they are (a memory envelope, no text)
    sites = hp.find_sites(model)
    last, before = sites[-1], sites[-2]
    plan = [(before, h) for h in range(units - units // 2)] + [(last, h) for h in range(units // 2)]
    with streaming(model, sites, first=plan[0][0]) as stream:
        base = ev.evaluate(model)
    held, rows = 0, []
    for site, head in plan:
        mask = torch.ones(site.num_heads)
        mask[head] = 0.0
        with replay(stream, site, ev):
            result = ev.evaluate(model, {site.name: mask})
        held = max(held, sum(t.numel() * t.element_size() for v in stream.outputs.values() for t in v))
        rows.append({"site": site.name, "head": head, "perplexity": result.score})
    one_block = held  # the input of one layer over the evaluation set
    return {"base_perplexity": base.score, "units": rows, "extra_passes": stream.passes,
            "held_prefix_bytes": held, "full_cache_prefix_bytes": one_block * len(next(iter(stream.stacks.values())).blocks)}


def _compress_selected(model, ids: torch.Tensor) -> dict:
    """The selected configuration with ``low_memory=True`` on the sequences ``ids`` (one per batch): what it kept,
    its stages and seconds, the cores other processes kept busy while it ran."""
    from peers.headprune_rows import settings_for

    from headprune import PruneSettings, compress
    from headprune.bench.machine import loadavg
    from headprune.bench.protocol import cpu_clock, load_record, other_cpu

    settings = PruneSettings(**{**settings_for(SELECTED, model, BUDGET).to_dict(), "low_memory": True})
    batches = [{"input_ids": ids[i : i + 1], "attention_mask": torch.ones_like(ids[i : i + 1])} for i in range(len(ids))]
    before, clock = loadavg(), cpu_clock()
    result = compress(model, batches, settings)
    load = load_record(before, loadavg(), threads=torch.get_num_threads(), other_cpu=other_cpu(clock, cpu_clock()))
    assert result.model is model  # in place: no second copy of the weights
    return {"settings": result.settings, "stages": result.stages, "stage_seconds": result.seconds,
            "sizes": result.sizes, "load": load, "params_after": result.sizes["after"]["params"],
            "heads_dropped": sum(map(len, result.dropped_heads.values())),
            "neurons_dropped": sum(map(len, result.dropped_neurons.values()))}


def growth_fit(rows: list[dict]) -> float:
    """``alpha`` of ``seconds ~ params^alpha``: the least-squares slope of log seconds on log parameters."""
    x = [math.log(r["params"]) for r in rows]
    y = [math.log(r["seconds"]) for r in rows]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sum((a - mx) ** 2 for a in x)


def scale_section(data: dict) -> str:
    """The docs section of compress_scale.json: one row per shape, the growth law, the goal at the largest."""
    cal = data["config"]
    lines = [f"{cal['calib_blocks']} random sequences of {cal['calib_length']} tokens (one per batch), float32, "
             f"{cal['omp_threads']} thread, `{data['command']}`; peak RSS (`ru_maxrss`) of a process that builds "
             "the model (random weights) and compresses it, nothing else.", "",
             *markdown_table(["shape", "parameters", "float32 weights", "peak RSS", "peak / weights", "seconds",
                              "other processes' cores"], [_scale_row(name, f) for name, f in data["shapes"].items()],
                             align="lrrrrrr")]
    last_name, last = list(data["shapes"].items())[-1]
    verdict = "met" if last["peak_over_weights"] <= data["goal_peak_over_weights"] else "not met"
    lines += ["", f"Time grows as parameters^{data['alpha']:.2f} (least squares on logarithms over the "
              f"{len(data['shapes'])} shapes; the calibration tokens fixed). Goal peak <= "
              f"{data['goal_peak_over_weights']}x the float32 weights at {last_name}: {verdict} "
              f"({last['peak_over_weights']:.2f}x). Seconds were measured on a machine shared with other jobs "
              "(the last column: cores they kept busy meanwhile, of "
              f"{last['load']['cores']}); the memory figures do not depend on them."]
    return "\n".join(lines)


def _scale_row(name: str, f: dict) -> list[str]:
    other = f["load"]["other_cpu"]
    return [name, f"{f['params'] / 1e6:,.0f}M", f"{f['weight_bytes'] / 2**30:.2f} GiB",
            f"{f['peak_rss_bytes'] / 2**30:.2f} GiB", f"{f['peak_over_weights']:.2f}", f"{f['seconds']:.0f}",
            "-" if other is None else f"{other:.2f}"]


def write_docs(page: Path, data: dict) -> None:
    from peers.results_io import write_section

    write_section(page, BEGIN, END, scale_section(data))


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def child(args) -> None:
    shape = json.loads(args.shape) if args.shape else QUICK if args.quick else FULL
    n, length = (args.calib_blocks, args.calib_length) if args.case == "compress_selected" else (args.sequences,
                                                                                                   args.length)
    result = run_case(args.case, shape, n, length, args.units)
    Path(args.child_output).write_text(json.dumps(result))


def run_child(args, case: str, tmp: str, shape: dict | None = None) -> dict:
    """``case`` in a process of its own (a clean peak RSS), at ``shape`` (None: the script's own)."""
    path = Path(tmp) / f"{case}.json"
    cmd = [sys.executable, __file__, "--case", case, "--child-output", str(path), "--sequences", str(args.sequences),
           "--length", str(args.length), "--units", str(args.units), "--calib-blocks", str(args.calib_blocks),
           "--calib-length", str(args.calib_length)] + (["--quick"] if args.quick else []) + \
          (["--shape", json.dumps(shape)] if shape else [])
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    f = json.loads(path.read_text())
    print(f"{case}: peak RSS {f['peak_rss_bytes'] / 2**30:.2f} GiB = {f['peak_over_weights']:.3f} x the "
          f"float32 weights ({f['weight_bytes'] / 2**30:.2f} GiB), {f['seconds']:.1f} s", flush=True)
    return f


def growth(args) -> None:
    """``compress_selected`` at the three shapes of :data:`GROWTH` (tiny ones with ``--quick``), smallest first,
    and the growth law of its time; writes ``args.output`` (default compress_scale.json)."""
    shapes = GROWTH_QUICK if args.quick else GROWTH
    with tempfile.TemporaryDirectory() as tmp:
        figures = {name: run_child(args, "compress_selected", tmp, shape) for name, shape in shapes.items()}
    result = {**opening("compress_scale", __file__, load=False, label="benchmark"), "goal_peak_over_weights": GOAL,
              "config": {"model": "LlamaForCausalLM, random weights (meta -> to_empty -> normal 0.02)",
                         "configuration": SELECTED, "budget_removed": BUDGET, "low_memory": True,
                         "calib_blocks": args.calib_blocks, "calib_length": args.calib_length, "batch_size": 1,
                         "dtype": "float32", "omp_threads": os.environ.get("OMP_NUM_THREADS", "1"),
                         "shapes": shapes},
              "shapes": figures, "alpha": growth_fit(list(figures.values()))}
    result["meets_goal"] = list(figures.values())[-1]["peak_over_weights"] <= GOAL
    output = args.output or SCALE_OUTPUT
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2))
    print(f"alpha {result['alpha']:.2f}; wrote {output}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, seconds (for a smoke run)")
    parser.add_argument("--sequences", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--units", type=int, default=3, help="one-head units of the streamed sweep")
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"among {', '.join(CASES)}")
    parser.add_argument("--calib-blocks", type=int, default=8, help="compress_selected: calibration sequences")
    parser.add_argument("--calib-length", type=int, default=256, help="compress_selected: tokens per sequence")
    parser.add_argument("--growth", action="store_true", help="compress_selected at three shapes, the growth law")
    parser.add_argument("--write-docs", type=Path, default=None, help="Write compress_scale.json's section into "
                        "this page, exit.")
    parser.add_argument("--output", type=Path, default=None, help="default: benchmarks/results/billion_envelope.json "
                        "(--growth: compress_scale.json)")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--child-output", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        return child(args)
    if args.write_docs:
        return write_docs(args.write_docs, json.loads(SCALE_OUTPUT.read_text()))
    if args.growth:
        return growth(args)
    cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        raise SystemExit(f"--cases: unknown {bad}; allowed: {', '.join(CASES)}")
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            figures[case] = run_child(args, case, tmp)
    if "importance_plain" in figures and "importance_checkpointed" in figures:
        a, b = figures["importance_plain"]["scores"], figures["importance_checkpointed"]["scores"]
        diffs = [abs(x - y) / max(max(abs(v) for v in a[k]), 1e-30) for k in a for x, y in zip(a[k], b[k], strict=True)]
        figures["importance_checkpointed"]["max_rel_diff_vs_plain"] = max(diffs)
        figures["importance_checkpointed"]["seconds_over_plain"] = \
            figures["importance_checkpointed"]["seconds"] / figures["importance_plain"]["seconds"]
    result = {
        **opening("billion_envelope", __file__, load=False, label="benchmark"), "goal_peak_over_weights": GOAL,
        "config": {"model": "LlamaForCausalLM, random weights (meta -> to_empty -> normal 0.02)",
                   **(QUICK if args.quick else FULL), "attn_implementation": "sdpa (default)", "dtype": "float32",
                   "sequences": args.sequences, "length": args.length, "batch_size": 1, "sweep_units": args.units,
                   "omp_threads": os.environ.get("OMP_NUM_THREADS", "1")},
        "figures": figures,
        "meets_goal": {c: f["peak_over_weights"] <= GOAL for c, f in figures.items()},
    }
    output = args.output or ROOT / "benchmarks" / "results" / "billion_envelope.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
