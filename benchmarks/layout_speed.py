"""PyTorch speed of the pruned layout (issue #37 item 5): is a pruned uneven model slower per FLOP than a stock one?

    python benchmarks/layout_speed.py            # SmolLM2-135M's shape (random weights), float32, 2 threads
    python benchmarks/layout_speed.py --quick    # a tiny Llama (seconds), written to *_quick.json (not committed)
    python benchmarks/layout_speed.py --write-docs docs/llms.md   # the table between this file's markers

Four models of one Llama shape (random weights: speed does not depend on them): ``stock`` (unpruned);
``uniform``, headprune's surgery removing the same heads (a third of every key/value group's) and the same
FFN neurons from every layer, in memory; ``uniform-stock``, that model saved by ``save_pruned`` (a stock
directory: the shape is expressible) and loaded back with plain ``from_pretrained``, so ``uniform`` and
``uniform-stock`` have the same shape and differ only in how they came to be; ``uneven``, the same number
of parameters removed with a different count in every layer (seeded random plan, GQA groups kept even).
Workloads, each timed with the project's speed protocol (alternating rounds, median ratio with a
distribution-free interval, load before and after): prefill (``--batch`` x ``--seq`` tokens, no cache) and
decode (batch 1, ``--new`` greedy steps after a ``--prompt``-token prompt, key/value cache on; the prompt's
prefill outside the clock). Per model and workload: the speed-up over ``stock``, the FLOP ratio, and their
quotient -- the efficiency (1: as fast per FLOP as the stock model).
"""

from __future__ import annotations

import argparse
import copy
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from doc_tables import markdown_table  # noqa: E402
from peers.results_io import save, write_section  # noqa: E402
from recorded import opening  # noqa: E402

import headprune as hp  # noqa: E402
from headprune.bench.decode import generated_cache  # noqa: E402
from headprune.bench.protocol import ProtocolSettings, paired_rounds  # noqa: E402
from headprune.core.model.cost import flop_breakdown  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "results" / "layout_speed.json"
BEGIN, END = "<!-- layout_speed.json: begin -->", "<!-- layout_speed.json: end -->"
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, max_position_embeddings=2048, tie_word_embeddings=True)
QUICK = dict(vocab_size=512, hidden_size=96, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
             intermediate_size=256, max_position_embeddings=512, tie_word_embeddings=True)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--write-docs", type=Path, default=None)
    return p.parse_args(argv)


def build_models(shape: dict, workdir: Path) -> dict:
    """{stock, uniform, uniform-stock, uneven}: see the module doc."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    stock = LlamaForCausalLM(LlamaConfig(**shape)).eval()
    sites, ffns = hp.find_sites(stock), hp.find_ffns(stock)
    group = shape["num_attention_heads"] // shape["num_key_value_heads"]
    per_group = max(1, group // 3)  # heads dropped from every key/value group
    heads = {s.name: [g * group + i for g in range(shape["num_key_value_heads"]) for i in range(per_group)]
             for s in sites}
    width = shape["intermediate_size"] // 3
    uniform = _pruned(stock, heads, {f.name: list(range(width)) for f in ffns})
    gen = torch.Generator().manual_seed(0)
    counts = _uneven_counts(len(ffns), width, shape["intermediate_size"], gen)
    uneven_heads = {s.name: heads[s.name] if i % 2 == 0 else [] for i, s in enumerate(sites)}
    uneven_heads = {k: v for k, v in uneven_heads.items() if v}
    extra = sum(len(heads[s.name]) for i, s in enumerate(sites) if i % 2 == 1)  # heads kept: neurons pay for them
    head_params = 2 * shape["hidden_size"] * (shape["hidden_size"] // shape["num_attention_heads"])
    counts = _pay(counts, extra * head_params // (3 * shape["hidden_size"]), shape["intermediate_size"] - 32)
    uneven = _pruned(stock, uneven_heads,
                     {f.name: torch.randperm(shape["intermediate_size"], generator=gen)[:n].tolist()
                      for f, n in zip(ffns, counts, strict=True)})
    path = hp.save_pruned(uniform, workdir / "uniform")
    reloaded = AutoModelForCausalLM.from_pretrained(path).eval()
    return {"stock": stock, "uniform": uniform, "uniform-stock": reloaded, "uneven": uneven}


def _pruned(model, heads: dict, neurons: dict):
    pruned = copy.deepcopy(model)
    if heads:
        hp.prune_heads(pruned, heads)
    hp.prune_neurons(pruned, neurons)
    return pruned.eval()


def _uneven_counts(n: int, mean: int, top: int, gen: torch.Generator) -> list[int]:
    """``n`` neuron counts to drop averaging ``mean`` (each in [0, top - 32]), spread at random."""
    raw = torch.rand(n, generator=gen) * 2 * mean
    counts = [min(int(x), top - 32) for x in raw]
    return _pay(counts, mean * n - sum(counts), top - 32)


def _pay(counts: list[int], more: int, cap: int) -> list[int]:
    """Spread ``more`` (may be negative) over ``counts`` one at a time, staying within [0, cap]."""
    counts = list(counts)
    i = 0
    while more != 0:
        step = 1 if more > 0 else -1
        j = i % len(counts)
        if 0 <= counts[j] + step <= cap:
            counts[j] += step
            more -= step
        i += 1
    return counts


def workloads(models: dict, args) -> dict:
    """{workload: {model: callable returning seconds}}."""
    vocab = models["stock"].config.vocab_size
    gen = torch.Generator().manual_seed(1)
    prefill_ids = torch.randint(0, vocab, (args.batch, args.seq), generator=gen)
    prompt = torch.randint(0, vocab, (1, args.prompt), generator=gen)

    def prefill(model):
        def run() -> float:
            with torch.no_grad():
                start = time.perf_counter()
                model(input_ids=prefill_ids, use_cache=False)
                return time.perf_counter() - start
        return run

    def decode(model):
        key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

        def run() -> float:
            with torch.no_grad():
                out = model(input_ids=prompt, use_cache=True)
                cache, token = generated_cache(out), out.logits[:, -1:].argmax(-1)
                start = time.perf_counter()
                for _ in range(args.new):
                    out = model(input_ids=token, use_cache=True, **{key: cache})
                    cache, token = generated_cache(out), out.logits[:, -1:].argmax(-1)
                return time.perf_counter() - start
        return run
    return {"prefill": {k: prefill(m) for k, m in models.items()}, "decode": {k: decode(m) for k, m in models.items()}}


def main(argv=None) -> dict | None:
    args = parse(argv)
    if args.write_docs:
        write_docs(args.write_docs, json.loads(OUTPUT.read_text()))
        return None
    for flag in ("batch", "seq", "prompt", "new", "rounds", "threads"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag} {getattr(args, flag)}; allowed: an integer >= 1")
    head = opening("layout_speed", __file__, argv, threads=args.threads, python=True)
    shape = QUICK if args.quick else SMOLLM2
    output = args.output or (OUTPUT.with_name("layout_speed_quick.json") if args.quick else OUTPUT)
    with tempfile.TemporaryDirectory() as tmp:
        models = build_models(shape, Path(tmp))
        out = {**head,
               "settings": {"shape": shape, "batch": args.batch, "seq": args.seq, "prompt": args.prompt,
                            "new": args.new, "rounds": args.rounds, "threads": args.threads, "dtype": "float32",
                            "seed": 0}, "models": {}, "workloads": {}}
        for name, m in models.items():
            out["models"][name] = {"class": type(m).__name__, "params": sum(p.numel() for p in m.parameters()),
                                   "prefill_flops": flop_breakdown(m, args.seq)["total"] * args.batch,
                                   "decode_flops": flop_breakdown(m, 1)["total"],
                                   "heads": [s.num_heads for s in hp.find_sites(m)],
                                   "ffn": [int(f.down.weight.shape[1]) for f in hp.find_ffns(m)]}
        settings = ProtocolSettings(min_rounds=args.rounds, max_rounds=args.rounds, budget_s=0.0,
                                    threads=args.threads)
        for workload, runs in workloads(models, args).items():
            timed = paired_rounds(runs, "stock", settings)
            flops = f"{workload}_flops"
            out["workloads"][workload] = {
                "median_s": timed["median_s"], "load": timed["load"], "reliable": timed["reliable"],
                "reason": timed["reason"], "seconds": timed["seconds"],
                "speedup": {k: {kk: v[kk] for kk in ("median", "low", "high", "coverage")}
                            for k, v in timed["ratios"].items()},
                "flop_limit": {k: out["models"]["stock"][flops] / out["models"][k][flops] for k in timed["ratios"]}}
            w = out["workloads"][workload]
            w["efficiency"] = {k: w["speedup"][k]["median"] / w["flop_limit"][k] for k in w["speedup"]}
            print(f"{workload}: " + ", ".join(f"{k} x{v['median']:.3f} [{v['low']:.3f}, {v['high']:.3f}] "
                                              f"(FLOP limit x{w['flop_limit'][k]:.3f})" for k, v in w["speedup"].items())
                  + ("" if timed["reliable"] else f" -- unreliable: {timed['reason']}"), flush=True)
            save(output, out)
    print(f"wrote {output}")
    return out


def table(data: dict) -> str:
    s = data["settings"]
    lines = [f"SmolLM2-135M's shape, random weights, float32, {s['threads']} thread(s), {s['rounds']} alternating "
             f"rounds; prefill {s['batch']} x {s['seq']} tokens, decode batch 1 ({s['new']} steps after a "
             f"{s['prompt']}-token prompt, KV cache); `{data['command']}`.", ""]
    rows = []
    for workload, w in data["workloads"].items():
        for name, r in w["speedup"].items():
            other = w["load"].get("other_cpu")
            load = ["-" if other is None else f"{other:.2f}", f"{w['load']['before']:.2f} / {w['load']['after']:.2f}"]
            speedup, efficiency = ((f"x{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}]", f"{w['efficiency'][name]:.2f}")
                                   if w["reliable"] else (f"not measured reliably ({w['reason']})", "-"))
            rows.append([workload, name, speedup, f"x{w['flop_limit'][name]:.3f}", efficiency, *load])
    return "\n".join(lines + markdown_table(["workload", "model", "speed-up over stock [interval]", "FLOP limit",
                                             "efficiency", "other processes' CPU (cores)",
                                             "load average before / after"], rows))


def write_docs(page: Path, data: dict) -> None:
    write_section(page, BEGIN, END, table(data))


if __name__ == "__main__":
    main()
