"""Figures a person can read at a glance: titles, units on axes, the baseline marked, legends.

A figure drawn from a table of a run directory records where it came from: :func:`record` notes in
``figures.json`` beside it the table's name and sha256 and what the figure shows (e.g. which heads it
starred), so a check (``studies/summarize.py --check``) can hold figure and table to one computation.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from ..safefiles import read_bytes, write_atomic
from .plotting import pyplot

plt = pyplot()

KIND_TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "encoder-decoder (cross) attention"}
ORDER_STYLE = {
    "importance": ("#1f77b4", "I_h (importance, computed once)"),
    "importance-iterative": ("#17becf", "I_h, recomputed each step"),
    "oracle": ("#d62728", "oracle (one-head ablation)"),
    "random": ("#7f7f7f", "random"),
    "fisher": ("#ff7f0e", "Fisher (Kwon et al. 2022)"),
    "fisher+rearrange": ("#2ca02c", "Fisher + rearrangement"),
    "fisher+tune": ("#9467bd", "Fisher + rearrangement + tuned scales (guarded)"),
}


def _metric_label(metric: str) -> str:
    return {"accuracy": "accuracy (%)", "bleu": "BLEU", "perplexity": "perplexity (lower is better)",
            "f1": "F1 (%)", "matthews": "Matthews corr. (×100)"}.get(metric, metric)


def _scale(metric: str) -> float:
    return 100.0 if metric in ("accuracy", "f1", "matthews") else 1.0


FIGURES_FILE = "figures.json"


def sha256_of(path: Path) -> str:
    return hashlib.sha256(read_bytes(path)).hexdigest()


def record(path: Path, source: Path, **shows) -> None:
    """Note in ``figures.json`` (beside ``path``) that figure ``path`` was drawn from ``source`` (a file of
    the same run directory; its name and sha256) and what it shows (``shows``: JSON values)."""
    index = Path(path).parent / FIGURES_FILE
    known = json.loads(read_bytes(index)) if index.is_file() else {}
    known[Path(path).name] = {"source": Path(source).name, "sha256": sha256_of(Path(source)), **shows}
    write_atomic(index, json.dumps(known, indent=1, sort_keys=True) + "\n")


def starred(rows: list[dict]) -> list[str]:
    """``site:head`` (or ``site``) of the rows a figure marks significant, sorted."""
    return sorted(f"{r['site']}:{r['head']}" if r.get("head") not in (None, "") else str(r["site"])
                  for r in rows if r["significant"] in (True, "True"))


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ablation_heatmap(rows: list[dict], base: float, metric: str, path: Path, alpha: float,
                     source: Path | None = None) -> Path:
    """Layer x head grid of the score change when each head alone is masked; significant cells marked.

    ``source``: the table ``rows`` were written to (recorded with the starred heads in figures.json)."""
    kinds = [k for k in ("encoder", "decoder", "cross") if any(r["kind"] == k for r in rows)]
    scale = _scale(metric)
    span = max((abs(r["delta"]) for r in rows), default=1.0) * scale or 1.0
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds) + 1.2, 3.8), squeeze=False)
    image = None
    for ax, kind in zip(axes[0], kinds, strict=True):
        sub = [r for r in rows if r["kind"] == kind]
        layers = sorted({r["layer"] for r in sub})
        heads = max(r["head"] for r in sub) + 1
        grid = np.full((len(layers), heads), np.nan)
        for r in sub:
            grid[layers.index(r["layer"]), r["head"]] = r["delta"] * scale
        image = ax.imshow(grid, cmap="RdBu_r" if metric == "perplexity" else "RdBu", vmin=-span, vmax=span,
                          aspect="auto")
        for r in sub:
            if r["significant"]:
                ax.text(r["head"], layers.index(r["layer"]), "*", ha="center", va="center", fontsize=12,
                        color="black", fontweight="bold")
        ax.set_title(KIND_TITLES[kind], fontsize=10)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(layers)), [str(x) for x in layers])
        ax.set_xticks(range(heads), [str(h) for h in range(heads)], fontsize=7)
    cbar = fig.colorbar(image, ax=axes[0].tolist(), shrink=0.9)
    cbar.set_label(f"Δ {_metric_label(metric)} when masked")
    fig.suptitle(f"One head masked at a time (full model: {base * scale:.2f}); * = significant (adjusted p < {alpha})",
                 fontsize=11)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    if source is not None:
        record(path, source, starred=starred(rows), alpha=alpha)
    return path


def ablation_histogram(rows: list[dict], base: float, metric: str, path: Path) -> Path:
    scale = _scale(metric)
    scores = np.array([r["score"] for r in rows]) * scale
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.hist(scores, bins=min(30, max(5, len(scores) // 3)), color="#1f77b4", alpha=0.8, label="one head masked")
    ax.axvline(base * scale, color="#d62728", linestyle="--", linewidth=2, label=f"full model ({base * scale:.2f})")
    ax.set_xlabel(_metric_label(metric))
    ax.set_ylabel("number of heads")
    ax.set_title(f"Score with one head masked ({len(rows)} heads)")
    ax.legend()
    return _save(fig, path)


def all_but_one_bars(rows: list[dict], base: float, metric: str, path: Path, alpha: float,
                     source: Path | None = None) -> Path:
    scale = _scale(metric)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(rows) + 2), 3.8))
    deltas = [r["delta"] * scale for r in rows]
    colors = ["#d62728" if r["significant"] else "#1f77b4" for r in rows]
    errors = None
    if rows and all(r.get("ci_low") is not None for r in rows):  # 95% interval of delta (older runs: none)
        errors = np.array([[d - r["ci_low"] * scale for d, r in zip(deltas, rows, strict=True)],
                           [r["ci_high"] * scale - d for d, r in zip(deltas, rows, strict=True)]]).clip(min=0)
    ax.bar(range(len(rows)), deltas, color=colors, yerr=errors, capsize=2, ecolor="#444444")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)), [r["site"] for r in rows], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel(f"Δ {_metric_label(metric)}")
    chosen = "chosen on a held-out split" if rows and rows[0].get("chosen_on") == "held-out" else "best head"
    ax.set_title(f"Keep one head per site ({chosen}); full model {base * scale:.2f}; red: adjusted p < {alpha}; "
                 "bars: 95% CI", fontsize=10)
    _save(fig, path)
    if source is not None:
        record(path, source, starred=starred(rows), alpha=alpha)
    return path


def cross_domain_scatter(a: list[dict], b: list[dict], r: float, p: float, names: tuple[str, str], metric: str,
                         path: Path, source: Path | None = None) -> Path:
    scale = _scale(metric)
    x = np.array([row["delta"] for row in a]) * scale
    y = np.array([row["delta"] for row in b]) * scale
    fig, ax = plt.subplots(figsize=(5.0, 4.6))
    ax.scatter(x, y, s=18, alpha=0.7, color="#1f77b4")
    lim = [min(x.min(), y.min()), max(x.max(), y.max())]
    ax.plot(lim, lim, color="#7f7f7f", linestyle=":", linewidth=1, label="y = x")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.axvline(0, color="black", linewidth=0.5)
    ax.set_xlabel(f"Δ {_metric_label(metric)} on {names[0]}")
    ax.set_ylabel(f"Δ {_metric_label(metric)} on {names[1]}")
    ax.set_title(f"One-head ablation on two datasets: Pearson r = {r:.2f} (p = {p:.1e})")
    ax.legend(loc="lower right")
    _save(fig, path)
    if source is not None:
        record(path, source, points=len(a), pearson_r=r)
    return path


def curve_labels(summary: list[dict]) -> dict[str, str]:
    """Legend label of each order as the figure draws it (a band is named only where one is drawn)."""
    labels = {}
    for order in dict.fromkeys(r["order"] for r in summary):
        rows = [r for r in summary if r["order"] == order]
        label = ORDER_STYLE.get(order, ("black", order))[1]
        seeds = max(r.get("seeds", 1) for r in rows)
        if seeds > 1:
            label += f" (mean ± std over {seeds} seeds)"
        elif any(r.get("ci_low") is not None for r in rows):
            label += " (band: 95% interval vs unpruned)"
        elif order == "random":
            label += " (one seed)"
        labels[order] = label
    return labels


def pruning_curves(summary: list[dict], metric: str, path: Path, title: str = "", source: Path | None = None,
                   unpruned_label: str = "unpruned") -> Path:
    """Score per pruned share, per order. Band: mean ± std over seeds where several were run, else the
    95% interval of the paired test against the unpruned model where the rows carry one.

    ``unpruned_label``: what the dashed line is (name the data the curve was scored on)."""
    scale = _scale(metric)
    fig, ax = plt.subplots(figsize=(6.6, 4.2))
    base = None
    labels = curve_labels(summary)
    bands = {}
    for order in labels:
        rows = [r for r in summary if r["order"] == order]
        x = np.array([100 * r["pruned"] / r["of"] for r in rows])
        y = np.array([r["score"] for r in rows]) * scale
        color = ORDER_STYLE.get(order, ("black", order))[0]
        ax.plot(x, y, marker="o", markersize=3, color=color, label=labels[order])
        base = next((r["score"] for r in rows if r["pruned"] == 0), base)
        if max(r.get("seeds", 1) for r in rows) > 1:
            std = np.array([r["std"] for r in rows]) * scale
            ax.fill_between(x, y - std, y + std, color=color, alpha=0.2)
            bands[order] = "std over seeds"
        elif base is not None and any(r.get("ci_low") is not None for r in rows):
            low = np.array([np.nan if r.get("ci_low") is None else base + r["ci_low"] for r in rows]) * scale
            high = np.array([np.nan if r.get("ci_high") is None else base + r["ci_high"] for r in rows]) * scale
            ax.fill_between(x, low, high, color=color, alpha=0.2)
            bands[order] = "95% interval of the paired test vs unpruned"
    if base is not None:
        ax.axhline(base * scale, color="black", linestyle="--", linewidth=1, label=f"{unpruned_label} ({base * scale:.2f})")
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel(_metric_label(metric))
    if metric == "perplexity":  # it explodes by orders of magnitude as heads go: a log axis keeps the start readable
        ax.set_yscale("log")
    ax.set_xlim(0, 100)
    ax.set_title(title or "Pruning curve")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, path)
    if source is not None:
        record(path, source, labels=labels, bands=bands, unpruned=None if base is None else base,
               unpruned_label=unpruned_label)
    return path


def dynamics(rows: list[dict], metric: str, path: Path, source: Path | None = None) -> Path:
    """Left: relative score per pruning level across epochs. Right: early vs late curves."""
    epochs = sorted({r["epoch"] for r in rows})
    levels = sorted({r["fraction"] for r in rows if r["fraction"] > 0})
    if len(levels) > 5:  # a readable number of lines: every other level, the paper's 10%..90% grid thinned
        levels = levels[1::2]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    cmap = plt.get_cmap("viridis")
    for i, f in enumerate(levels):
        ys = [next((r["relative"] for r in rows if r["epoch"] == e and r["fraction"] == f), np.nan) for e in epochs]
        left.plot(epochs, np.array(ys) * 100, marker="o", markersize=3, color=cmap(i / max(1, len(levels) - 1)),
                  label=f"{f:.0%} pruned")
    left.axhline(100, color="black", linestyle="--", linewidth=1, label="unpruned model of that epoch")
    left.set_xlabel("epoch")
    left.set_xticks(epochs)
    left.set_ylabel(f"{metric} quality relative to unpruned (%)")
    left.set_title("Pruning during training (I_h order; 100% = that epoch's unpruned model)", fontsize=10)
    left.legend(fontsize=7, ncol=2)
    left.grid(alpha=0.3)
    chosen = [epochs[0], epochs[len(epochs) // 2], epochs[-1]] if len(epochs) > 2 else epochs
    for e, style in zip(dict.fromkeys(chosen), ("-", "--", ":"), strict=False):
        sub = sorted((r for r in rows if r["epoch"] == e), key=lambda r: r["fraction"])
        right.plot([100 * r["fraction"] for r in sub], [100 * r["relative"] for r in sub], linestyle=style, marker="o",
                   markersize=3, label=f"epoch {e}")
    right.set_xlabel("heads pruned (%)")
    right.set_ylabel(f"{metric} quality relative to unpruned (%)")
    if max(r["relative"] for r in rows) > 1.5:  # a nearly untrained epoch (score ~ 0) makes ratios explode
        for ax in (left, right):
            ax.set_ylim(0, 150)
        left.text(0.02, 0.02, "values above 150% clipped (an epoch whose unpruned score is near 0)",
                  transform=left.transAxes, fontsize=7, color="#555")
    right.set_title("Early vs late epochs")
    right.legend()
    right.grid(alpha=0.3)
    _save(fig, path)
    if source is not None:
        record(path, source, epochs=epochs)
    return path


def importance_heatmap(scores: dict, path: Path, title: str = "Head importance I_h (l2-normalised per layer)") -> Path:
    """Layer x head grid of I_h per attention kind (darker = more important)."""
    kinds = [k for k in ("encoder", "decoder", "cross") if any(_kind_of(n) == k for n in scores)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.4 * len(kinds) + 1.2, 0.16 * max(len(scores), 12) + 1.6),
                             squeeze=False)
    image = None
    for ax, kind in zip(axes[0], kinds, strict=True):
        names = [n for n in scores if _kind_of(n) == kind]
        width = max(len(scores[n]) for n in names)
        grid = np.full((len(names), width), np.nan)
        for i, n in enumerate(names):
            grid[i, : len(scores[n])] = np.asarray(scores[n], dtype=float)
        image = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_title(KIND_TITLES[kind], fontsize=10)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        step = max(1, len(names) // 15)
        ax.set_yticks(range(0, len(names), step), [n.split(".")[1] for n in names][::step])
    cbar = fig.colorbar(image, ax=axes[0].tolist(), shrink=0.9)
    cbar.set_label("I_h")
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _kind_of(site: str) -> str:
    return "cross" if site.endswith(".cross") else site.split(".")[0]


def kept_heads_grid(sites: dict, dropped: dict, scales: dict | None, path: Path) -> Path:
    """Kept and removed heads per site and kind. Untuned: two colours and a kept/removed legend; with tuned
    scales: the kept heads coloured by the scale folded into the output projection (colour bar), removed grey."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    kinds = [k for k in ("encoder", "decoder", "cross") if any(s.kind == k for s in sites.values())]
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds) + 1.2, 3.6), squeeze=False)
    tuned = bool(scales)
    image = None
    for ax, kind in zip(axes[0], kinds, strict=True):
        sub = [s for s in sites.values() if s.kind == kind]
        grid = np.full((len(sub), max(s.num_heads for s in sub)), np.nan)  # nan: no such head in this site
        for i, s in enumerate(sub):
            off = set(dropped.get(s.name, []))
            kept_scales = iter((scales or {}).get(s.name, [1.0] * (s.num_heads - len(off))))
            for h in range(s.num_heads):
                grid[i, h] = -1.0 if h in off else (next(kept_scales) if tuned else 1.0)
        removed = np.where(grid == -1.0, 1.0, np.nan)
        ax.imshow(removed, cmap=ListedColormap(["#d9d9d9"]), aspect="auto", vmin=0, vmax=1)
        kept = np.where(grid == -1.0, np.nan, grid)
        if tuned:
            image = ax.imshow(kept, cmap="viridis", aspect="auto")
        else:
            ax.imshow(kept, cmap=ListedColormap(["#1f77b4"]), aspect="auto", vmin=0, vmax=2)
        ax.set(title=f"{kind} attention", xlabel="head", ylabel="layer")
        ax.set_xticks(range(grid.shape[1]))
        ax.set_yticks(range(len(sub)), [str(s.layer) for s in sub])
    handles = [Patch(color="#d9d9d9", label="removed")]
    if tuned and image is not None:
        fig.colorbar(image, ax=axes[0].tolist(), label="scale of a kept head (1 = untuned)")
    else:
        handles.insert(0, Patch(color="#1f77b4", label="kept"))
    fig.legend(handles=handles, loc="upper right", fontsize=8)
    fig.savefig(path, dpi=110)  # no tight_layout: the colorbar spans the axes
    plt.close(fig)
    return path


def kept_units_per_layer(rows: list[dict], path: Path) -> Path:
    """Heads and FFN neurons kept (and removed) per layer, side by side: the figure of a heads + neurons run.

    ``rows``: {"unit": site or '<layer>.ffn' name, "kind": 'heads' | 'neurons', "kept", "dropped"}."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, kind, color in zip(axes, ("heads", "neurons"), ("#1f77b4", "#2ca02c"), strict=True):
        sub = [r for r in rows if r["kind"] == kind]
        names = [str(r["unit"]) for r in sub]
        kept = np.array([r["kept"] for r in sub], dtype=float)
        gone = np.array([r["dropped"] for r in sub], dtype=float)
        ax.bar(range(len(sub)), kept, color=color, label="kept")
        ax.bar(range(len(sub)), gone, bottom=kept, color="#d9d9d9", label="removed")
        ax.set_xticks(range(len(sub)), names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(f"{kind} per layer")
        total = kept.sum() + gone.sum()
        ax.set_title(f"{kind}: {int(kept.sum())} of {int(total)} kept" if total else f"{kind}: none in this run",
                     fontsize=10)
        ax.legend(fontsize=8)
    return _save(fig, path)


def perplexity_vs_removed(curves: dict[str, list[tuple[float, float]]], path: Path,
                          extra: dict[str, tuple[float, float]] | None = None) -> Path:
    """Held-out perplexity against the share of non-embedding parameters removed, one line per method.

    ``curves``: {method: [(share removed, perplexity), ...]} (the unpruned model at 0 in each); ``extra``:
    {label: (share removed, perplexity)} single points (e.g. a model after recovery)."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for (name, points), marker in zip(curves.items(), "os^vD", strict=False):
        xs, ys = zip(*sorted(points), strict=True)
        ax.plot([100 * x for x in xs], ys, marker=marker, label=name)
    for name, (x, y) in (extra or {}).items():
        ax.plot([100 * x], [y], marker="*", markersize=12, linestyle="none", label=name)
    ax.set_xlabel("non-embedding parameters removed (%)")
    ax.set_ylabel("held-out perplexity")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
