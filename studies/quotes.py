"""Where every number quoted in README.md, REPRODUCTION.md and docs/*.md comes from (used by studies/summarize.py --check).

In the Markdown a quoted number is ``<!--q:NAME-->value<!--/q-->`` and a generated table
``<!--block:NAME-->...<!--/block-->``. NAME is ``kind:arg:arg...`` and an optional ``~FORMAT``
(a Python format spec, ``p`` for a p-value, or ``MB``/``GB``/``min`` for bytes and seconds; default per kind). Each kind below reads one committed file:

- ``base:RUN``                      results.json ``base`` of a study run (accuracy/F1/Matthews in %)
- ``score:RUN:ORDER:FRACTION``      a pruning-curve step's score (``curves`` runs; %-scaled as above)
- ``rel:RUN:ORDER:FRACTION``        the same step relative to the unpruned model, in %
- ``abl:RUN:KIND:STAT``             one-head ablation per attention kind (KIND ``all`` for every head):
                                    ``n``, ``sig`` (significant, as the run says), ``better`` (masking helps),
                                    ``min``/``max`` delta, ``halfwidth`` (median half-width of the heads' 95%
                                    intervals: about the smallest effect the run could detect)
- ``abo:RUN:SITE:STAT``             all-but-one per site: ``delta``, ``p`` (two-sided), ``padj`` (Holm)
- ``abo:RUN:*:STAT``                over sites: ``sig``, ``min``/``max`` delta of the sites not Holm-significant
- ``cd:RUN:STAT``                   cross-domain: ``r``, ``p``, ``n``, ``base:NAME``
- ``nsl:RUN:ORDER:STAT``            a curve's tested "no significant loss up to" (results.json
                                    ``no_significant_loss``): ``share`` in %, ``low`` (worst relative quality
                                    its interval allows there, in %), ``first`` (share of the first loss, %)
- ``dyn:RUN:EPOCH:FRACTION``        relative score (%) at that epoch (``base`` for FRACTION: the unpruned score)
- ``speed:PLAN:BATCH:STAT``         benchmarks/results/pruned_speed.json (``x``, ``flop``, ``orig``, ``pruned``,
                                    ``eff`` in %; PLAN ``*`` and STAT ``effmin``/``effmax``: over plans and batches)
- ``train:MODEL:FIELD``             last epoch of benchmarks/results/train_models.json (``n_train``, ``n_eval``,
                                    ``eval_accuracy`` in %, ``eval_bleu``)
- ``mc:FILE:METHOD:FRACTION``       method comparison score (benchmarks/results/FILE.json; %-scaled)
- ``demo:FIELD``                    benchmarks/results/demo.json (dotted path into it)
- ``sig:RUN:FIELD``                 a study run's signature field (e.g. ``n``, ``n_b``: examples)
- ``json:FILE:FIELD``               any benchmarks/results/FILE.json (dotted path into it)
- ``mcmin:FILE:METHOD``             smallest two-sided p of METHOD's steps below I_h (method comparison)
- ``fam:VERDICT``                   how many model types benchmarks/results/families.json gives VERDICT
                                    (``exact``, ``refused``, ``not_built``, ...)

Significance is read, never recomputed: a quote of a p-value, an adjusted p or a "significant" count
reads the run's own ``p_value`` / ``p_adjusted`` / ``significant``. A run whose signature does not carry
today's ``headprune.evaluation.significance.STATISTICS`` was tested by older code: its significance
quotes raise :class:`Stale` (``summarize --check`` lists such runs with the command that regenerates
them), and so do benchmark files whose paired tests carry no adjusted p.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDIES = ROOT / "studies" / "results"
BENCH = ROOT / "benchmarks" / "results"
PERCENT = ("accuracy", "f1", "matthews")


class Stale(Exception):
    """A quote needs the significance of a results file made by older statistics code: rerun it."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where = where


@functools.cache
def statistics_version() -> str:
    """The statistics the current code reports (recorded in every study run's signature)."""
    from headprune.evaluation.significance import STATISTICS

    return STATISTICS


def stale_reason(res: dict) -> str | None:
    """Why a study run's significance is not today's (None when it is)."""
    made = res.get("signature", {}).get("statistics")
    if made == statistics_version():
        return None
    return "made before the current significance tests" if made is None else f"made by statistics {made!r}"


@functools.cache
def load(path: str) -> dict:
    return json.loads(Path(path).read_text())


def study(run: str) -> dict:
    return load(str(STUDIES / run / "results.json"))


def bench(name: str) -> dict:
    return load(str(BENCH / f"{name}.json"))


def scaled(metric: str, x: float) -> float:
    return 100 * x if metric in PERCENT else x


def tested(run: str) -> dict:
    """A study run's results.json whose tests are today's; :class:`Stale` otherwise."""
    res = study(run)
    why = stale_reason(res)
    if why is not None:
        raise Stale(f"studies/results/{run}", why)
    return res


def adjusted(rows: list[dict], where: str) -> list[float]:
    """Each row's own adjusted p (written by the run over its sweep); :class:`Stale` if a row has none."""
    if any("p_adjusted" not in r for r in rows):
        raise Stale(where, "its tests carry no adjusted p (made before the current significance tests)")
    return [r["p_adjusted"] for r in rows]


# ---------------------------------------------------------------- kinds


def _base(run: str) -> float:
    res = study(run)
    return scaled(res["metric"], res["base"])


def _curve_row(run: str, order: str, fraction: str) -> dict:
    return next(r for r in study(run)["rows"] if r["order"] == order and abs(r["fraction"] - float(fraction)) < 1e-9)


def _score(run: str, order: str, fraction: str) -> float:
    return scaled(study(run)["metric"], _curve_row(run, order, fraction)["score"])


def _rel(run: str, order: str, fraction: str) -> float:
    return 100 * _curve_row(run, order, fraction)["relative"]


def _relci(run: str, order: str, fraction: str, end: str) -> float:
    """The 95% interval of a curve point relative to unpruned (``low`` / ``high``, percent), from the
    interval of the change that the point's own paired test gives (higher-is-better metrics)."""
    res = tested(run)
    row = _curve_row(run, order, fraction)
    if row.get("ci_low") is None:
        raise ValueError(f"{run}: {order} at {fraction} carries no interval (orders averaged over seeds have none)")
    return 100 * (res["base"] + row["ci_" + {"low": "low", "high": "high"}[end]]) / res["base"]


def _abl(run: str, kind: str, stat: str) -> float:
    res = tested(run) if stat == "sig" else study(run)
    sig = [r.get("significant") for r in res["rows"]]
    rows = [(r, s) for r, s in zip(res["rows"], sig, strict=True) if kind == "all" or r["kind"] == kind]
    deltas = [scaled(res["metric"], r["delta"]) for r, _ in rows]
    if stat == "halfwidth":
        tested(run)
        widths = sorted(scaled(res["metric"], (r["ci_high"] - r["ci_low"]) / 2) for r, _ in rows)
        return widths[len(widths) // 2] if len(widths) % 2 else (widths[len(widths) // 2 - 1] + widths[len(widths) // 2]) / 2
    return {"n": lambda: len(rows), "sig": lambda: sum(s for _, s in rows),
            "better": lambda: sum(r["damage"] < 0 for r, _ in rows),
            "min": lambda: min(deltas), "max": lambda: max(deltas)}[stat]()


def _abo(run: str, site: str, stat: str) -> float:
    if stat == "delta":
        res = study(run)
        return scaled(res["metric"], next(r for r in res["rows"] if r["site"] == site)["delta"])
    res = tested(run)
    rows = res["rows"]
    if site == "*":
        rest = [scaled(res["metric"], r["delta"]) for r in rows if not r["significant"]]
        widths = sorted(scaled(res["metric"], (r["ci_high"] - r["ci_low"]) / 2) for r in rows)
        return {"sig": lambda: sum(bool(r["significant"]) for r in rows), "min": lambda: min(rest),
                "max": lambda: max(rest), "halfwidth": lambda: statistics.median(widths)}[stat]()
    row = next(r for r in rows if r["site"] == site)
    return {"p": lambda: row["p_value"], "padj": lambda: row["p_adjusted"]}[stat]()


def _cd(run: str, stat: str, name: str = "") -> float:
    res = study(run)
    if stat == "base":
        return scaled(res["metric"], res["base"][name])
    if stat == "n":
        return len((STUDIES / run / "cross_domain.csv").read_text().strip().splitlines()) - 1
    return {"r": res["pearson_r"], "p": res["p_value"]}[stat]


def _nsl(run: str, order: str, stat: str) -> float:
    t = tested(run)["no_significant_loss"][order]
    value = {"share": t["share"], "low": t["relative_low_at_share"], "first": t["first_loss"]}[stat]
    if value is None:
        raise ValueError(f"{run}: no_significant_loss[{order!r}][{stat!r}] is empty (no such step)")
    return 100 * value


def _dyn(run: str, epoch: str, fraction: str) -> float:
    rows = [r for r in study(run)["rows"] if r["epoch"] == int(epoch)]
    if fraction == "base":
        return next(r["score"] for r in rows if r["fraction"] == 0)
    return 100 * next(r["relative"] for r in rows if abs(r["fraction"] - float(fraction)) < 1e-9)


def _speed(plan: str, batch: str, stat: str) -> float:
    per = bench("pruned_speed")["per_batch"]
    if plan == "*":
        effs = [100 * b[p]["efficiency"] for b in per for p in ("even", "uneven")]
        return {"effmin": min(effs), "effmax": max(effs)}[stat]
    b = next(b for b in per if b["batch"] == int(batch))
    return {"x": lambda: b[plan]["measured"], "flop": lambda: b[plan]["flop_limit"],
            "orig": lambda: b["examples_per_s"]["original"], "pruned": lambda: b["examples_per_s"][plan],
            "eff": lambda: 100 * b[plan]["efficiency"]}[stat]()


def _train(model: str, field: str) -> float:
    m = bench("train_models")["models"][model]
    if field in ("n_train", "n_eval"):
        return m[field]
    value = m["epochs"][-1][field]
    return 100 * value if field == "eval_accuracy" else value


def _mc(file: str, method: str, fraction: str) -> float:
    d = bench(file)
    row = next(r for r in d["summary"] if r["method"] == method and abs(r["fraction"] - float(fraction)) < 1e-9)
    return scaled(d["metric"], row["score"])


def _json(file: str, path: str) -> float | str:
    value = bench(file)
    for key in path.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def _sig(run: str, field: str) -> float | str:
    value = study(run)["signature"]
    for key in field.split("."):  # e.g. settings.n_resamples
        value = value[key]
    return value


def _demo(path: str) -> float | str:
    return _json("demo", path)


def _fam(verdict: str) -> int:
    """How many model types benchmarks/results/families.json gives this verdict (``exact``, ``refused``, ...)."""
    return sum(f["verdict"] == verdict.replace("_", " ") for f in bench("families")["families"])


def _mcmin(file: str, method: str) -> float:
    tests = [t for t in bench(file)["paired_tests"] if t["method"] == method and t["against"] == "ih"
             and t["test"] is not None]
    adjusted(tests, f"benchmarks/results/{file}.json")  # written by today's code: each test has its adjusted p
    return min(t["p_value"] for t in tests if t["diff"] < 0)


KINDS: dict[str, tuple[Callable, str]] = {  # kind -> (function of the args, default format)
    "base": (_base, ".2f"), "score": (_score, ".2f"), "rel": (_rel, ".0f"), "abl": (_abl, ".2f"),
    "abo": (_abo, ".2f"), "cd": (_cd, ".2f"), "dyn": (_dyn, ".0f"), "speed": (_speed, ".3f"),
    "train": (_train, ".2f"), "mc": (_mc, ".2f"), "demo": (_demo, ".2f"), "json": (_json, ".2f"),
    "mcmin": (_mcmin, ".2f"), "sig": (_sig, "d"), "nsl": (_nsl, ".0f"), "fam": (_fam, "d"), "relci": (_relci, ".0f"),
}
UNITS = {"MB": (1e6, 0, "MB"), "GB": (1e9, 1, "GB"), "min": (60, 1, "min")}  # ~FORMAT -> (divisor, digits, unit)
INTEGER_STATS = ("n", "sig", "better", "n_train", "n_eval")


def quote(name: str) -> str:
    """The text a ``<!--q:NAME-->`` marker must hold."""
    spec, _, fmt = name.partition("~")
    kind, *args = spec.split(":")
    if kind not in KINDS:
        raise KeyError(f"unknown quote kind {kind!r} in {name!r}; allowed: {', '.join(KINDS)}")
    fn, default = KINDS[kind]
    value = fn(*args)
    if isinstance(value, str):
        return value
    if not fmt:
        fmt = "d" if args and args[-1] in INTEGER_STATS else default
    if fmt == "d":
        return f"{int(value):,}"
    if fmt == "p":  # a p-value: "< 0.001" below what 1000 resamples resolve
        return _p(value)
    if fmt in UNITS:  # bytes or seconds in the unit a reader wants: 541615042 -> "542 MB"
        div, digits, unit = UNITS[fmt]
        return f"{value / div:.{digits}f} {unit}"
    if fmt.endswith("e"):  # 4e-05 -> 4e-5
        mantissa, exp = f"{value:{fmt}}".split("e")
        return f"{mantissa}e{int(exp)}"
    return f"{value:{fmt}}"


# ---------------------------------------------------------------- generated tables


def _p(x: float) -> str:
    """A p-value as printed: 3 decimals; below 0.001 as '< 0.001' (every resampling p has the +1 floor)."""
    return "< 0.001" if x < 0.001 else f"{x:.3f}"


def block_all_but_one(run: str) -> str:
    """Per site of an all-but-one run, as the run wrote it: kept head, delta, the 95% interval and the
    two-sided p of the reported test, the adjusted p and the run's own verdict."""
    res = tested(run)
    metric, rows = res["metric"], res["rows"]
    correction = {"holm": "Holm", "bh": "BH"}[res["signature"]["settings"].get("correction", "holm")]
    test = rows[0].get("test", "test") if rows else "test"
    head = f"| site | kept head | delta | 95% interval | p (two-sided, {test}) | {correction}-adjusted p | significant |"
    out = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        out.append(f"| {r['site']} | {r['kept_head']} | {scaled(metric, r['delta']):+.2f} | "
                   f"[{scaled(metric, r['ci_low']):+.2f}, {scaled(metric, r['ci_high']):+.2f}] | {_p(r['p_value'])} | "
                   f"{_p(r['p_adjusted'])} | {'**yes**' if r['significant'] else 'no'} |")
    return "\n".join(out)


def block_method_comparison(alpha: float = 0.05) -> str:
    """README's method table: I_h, Fisher, Fisher+rearrange+tune per step, from the two benchmark files;
    bold = above I_h with Holm-adjusted (over the table's steps of that method) two-sided p < alpha."""
    files = ("method_comparison", "method_comparison_enfr")
    methods = ("ih", "fisher", "fisher+tune")
    bold: dict[tuple[str, str, float], bool] = {}
    for file in files:
        for method in methods[1:]:
            tests = [t for t in bench(file)["paired_tests"] if t["method"] == method and t["against"] == "ih"
                     and t["test"] is not None]
            for t, q in zip(tests, adjusted(tests, f"benchmarks/results/{file}.json"), strict=True):
                bold[(file, method, round(t["fraction"], 6))] = q < alpha and t["diff"] > 0
    fractions = sorted({round(r["fraction"], 6) for r in bench(files[0])["summary"] if r["fraction"] < 1})
    out = ["| pruned | SST-2 MiniLM, accuracy: I_h | Fisher | Fisher+rearrange+tune | en->fr Marian, BLEU: I_h | "
           "Fisher | Fisher+rearrange+tune |", "|---|---|---|---|---|---|---|"]
    for f in fractions:
        cells = []
        for file in files:
            for method in methods:
                text = f"{_mc(file, method, str(f)):.2f}"
                cells.append(f"**{text}**" if bold.get((file, method, f)) else text)
        out.append(f"| {f:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def block_llm_peers(protocol: str = "block256") -> str:
    """README's peer table: per budget, the headprune configuration the comparison selects (on held-out calibration
    blocks) against the best peer, perplexity ratio to the unpruned model with its 95% interval
    (benchmarks/results/llm_peers.json ``verdicts``)."""
    d = bench("llm_peers")
    out = ["| non-embedding params removed | headprune (selected) | perplexity ratio [95% CI] | best peer | its ratio | "
           "headprune / best peer [95% CI] |", "|---|---|---|---|---|---|"]
    for budget, per in sorted(d["verdicts"].items(), key=lambda kv: float(kv[0])):
        v = per[protocol]
        lo, hi = v["ratio_ci95"]
        a, b = v["ratio_to_best_peer_ci95"]
        out.append(f"| {float(budget):.0%} | {v['headprune']} | {v['ratio']:.3f} [{lo:.3f}, {hi:.3f}] | "
                   f"{v['best_peer']} | {v['best_peer_ratio']:.3f} | {v['ratio_to_best_peer']:.3f} [{a:.3f}, {b:.3f}] |")
    return "\n".join(out)


# the peer harness's per-model files with every window starting with the model's prefix token (issue #47)
LLM_MODELS = (("SmolLM2-135M", "llm_peers_smollm2"), ("Gemma-3-270M", "llm_peers_gemma3-270m"))


def block_llm_models() -> str:
    """The peer table on every model of :data:`LLM_MODELS` (windows with the prefix token): per model and budget, the
    unpruned perplexity, every method's ratio pruned / unpruned (window 128), and headprune's selected configuration
    against the best peer in windows of 128 and 2048 tokens with the paired 95% interval; "not run" where the file
    or the budget is missing."""
    out = ["| model | removed | evaluation tokens | unpruned (w128) | ratio pruned / unpruned, w128 | headprune / best "
           "peer, w128 [95% CI] | w2048 [95% CI] | lower than every peer |", "|---|---|---|---|---|---|---|---|"]
    for label, name in LLM_MODELS:
        d = _optional(name)
        if d is None or not d.get("verdicts"):
            out.append(f"| {label} | | | | not run | | | |")
            continue
        ok = [r for r in d["rows"] if r.get("status") == "ok"]
        tokens = d["settings"].get("eval_tokens") or "whole text"
        base = d["unpruned"]["perplexity"]["window128"]
        for budget, per in sorted(d["verdicts"].items(), key=lambda kv: float(kv[0])):
            rows = sorted((r for r in ok if r["budget"] == float(budget)), key=lambda r: r["ratio"]["window128"])
            ratios = ", ".join(f"{r['method']} {r['ratio']['window128']:.2f}" for r in rows)
            cells = [_versus_best(per[w]) if w in per else "not run" for w in ("window128", "window2048")]
            lower = all(per[w]["lower_than_every_peer"] for w in ("window128", "window2048") if w in per)
            out.append(f"| {label} | {float(budget):.0%} | {tokens} | {base:.2f} | {ratios} | {cells[0]} | {cells[1]} | "
                       f"{'yes' if lower else '**no**'} |")
    return "\n".join(out)


def block_apply_replay() -> str:
    """``headprune apply`` on a real model (``apply_replay.json``): per budget, the configuration, the tensors compared
    and whether every one is equal, and what the plan did on the same model with one weight moved by one ulp."""
    d = _optional("apply_replay")
    if d is None:
        return "`headprune apply` on a real model: not run yet (`benchmarks/apply_replay.py`)."
    out = [f"`python benchmarks/apply_replay.py` on {d['model']['model']}: `headprune compress` then `headprune apply` "
           "in new processes, every saved tensor compared with `torch.equal`:", "",
           "| removed | configuration (the peer table's) | tensors | bit for bit | `apply` on the model re-saved as a "
           "folder | one weight moved by one ulp |", "|---|---|---|---|---|---|"]
    for r in d["rows"]:
        other, ulp = r["other_model"], r.get("one_ulp", {})
        refused = (f"refused, exit {other['exit_code']}, nothing written" if other["exit_code"] and
                   not other["output_written"] else f"**exit {other['exit_code']}**")
        moved = "refused, naming that weight" if ulp.get("names_only_that_weight") else "**not refused by its weight**"
        out.append(f"| {r['budget']:.0%} | `{r['configuration']}` | {r['compared']['tensors']} | "
                   f"{'yes' if r['compared']['bit_for_bit'] else '**no**'} | {refused} | {moved} |")
    return "\n".join(out)


MEMORY_GOAL = 2.0  # issue #47 item 4: compress's peak within twice the model's float32 weights


def block_compress_memory() -> str:
    """``compress_memory.json``: per model and mode, the peak memory against the float32 weights, whether it is
    within :data:`MEMORY_GOAL` times them, and (``--cli``) the progress lines ``headprune compress ... 2>log`` left
    in its log."""
    d = _optional("compress_memory")
    if d is None or not d.get("rows"):
        return "Peak memory of `compress` on a real model: not measured yet (`benchmarks/compress_memory.py`)."
    out = [f"| model | how | float32 weights | peak | peak / weights | within {MEMORY_GOAL:g}x | progress lines in the log |",
           "|---|---|---|---|---|---|---|"]
    for r in sorted(d["rows"], key=lambda r: (r["model"], r.get("mode") != "cli")):
        gb = r["weights_float32_bytes"] / 1e9
        if r.get("mode") == "cli":
            c = r["cli"]
            out.append(f"| {r['model']} | `headprune compress ... 2>log`, whole process (exit {c['exit_code']}) | "
                       f"{gb:.2f} GB | {c['peak_rss_bytes'] / 1e9:.2f} GB | {c['peak_over_weights']:.2f}x | "
                       f"{_yes(c['peak_over_weights'] <= MEMORY_GOAL)} | {c['progress_lines']} |")
        else:
            peak = r["peak_rss_delta_bytes"]
            out.append(f"| {r['model']} | `compress()` in the process, growth after loading | {gb:.2f} GB | "
                       + ("n/a | n/a | n/a" if peak is None else f"{peak / 1e9:.2f} GB | {r['peak_over_weights']:.2f}x"
                                                                f" | {_yes(r['peak_over_weights'] <= MEMORY_GOAL)}")
                       + " | |")
    return "\n".join(out)


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def _optional(name: str) -> dict | None:
    """benchmarks/results/NAME.json, or None where that benchmark has not been run."""
    return bench(name) if (BENCH / f"{name}.json").is_file() else None


def _versus_best(v: dict) -> str:
    a, b = v["ratio_to_best_peer_ci95"]
    return f"{v['ratio_to_best_peer']:.3f} [{a:.3f}, {b:.3f}] vs {v['best_peer']}"


def _headline_quality(peers: dict, texts: dict | None) -> list[str]:
    """Per budget and text: headprune / best peer at windows 128 and 2048 (llm_peers verdicts, and the extra texts'
    verdicts where run)."""
    sets = {"news (WMT21)": peers["verdicts"]}
    for name, per in ((texts or {}).get("verdicts") or {}).items():
        sets[name] = per
    out = ["| removed | text | peers compared | headprune / best peer, window 128 [95% CI] | window 2048 [95% CI] | "
           "lower than every peer |", "|---|---|---|---|---|---|"]
    for budget in sorted(peers["verdicts"], key=float):
        for text, verdicts in sets.items():
            v = verdicts.get(budget)
            if not v or "window128" not in v or "window2048" not in v:
                out.append(f"| {float(budget):.0%} | {text} | - | not run | not run | - |")
                continue
            lower = all(v[w]["lower_than_every_peer"] for w in ("window128", "window2048"))
            out.append(f"| {float(budget):.0%} | {text} | {len(v['window128']['peers_compared'])} | "
                       f"{_versus_best(v['window128'])} | {_versus_best(v['window2048'])} | "
                       f"{'yes' if lower else '**no**'} |")
    return out


def _headline_time(times: dict | None, selected: dict) -> list[str]:
    """The side-by-side pruning time of ``prune_time.json``'s configuration, and the budgets whose selected
    configuration (``selected``: budget -> configuration) is another one, whose time was not measured so."""
    if times is None:
        return ["Pruning time against FLAP: not measured yet (`benchmarks/prune_time.py`)."]
    timed = {b: row.get("config", times["settings"]["config"]) for b, row in times["budgets"].items()}
    cells = []
    for budget, b in sorted(times["budgets"].items(), key=lambda kv: float(kv[0])):
        r = b["headprune_over_flap"]
        cells.append(f"{float(budget):.0%} {timed[budget]} x{r['median']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"
                     + ("" if b["reliable"] else " (not reliable: load)"))
    other = [f"{float(b):.0%} ({m})" for b, m in sorted(selected.items(), key=lambda kv: float(kv[0]))
             if m != timed.get(b)]
    return ["Pruning time / FLAP, alternating rounds of one invocation (`prune_time.json`): "
            f"{'; '.join(cells)}." + (f" Selected at {', '.join(other)} instead: not timed side by side with FLAP "
                                      "(its row's pruning seconds are in the results table)." if other else "")]


def _headline_curve(rec: dict | None) -> list[str]:
    """The recovery curve (``recovery.json``): per model and budget, each method at the most tokens both reached."""
    if rec is None or not rec.get("rows"):
        return ["Recovery curve: not measured yet (`benchmarks/recovery.py`)."]
    cells = []
    for (model, budget) in sorted({(r["model"], r["budget"]) for r in rec["rows"]}):
        rows = [r for r in rec["rows"] if r["model"] == model and r["budget"] == budget and r["start_tokens"] == 0]
        at = [{p["tokens"]: p for p in r["points"]} for r in rows]
        common = set.intersection(*(set(a) for a in at)) if at else set()
        if not common:
            continue
        t = max(common)
        window = next(iter(at[0][t]["perplexity"]))
        cells.append(f"{rec['models'][model]['settings']['model']} at {budget:.0%}, after {t:,} tokens: " + ", ".join(
            f"{r['pruner']} + {r['recovery']} {a[t]['perplexity'][window]:.2f} (x{a[t]['ratio'][window]:.3f} the "
            f"unpruned{'' if r['done'] else ', run unfinished'})" for r, a in zip(rows, at, strict=True)))
    return ["Recovery curve (`recovery.json`, window 128, the news text's first tokens): " + "; ".join(cells) + "."]


def _headline_recovery(rec: dict | None) -> list[str]:
    if rec is None:
        return ["Recovery: not measured yet (`benchmarks/recovery_swaps.py`)."]
    out = ["| pruner + recovery | removed | training tokens | minutes | window 128 before -> after | "
           "window 2048 before -> after | lost perplexity back per 1k tokens (w128) |",
           "|---|---|---|---|---|---|---|"]
    for r in sorted(rec["rows"], key=lambda r: (r["budget"], r["pruner"], r["recovery"])):
        b, a = r["perplexity_before"], r["perplexity_after"]
        minutes = f"{r['train_minutes']:.1f}" + ("" if r["load"]["reliable"] else " (under load)")
        out.append(f"| {r['pruner']} + {r['recovery']} | {r['budget']:.0%} | {r['tokens']:,} | {minutes} | "
                   f"{b['window128']:.2f} -> {a['window128']:.2f} | {b['window2048']:.2f} -> {a['window2048']:.2f} | "
                   f"{r['recovered_share_per_1k_tokens']['window128']:.1%} |")
    return out


def _headline_scale(scale: dict | None) -> list[str]:
    if scale is None:
        return ["Scale: not measured yet (`benchmarks/billion_envelope.py --growth`)."]
    c = scale["config"]
    rows = []
    for name, r in scale["shapes"].items():
        rows.append(f"{name} ({r['params'] / 1e9:.2f}B): peak {r['peak_rss_bytes'] / 2**30:.2f} GiB = "
                    f"{r['peak_over_weights']:.2f}x the float32 weights, {r['seconds']:.0f} s (other processes "
                    f"{r['load']['other_cpu']:.2f} of {r['load']['cores']} cores)")
    return [f"Scale, the selected configuration with `low_memory=True` at {c['budget_removed']:.0%}, random weights, "
            f"{c['calib_blocks']} x {c['calib_length']} calibration tokens, {c['omp_threads']} thread "
            f"(`compress_scale.json`; goal: peak <= {scale['goal_peak_over_weights']}x the weights): "
            + "; ".join(rows) + f". Time grows as parameters^{scale['alpha']:.2f}."]


def block_llm_headline() -> str:
    """docs/peers.md's headline: headprune against the best peer per budget and text, the pruning time against
    FLAP, recovery after pruning, and the run at a 1B shape (each from its committed JSON; "not run" where absent)."""
    peers = bench("llm_peers")
    out = _headline_quality(peers, _optional("llm_peers_texts"))
    out += [""] + _headline_time(_optional("prune_time"), peers["selected"])
    out += [""] + _headline_curve(_optional("recovery"))
    out += [""] + _headline_recovery(_optional("recovery_swaps"))
    out += [""] + _headline_scale(_optional("compress_scale"))
    out += [""] + _headline_gpu(_optional("gpu_bench"))
    return "\n".join(out)


def _headline_gpu(g: dict | None) -> list[str]:
    """The selected configuration's pruning on a GPU (``gpu_bench.json``'s compress rows), and what did not run."""
    if g is None or not g.get("compress"):
        return ["On a GPU: not measured yet (`make gpu-bench`)."]
    rows = [f"{r['shape']} {r['budget']:.0%} {r['configuration']}: {_compress_cells(r)}" for r in g["compress"]]
    rows += [f"{s['shape']} {s['budget']:.0%} {s['configuration']}: not run ({s['reason']})"
             for s in g["skipped"] if "budget" in s]
    growth = "; ".join(f"{n}: parameters^{v['alpha']:.2f}" for n, v in g["compress_growth"].items())
    return [f"On a GPU ({g['device']}, {g['dtype']}, `low_memory=True`, `gpu_bench.json`): " + "; ".join(rows)
            + (f". Time grows as {growth}." if growth else ". No growth law on the GPU: one shape ran.")]


def _compress_cells(r: dict) -> str:
    """One ``gpu_bench.json`` compress row: seconds, the stages, the CUDA peak against the weights."""
    if not r["ok"]:
        return f"failed: {r['error']}"
    st = r["stage_seconds"]
    return (f"{r['seconds']:.1f} s (scores {st['score']:.1f} s, select + stand-ins + cut {st['select+remove']:.1f} s); "
            f"peak {r['peak_bytes'] / 2**30:.2f} GiB = {r['peak_over_weights']:.2f}x the bf16 weights; "
            f"{r['share_removed']:.1%} removed")


def block_gpu_bench() -> str:
    """docs/gpus.md's GPU figures from ``gpu_bench.json``: the selected configuration's pruning (time, CUDA peak),
    and prefill/decode tokens/s of pruned against unpruned, each with its interval and limit; rows not run, why."""
    g = _optional("gpu_bench")
    if g is None:
        return "Not measured: no GPU has been lent since `make gpu-bench` was written."
    out = [f"Device: {g['device']}, {g['dtype']}, torch {g['versions']['torch']}, transformers "
           f"{g['versions']['transformers']}; runs: " + "; ".join(f"{r['run']}: `{r['command']}`" for r in g["runs"]),
           "", "| shape | removed | configuration | pruning on the GPU |", "|---|---|---|---|"]
    for r in g["compress"]:
        out.append(f"| {r['shape']} | {r['budget']:.0%} | {r['configuration']} | {_compress_cells(r)} |")
    for s in g["skipped"]:
        if "budget" in s:
            out.append(f"| {s['shape']} | {s['budget']:.0%} | {s['configuration']} | not run: {s['reason']} |")
    out += ["", "| shape | removed | workload | batch x tokens | unpruned -> pruned tokens/s | pruned/unpruned "
            "[95% interval] | limit | run |", "|---|---|---|---|---|---|---|---|"]
    for r in g["rows"]:
        t = r["throughput"]
        ratio = f"x{r['ratio']:.3f} [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]"
        out.append(f"| {r['shape']} | {r['fraction']:.0%} | {r['workload']} | {r['batch']} x {r['seq_len']} | "
                   f"{t['unpruned']:,.0f} -> {t['pruned']:,.0f} | "
                   f"{ratio if r['reliable'] else 'not quoted (load): ' + r['reason']} | x{r['limit']:.3f} | {r['run']} |")
    gone = sorted({(s["shape"], s.get("fraction")) for s in g["skipped"] if "budget" not in s}, key=str)
    if gone:
        out += ["", "Not run (time limit reached before them): "
                + ", ".join(f"{shape}" + (f" {f:.0%}" if f is not None else "") for shape, f in gone) + "."]
    return "\n".join(out)


def block_llamacpp_budgets() -> str:
    """README's llama.cpp table, rendered by benchmarks/llamacpp_budgets.py's ``readme_markdown`` from its JSON."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("llamacpp_budgets", ROOT / "benchmarks" / "llamacpp_budgets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.readme_markdown(bench("llamacpp_budgets"))


def block(name: str) -> str:
    """The text a ``<!--block:NAME-->`` marker must hold (``abo:RUN``, ``method_comparison``, ``llm_peers``,
    ``llamacpp_budgets``)."""
    kind, *args = name.split(":")
    if kind == "abo":
        return block_all_but_one(*args)
    if kind == "method_comparison":
        return block_method_comparison()
    if kind == "llm_peers":
        return block_llm_peers(*args)
    if kind == "llamacpp_budgets":
        return block_llamacpp_budgets()
    if kind == "llm_headline":
        return block_llm_headline()
    if kind == "gpu_bench":
        return block_gpu_bench()
    if kind == "llm_models":
        return block_llm_models()
    if kind == "apply_replay":
        return block_apply_replay()
    if kind == "compress_memory":
        return block_compress_memory()
    raise KeyError(f"unknown block {name!r}; allowed: abo:RUN, method_comparison, llm_peers, llamacpp_budgets, "
                   "llm_headline, gpu_bench, llm_models, apply_replay, compress_memory")
