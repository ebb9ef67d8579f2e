"""GPU speed of pruned models at real shapes (issue 37): tokens/s of prefill and decode, and the paper's Table 4.

    make gpu-bench                                   # on a CUDA machine, no network: the real figures
    python benchmarks/gpu_bench.py                   # the same, writes benchmarks/results/gpu_bench.json
    python benchmarks/gpu_bench.py --dry-run --out /tmp/gpu_bench.json   # CPU, tiny shapes, the same schema
    python benchmarks/gpu_bench.py --shapes llama-3-8b --compress-shapes llama-3-8b --compress-budgets 0.2 --update
                                                     # a part; the file's other rows kept, each naming its run

Models are built from configs with random weights (speed does not depend on the values): Llama-3.2-1B and
Llama-3-8B shapes in bfloat16 with sdpa attention, each pruned by headprune's surgery (``prune_heads``,
``prune_neurons``) to remove 20/30/50% of its non-embedding parameters: the same number of query heads from
every key/value group (the KV cache stays), chosen by headprune's one budget in whole blocks
(``selection.aligned``, random scores; widths may differ between layers), every kept FFN width and attention
width (heads x head_dim) a multiple of 128 (GPU tensor-core tiles). Workloads: prefill
of 1 x 2048 and 16 x 512 tokens (the last position's logits, as generation needs), and decode of batch 1 and
32 with a key/value cache (a 128-token prompt prefilled outside the clock, then greedy steps). The paper's
Table 4: a BERT-base shape (12 x 12 heads), 50% of the heads removed at random (uneven, as importance
pruning is), examples/s at batch 1/4/16/64 and 128 tokens.

Before the speed rows, the pruning itself (issue 34): headprune's selected LLM configuration at 20% and 50%
(``benchmarks/results/llm_peers.json``'s ``selected``) compresses the Llama-3.2-1B and Llama-3-8B shapes in
bfloat16 on ``low_memory=True`` with 8 random calibration sequences of 256 tokens: wall seconds, each stage's
seconds, and the peak of CUDA memory allocated against the weights' bytes; ``growth`` fits ``seconds ~
params^alpha`` per configuration. A compress row that fails is recorded with its error (the speed rows still
run); one whose time, extrapolated from the smaller shape's, would pass ``--compress-limit`` is skipped, not started.

Every pair is timed with :func:`headprune.bench.protocol.paired_rounds` (alternating rounds, median ratio with
a distribution-free interval, the load before and after). Each row carries the limit its workload implies:
the FLOP ratio for prefill, the ratio of bytes read per generated token (weights + KV cache) for decode.
Rounds are budgeted by time so the whole run stays under ``--time-limit`` (default 450 s, under 8 minutes on
an H100 with set-up); a row that would start past the limit is recorded as skipped, not guessed. Without CUDA
and without ``--dry-run`` it says so, exits 2 and writes nothing.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import command as recorded_command  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_bench.json"
SCHEMA = 2
COMPRESS_BUDGETS = (0.2, 0.5)  # the selected configuration at each (llm_peers.json), timed before the speed rows
FRACTIONS = (0.2, 0.3, 0.5)  # shares of non-embedding parameters removed
PAPER_TABLE4 = {1: 1.019, 4: 1.027, 16: 1.175, 64: 1.175}  # BERT-base MNLI, 50% of heads, GTX 1080Ti
LLAMA = {  # the published configs' shapes (no weights needed)
    "llama-3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=64, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True),
    "llama-3-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False),
}
BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072, vocab_size=30522)
REAL = {"llms": LLAMA, "bert": BERT_BASE, "align": 128, "prefill": ((1, 2048), (16, 512)), "decode": (1, 32),
        "prompt_len": 128, "new_tokens": 32, "table4_batches": (1, 4, 16, 64), "table4_seq": 128,
        "dtype": "bfloat16", "min_rounds": 5, "budget_s": 6.0,
        "compress": {"shapes": ("llama-3.2-1b", "llama-3-8b"), "calib_blocks": 8, "calib_length": 256}}
DRY = {"llms": {"llama-tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                                   head_dim=8, intermediate_size=256, vocab_size=512, tie_word_embeddings=True)},
       "bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=128),
       "align": 16, "prefill": ((1, 32), (2, 16)), "decode": (1, 2), "prompt_len": 8, "new_tokens": 4,
       "table4_batches": (1, 4), "table4_seq": 16, "dtype": "float32", "min_rounds": 3, "budget_s": 0.0,
       "compress": {"shapes": ("llama-tiny", "llama-tiny-2x"), "calib_blocks": 2, "calib_length": 16}}
DRY["llms_compress_only"] = {"llama-tiny-2x": dict(DRY["llms"]["llama-tiny"], hidden_size=128, intermediate_size=512)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help=f"JSON to write (default {RESULTS}; required with --dry-run)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, the same JSON schema")
    ap.add_argument("--time-limit", type=float, default=450.0, help="seconds after which no new row starts")
    ap.add_argument("--compress-limit", type=float, default=180.0,
                    help="seconds (from the start) after which no compress row starts or is predicted to end")
    ap.add_argument("--shapes", default=None, help="comma-separated shapes of the speed rows (default: all; "
                                                   "bert-base is the paper's Table 4)")
    ap.add_argument("--compress-shapes", default=None, help="comma-separated shapes of the compress rows (default: all)")
    ap.add_argument("--compress-budgets", default=None,
                    help=f"comma-separated budgets of the compress rows (default {','.join(map(str, COMPRESS_BUDGETS))})")
    ap.add_argument("--update", action="store_true",
                    help="keep the rows of --out that this run does not measure (each row names its run)")
    args = ap.parse_args(argv)
    problem = _check(args)
    if problem:
        print(f"gpu_bench: {problem}", file=sys.stderr)
        return 2
    spec = _spec(args)
    device = torch.device("cpu" if args.dry_run else "cuda")
    out = args.out or RESULTS
    result = run(spec, device, (args.time_limit, args.compress_limit), dry_run=args.dry_run)
    if args.update and out.exists():
        result = _merge(json.loads(out.read_text()), result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for row in result["compress"]:
        print(_compress_line(row))
    for row in result["rows"] + result["table4"]:
        print(_line(row))
    print(f"{len(result['rows'])} rows, {len(result['table4'])} Table 4 rows, {len(result['skipped'])} skipped, "
          f"{result['seconds']:.0f} s -> {out}")
    return 0


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _check(args) -> str | None:
    """The first problem with the arguments, as one line (None: none)."""
    spec = DRY if args.dry_run else REAL
    speed = [*spec["llms"], "bert-base"]
    compress = list(spec["compress"]["shapes"])
    if not 0 <= args.compress_limit <= args.time_limit:
        return f"--compress-limit {args.compress_limit}: allowed 0 to --time-limit ({args.time_limit})"
    for flag, value, allowed in (("--shapes", args.shapes, speed), ("--compress-shapes", args.compress_shapes, compress)):
        names = _names(value)
        if names is not None and (not names or any(n not in allowed for n in names)):
            return f"{flag} {value!r}: allowed a comma-separated subset of {', '.join(allowed)}"
    if args.compress_budgets is not None:
        selected = json.loads((RESULTS.parent / "llm_peers.json").read_text())["selected"]
        budgets = _names(args.compress_budgets)
        if not budgets or any(str(_float(b)) not in selected for b in budgets):
            return f"--compress-budgets {args.compress_budgets!r}: allowed budgets llm_peers.json selects at: " + \
                ", ".join(selected)
    out = args.out or RESULTS
    if args.dry_run and args.out is None:
        return "--dry-run needs --out PATH (it never overwrites the real figures)"
    old = json.loads(out.read_text()) if args.update and out.exists() else None
    if old is not None and (old.get("dry_run") != args.dry_run or old.get("schema") != SCHEMA):
        return (f"--update: {out} is a {'dry' if old.get('dry_run') else 'GPU'} run of schema {old.get('schema')}; "
                f"allowed: a {'dry' if args.dry_run else 'GPU'} run of schema {SCHEMA}")
    if not args.dry_run and not torch.cuda.is_available():
        return (f"no CUDA device here (torch {torch.__version__} sees none); nothing was run and {out} was not written "
                "(--dry-run runs tiny shapes on the CPU)")
    return None


def _float(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def _spec(args) -> dict:
    """The spec of this run: the shapes and budgets the flags name."""
    spec = dict(DRY if args.dry_run else REAL)
    shapes = _names(args.shapes)
    if shapes is not None:
        spec["llms"] = {k: v for k, v in spec["llms"].items() if k in shapes}
        spec["table4"] = "bert-base" in shapes
    compress = dict(spec["compress"])
    if args.compress_shapes is not None:
        compress["shapes"] = tuple(_names(args.compress_shapes) or ())
    if args.compress_budgets is not None:
        compress["budgets"] = tuple(float(b) for b in _names(args.compress_budgets) or ())
    spec["compress"] = compress
    return spec


def _merge(old: dict, new: dict) -> dict:
    """``new`` with the rows of ``old`` it did not measure; every row and skip names its run (1, 2, ...)."""
    runs = old["runs"]
    n = len(runs) + 1
    for key in ("rows", "table4", "compress", "skipped"):
        for r in new[key]:
            r["run"] = n

    def speed(r):
        return r["shape"], r["fraction"], r.get("workload"), r.get("batch"), r.get("seq_len")

    def comp(r):
        return r["shape"], r["budget"]
    done = {speed(r) for r in new["rows"] + new["table4"]} | {comp(r) for r in new["compress"]}
    done |= {comp(r) if "budget" in r else speed(r) for r in new["skipped"]}
    shapes = {speed(r)[:2] for r in new["rows"] + new["table4"]}  # a whole model skipped before: now measured
    merged = dict(new)
    merged["rows"] = [r for r in old["rows"] if speed(r) not in done] + new["rows"]
    merged["table4"] = [r for r in old["table4"] if speed(r) not in done] + new["table4"]
    merged["compress"] = [r for r in old["compress"] if comp(r) not in done] + new["compress"]
    merged["skipped"] = [s for s in old["skipped"] if (comp(s) if "budget" in s else speed(s)) not in done
                         and ("budget" in s or "workload" in s or (s["shape"], s["fraction"]) not in shapes)] + new["skipped"]
    merged["models"] = {**old["models"], **new["models"]}
    merged["compress_growth"] = _growth(merged["compress"])
    merged["runs"] = runs + [{**new["runs"][0], "run": n}]
    return merged


def run(spec: dict, device: torch.device, limits: tuple[float, float], *, dry_run: bool) -> dict:
    """Every row; ``limits`` = (seconds after which no row starts, the same for compress rows)."""
    import transformers

    import headprune
    from headprune.bench.protocol import ProtocolSettings

    start = time.perf_counter()
    # one thread drives a GPU; on the CPU (the dry run) torch's own threads do the work
    threads = 1 if device.type == "cuda" else torch.get_num_threads()
    protocol = ProtocolSettings(min_rounds=spec["min_rounds"], budget_s=spec["budget_s"], warmup=1, threads=threads)
    time_limit, compress_limit = limits
    run_ = _Run(protocol, device, start + time_limit)
    compress_rows = _compress_rows(spec, run_, start + compress_limit)
    models = {shape: _llm_rows(shape, config, spec, run_) for shape, config in spec["llms"].items()}
    if spec.get("table4", True):
        models["bert-base"] = _table4(spec, run_)
    rows, table4, skipped = run_.rows, run_.table4, run_.skipped
    for r in (*compress_rows, *rows, *table4, *skipped):
        r["run"] = 1
    versions = {"headprune": headprune.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version(), "cuda": torch.version.cuda}
    command, seconds = recorded_command(__file__), round(time.perf_counter() - start, 1)
    return {"schema": SCHEMA, "dry_run": dry_run, "device": _device_name(device), "dtype": spec["dtype"],
            "attn_implementation": "sdpa", "align": spec["align"], "fractions": list(FRACTIONS),
            "protocol": {**vars(protocol), "note": "headprune.bench.protocol.paired_rounds"}, "versions": versions,
            "command": command, "time_limit_s": time_limit, "compress_limit_s": compress_limit, "seconds": seconds,
            "compress": compress_rows, "compress_growth": _growth(compress_rows),
            "models": models, "rows": rows, "table4": table4, "paper_table4": {str(b): v for b, v in PAPER_TABLE4.items()},
            "skipped": skipped, "runs": [{"run": 1, "command": command, "seconds": seconds,
                                          "device": _device_name(device), "versions": versions}]}


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or 'unknown'})"


def _build(kind: str, config: dict, spec: dict, device: torch.device):
    import transformers as T

    dtype = getattr(torch, spec["dtype"])
    torch.manual_seed(0)
    if kind == "llama":
        cfg, auto = T.LlamaConfig(**config, max_position_embeddings=4096), T.AutoModelForCausalLM
    else:
        cfg, auto = T.BertConfig(**config, num_labels=3), T.AutoModelForSequenceClassification
    with torch.device(device):  # initialised where it runs, in its dtype (an 8B model never exists in float32)
        model = auto.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


# ---------------------------------------------------------------- pruning plans


def _llm_plan(model, fraction: float, align: int, seed: int) -> tuple[dict, dict]:
    """(dropped heads, dropped neurons) from headprune's one budget over heads and neurons in whole blocks
    (:func:`headprune.selection.aligned.select_aligned`): ``1 - fraction`` of the parameters kept, every changed
    width a multiple of ``align``, GQA uniform (the same query heads from every key/value group: the KV cache
    stays), at least one head step per site. Scores are random (weights are random): each unit's score is its
    price times a uniform draw, so heads and neurons are traded evenly (layers may keep different widths, as a real
    plan's do)."""
    import headprune as hp
    from headprune.core.model.unit_cost import unit_costs
    from headprune.selection.aligned import Widths, select_aligned
    from headprune.selection.budgets import Budget, HeadRule
    from headprune.selection.gqa import kv_groups

    g = torch.Generator().manual_seed(seed)
    costs = unit_costs(model, "params")

    def draw(prices):
        return {k: v * torch.rand(v.shape, generator=g, dtype=torch.float64) for k, v in prices.items()}

    widths = Widths(align, {s.name: s.head_dim for s in hp.find_sites(model)})
    heads, neurons, _ = select_aligned(draw(costs.heads), draw(costs.neurons), costs, Budget.of(share=1 - fraction),
                                       widths, units="both", groups=kv_groups(model),
                                       rule=HeadRule(gqa="uniform", min_per_site=1))
    return {k: v for k, v in heads.items() if v}, {k: v for k, v in neurons.items() if v}


def _non_embedding(model) -> int:
    emb = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
           for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in emb)


def _shape_info(model, original) -> dict:
    import headprune as hp

    attn = [s.num_heads * s.head_dim for s in hp.find_sites(model)]
    ffn = [f.width for f in hp.find_ffns(model)]
    params, non_emb = sum(p.numel() for p in model.parameters()), _non_embedding(model)
    return {"params": params, "non_embedding_params": non_emb,
            "share_removed": 1 - non_emb / _non_embedding(original) if original is not None else 0.0,
            "attention_widths": attn, "ffn_widths": ffn, "heads": sum(s.num_heads for s in hp.find_sites(model)),
            "weight_bytes": _linear_bytes(model)}


def _linear_bytes(model) -> int:
    """Bytes of every Linear weight: what one decode step reads (the input embedding reads one row per token)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, torch.nn.Linear))


# ---------------------------------------------------------------- workloads and rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ids(model, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(batch * 100003 + seq)
    return torch.randint(3, model.config.vocab_size, (batch, seq), generator=g).to(device)


def _last_logits(model) -> dict:
    """``logits_to_keep=1`` where the forward takes it: a prefill needs the last position's logits only."""
    import inspect

    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def _forward(model, batch: int, seq: int, device: torch.device, *, causal: bool):
    ids = _ids(model, batch, seq, device)
    kwargs = {"use_cache": False, **_last_logits(model)} if causal else {"attention_mask": torch.ones_like(ids)}

    def call() -> float:
        with torch.inference_mode():
            _sync(device)
            t = time.perf_counter()
            model(input_ids=ids, **kwargs)
            _sync(device)
            return time.perf_counter() - t
    return call


def _decode(model, batch: int, prompt_len: int, new_tokens: int, device: torch.device):
    import inspect

    prompt = _ids(model, batch, prompt_len, device)
    last = _last_logits(model)
    # transformers >= 5.24 names the cache ``cache`` (``past_key_values`` deprecated); older ones the latter
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def call() -> float:
        with torch.inference_mode():
            out = model(input_ids=prompt, use_cache=True, **last)  # the prompt's cache, outside the clock
            past, token = out[name], out.logits[:, -1:].argmax(-1)
            _sync(device)
            t = time.perf_counter()
            for _ in range(new_tokens):
                out = model(input_ids=token, use_cache=True, **{name: past})
                past, token = out[name], out.logits[:, -1:].argmax(-1)
            _sync(device)
            return time.perf_counter() - t
    return call


def _prefill_flops(model, seq: int) -> int:
    """Matmul FLOPs of one sequence's prefill, the output head on the last position only."""
    from headprune.core.model.cost import flop_breakdown

    head = model.get_output_embeddings()
    total = flop_breakdown(model, seq)["total"]
    return total - (2 * (seq - 1) * head.weight.numel() if head is not None else 0)


def _decode_bytes(model, batch: int, prompt_len: int, new_tokens: int) -> float:
    """Bytes read per decode step: every Linear weight once, and each sequence's cache at its mean length."""
    from headprune.core.model.kvcache import kv_cache_bytes

    return _linear_bytes(model) + batch * kv_cache_bytes(model)["per_token"] * (prompt_len + new_tokens / 2)


def _measure(workloads: dict, protocol, row: dict, work: float, limit: float) -> dict:
    from headprune.bench.protocol import paired_rounds

    r = paired_rounds(workloads, "unpruned", protocol)
    ratio = r["ratios"]["pruned"]
    row.update({"throughput": {n: work / r["median_s"][n] for n in ("unpruned", "pruned")},
                "ratio": ratio["median"], "ratio_low": ratio["low"], "ratio_high": ratio["high"],
                "coverage": ratio["coverage"], "rounds": r["rounds"], "limit": limit,
                "efficiency": (ratio["median"] - 1) / (limit - 1) if abs(limit - 1) > 1e-9 else None,
                "reliable": r["reliable"], "reason": r["reason"], "load": r["load"], "seconds": r["seconds"]})
    return row


@dataclass
class _Run:
    """What every row needs: the protocol, the device, the deadline, and where rows go."""

    protocol: object
    device: torch.device
    deadline: float
    rows: list = field(default_factory=list)
    table4: list = field(default_factory=list)
    skipped: list = field(default_factory=list)

    def row(self, into: list, base: dict, make) -> None:
        """Measure one row (``make()`` -> workloads, work per call, limit), or record it as skipped past the deadline."""
        if time.perf_counter() > self.deadline:
            self.skipped.append({**base, "reason": "time limit reached before this row"})
            return
        workloads, work, limit = make()
        into.append(_measure(workloads, self.protocol, dict(base), work, limit))


def _llm_rows(shape: str, config: dict, spec: dict, run: _Run) -> dict:
    import headprune as hp

    original = _build("llama", config, spec, run.device)
    info = {"config": config, "unpruned": _shape_info(original, None), "pruned": {}}
    for fraction in FRACTIONS:
        key = f"{round(fraction * 100)}%"
        if time.perf_counter() > run.deadline:
            run.skipped.append({"shape": shape, "fraction": fraction, "reason": "time limit reached before this model"})
            continue
        heads, neurons = _llm_plan(original, fraction, spec["align"], seed=round(fraction * 100))
        pruned = copy.deepcopy(original)
        hp.prune_heads(pruned, heads)
        hp.prune_neurons(pruned, neurons)
        p = _shape_info(pruned, original)
        p["aligned"] = all(w % spec["align"] == 0 for w in p["attention_widths"] + p["ffn_widths"])
        info["pruned"][key] = p
        _pair_rows({"shape": shape, "fraction": fraction}, original, pruned, spec, run)
        del pruned
        _free(run.device)
    del original
    _free(run.device)
    return info


def _pair_rows(where: dict, original, pruned, spec: dict, run: _Run) -> None:
    """Prefill and decode rows of one pruned model against the unpruned one."""
    pair, device = {"unpruned": original, "pruned": pruned}, run.device
    prompt, new = spec["prompt_len"], spec["new_tokens"]
    for batch, seq in spec["prefill"]:
        def prefill(b=batch, s=seq):
            return ({n: _forward(m, b, s, device, causal=True) for n, m in pair.items()}, b * s,
                    _prefill_flops(original, s) / _prefill_flops(pruned, s))
        run.row(run.rows, {**where, "workload": "prefill", "batch": batch, "seq_len": seq, "unit": "tokens",
                           "limit_kind": "FLOPs per token"}, prefill)
    for batch in spec["decode"]:
        def decode(b=batch):
            return ({n: _decode(m, b, prompt, new, device) for n, m in pair.items()}, b * new,
                    _decode_bytes(original, b, prompt, new) / _decode_bytes(pruned, b, prompt, new))
        run.row(run.rows, {**where, "workload": "decode", "batch": batch, "seq_len": prompt, "new_tokens": new,
                           "unit": "tokens", "limit_kind": "bytes read per token (weights + KV cache)"}, decode)


def _table4(spec: dict, run: _Run) -> dict:
    """The paper's section 4.3: BERT-base shape, half of the 144 heads removed at random, examples/s by batch."""
    import headprune as hp
    from headprune.bench.timing import fraction_plan

    original = _build("bert", spec["bert"], spec, run.device)
    pruned = copy.deepcopy(original)
    hp.prune_heads(pruned, fraction_plan(original, 0.5, order="random", seed=0))
    seq, device = spec["table4_seq"], run.device
    limit = _prefill_flops_encoder(original, seq) / _prefill_flops_encoder(pruned, seq)
    pair = {"unpruned": original, "pruned": pruned}
    for batch in spec["table4_batches"]:
        def forward(b=batch):
            return {n: _forward(m, b, seq, device, causal=False) for n, m in pair.items()}, b, limit
        run.row(run.table4, {"shape": "bert-base", "fraction": 0.5, "units": "heads", "workload": "forward",
                             "batch": batch, "seq_len": seq, "unit": "examples", "limit_kind": "FLOPs per example",
                             "paper": PAPER_TABLE4.get(batch)}, forward)
    info = {"config": spec["bert"], "unpruned": _shape_info(original, None),
            "pruned": {"50% of heads": _shape_info(pruned, original)}}
    pair.clear()  # the models go before the next shape is built
    _free(run.device)
    return info


def _prefill_flops_encoder(model, seq: int) -> int:
    from headprune.core.model.cost import flop_breakdown

    return flop_breakdown(model, seq)["total"]


# ---------------------------------------------------------------- the pruning itself (issue 34)


def _selected(budget: float) -> str:
    """The configuration ``llm_peers.json`` selects at ``budget`` on held-out calibration blocks."""
    return json.loads((RESULTS.parent / "llm_peers.json").read_text())["selected"][str(budget)]


def _compress_rows(spec: dict, run: _Run, deadline: float) -> list[dict]:
    """The selected configuration at each of :data:`COMPRESS_BUDGETS` on each shape, smallest first; a row whose
    seconds, extrapolated linearly in parameters from the smaller shape's, would end past ``deadline`` is skipped."""
    shapes = {**spec["llms"], **spec.get("llms_compress_only", {})}
    rows: list[dict] = []
    for budget in spec["compress"].get("budgets", COMPRESS_BUDGETS):
        name, before = _selected(budget), None
        for shape in spec["compress"]["shapes"]:
            base = {"shape": shape, "budget": budget, "configuration": name}
            left = deadline - time.perf_counter()
            guess = _extrapolate(before, shapes[shape]) if before else 0.0
            if left <= 0 or guess > left:
                run.skipped.append({**base, "reason": f"compress limit: {left:.0f} s left, about {guess:.0f} s needed"})
                continue
            try:
                row = _compress_one(shapes[shape], spec, run.device, name, budget)
            except Exception as e:  # noqa: BLE001 - a failure on the device is a result; the speed rows still run
                import traceback

                row = {"ok": False, "error": f"{type(e).__name__}: {e}"[:500], "traceback": traceback.format_exc()[-2000:]}
            rows.append({**base, **row})
            before = row if row["ok"] else None
            _free(run.device)
    return rows


def _extrapolate(row: dict, config: dict) -> float:
    """Seconds of the same configuration at ``config``'s shape, linear in parameters from ``row``'s."""
    import transformers as T

    with torch.device("meta"):
        params = sum(p.numel() for p in T.LlamaForCausalLM(T.LlamaConfig(**config)).parameters())
    return row["seconds"] * params / row["params"]


def _compress_one(config: dict, spec: dict, device: torch.device, name: str, budget: float) -> dict:
    """``compress`` with configuration ``name`` removing ``budget`` of the non-embedding parameters, in place on
    ``low_memory=True`` (a copy where the configuration has a ``step_standin``, which low_memory refuses): seconds,
    stage seconds, the CUDA peak against the weights, what was removed."""
    from peers.headprune_rows import settings_for

    from headprune import PruneSettings, compress

    model = _build("llama", config, spec, device)
    weights = sum({p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}.values())
    params = sum(p.numel() for p in model.parameters())
    cal = spec["compress"]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, config["vocab_size"], (cal["calib_blocks"], cal["calib_length"]), generator=g)  # [n, T]
    batches = [{"input_ids": ids[i : i + 1], "attention_mask": torch.ones_like(ids[i : i + 1])} for i in range(len(ids))]
    given = settings_for(name, model, budget)
    low = given.step_standin is None  # step_standin's last pass reads the model passed, which low_memory cuts first
    settings = PruneSettings(**{**given.to_dict(), "low_memory": low})
    non_embedding = _non_embedding(model)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    t = time.perf_counter()
    result = compress(model, batches, settings)
    _sync(device)
    seconds = time.perf_counter() - t
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    after = result.sizes["after"]["params"]
    return {"ok": True, "seconds": seconds, "stage_seconds": result.seconds, "params": params,
            "weight_bytes": weights, "peak_bytes": peak, "peak_measure": "torch.cuda.max_memory_allocated",
            "peak_over_weights": peak / weights if peak is not None else None,
            "params_after": after, "share_removed": 1 - _non_embedding(result.model) / non_embedding,
            "heads_dropped": sum(map(len, result.dropped_heads.values())),
            "neurons_dropped": sum(map(len, result.dropped_neurons.values())),
            "calib_blocks": cal["calib_blocks"], "calib_length": cal["calib_length"], "low_memory": low}


def _growth(rows: list[dict]) -> dict:
    """Per configuration, ``alpha`` of ``seconds ~ params^alpha`` over its successful rows (least squares on logs)."""
    from billion_envelope import growth_fit

    out = {}
    for name in dict.fromkeys(r["configuration"] for r in rows):
        ok = [r for r in rows if r["configuration"] == name and r["ok"]]
        if len({r["params"] for r in ok}) >= 2:
            out[name] = {"alpha": growth_fit(ok), "shapes": [r["shape"] for r in ok]}
    return out


def _compress_line(row: dict) -> str:
    where = f"compress {row['shape']:<13} {row['budget']:.0%} {row['configuration']}"
    if not row["ok"]:
        return f"{where}: FAILED {row['error']}"
    peak = f", peak {row['peak_over_weights']:.2f}x the weights" if row["peak_over_weights"] is not None else ""
    return f"{where}: {row['seconds']:.1f} s, {row['share_removed']:.1%} removed{peak}"


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _line(row: dict) -> str:
    t = row["throughput"]
    flag = "" if row["reliable"] else "  UNRELIABLE: " + row["reason"]
    return (f"{row['shape']:<13} {row['fraction']:.0%} {row['workload']:<7} batch {row['batch']:>3} x {row['seq_len']:>4}: "
            f"{t['unpruned']:>10.1f} -> {t['pruned']:>10.1f} {row['unit']}/s  x{row['ratio']:.3f} "
            f"[{row['ratio_low']:.3f}, {row['ratio_high']:.3f}]  limit x{row['limit']:.3f}{flag}")


if __name__ == "__main__":
    sys.exit(main())
