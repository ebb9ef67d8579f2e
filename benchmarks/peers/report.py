"""The manual's table and figure for ``docs/peers.md``, generated from a results JSON of
``benchmarks/llm_peers.py`` and nothing else (every number on the page is read from it)."""

from __future__ import annotations

from pathlib import Path

from doc_tables import markdown_table

from . import results_io

MARK = ("<!-- llm_peers:begin -->", "<!-- llm_peers:end -->")
FIGURE = "peers.png"


def row_line(row: dict) -> str:
    """One console line per finished row."""
    if row.get("status") != "ok":
        return f"{row['method']}: {row.get('status')} -- {row.get('error') or row.get('torch_pruning', {}).get('error')}"
    ratios = ", ".join(f"{k} x{v:.3f}" for k, v in row["ratio"].items())
    speed = f", decode x{row['decode']['speedup']:.2f}" if "decode" in row else ""
    return f"perplexity ratio {ratios}{speed}, pruned in {row['prune_seconds']:.1f} s"


def _removed(row: dict, base: dict) -> float:
    total = base["sizes"]["nonembedding_params"]
    return 1 - row["sizes"]["nonembedding_params"] / total


def docs_section(data: dict, figure: str = FIGURE) -> str:
    """The generated block: settings, unpruned perplexities, one table row per method and budget, the figure."""
    s, base = data["settings"], data["unpruned"]
    protocols = list(base["perplexity"])
    lines = [MARK[0], "", "!!! note \"Generated\"",
             f"    Every number below is read from `benchmarks/results/{data.get('file', 'llm_peers.json')}` "
             "by `python benchmarks/llm_peers.py --write-docs docs/peers.md`; nothing is typed by hand.", "",
             f"Model: {s['model']}. Calibration: {s['calib_blocks']} blocks of {s['calib_block']} tokens of "
             f"`{s['calib']}`. Evaluation: `{s['eval']}`. Machine: {_machine(data)}. "
             f"Last invocation: `{data['command']}` (rows resume across invocations with the same settings and "
             "each method's configuration unchanged; every row's method and budget can be run by `--methods` and "
             "`--budgets`).", "",
             "Unpruned perplexity: " + ", ".join(f"{k} {v:.2f}" for k, v in base["perplexity"].items())
             + f"; {base['sizes']['nonembedding_params']:,} non-embedding parameters, "
             f"{base['sizes']['kv_cache_bytes_per_token']:,} KV-cache bytes per token.", "",
             *markdown_table(["method", "budget", "removed", *(f"{p} ratio (95% CI)" for p in protocols),
                              "FLOPs/token", "KV B/token", "decode speed-up", "prune s"],
                             [_row_cells(row, data, protocols)
                              for row in sorted(data["rows"], key=lambda r: (r["method"], r["budget"]))])]
    lines += ["", "\"(selected)\": per budget, the headprune configuration with the lowest perplexity on the "
              f"{s.get('select_blocks', 0)} held-out calibration blocks; it is the one judged against the peers.", ""]
    lines += verdict_lines(data)
    lines += prune_time_lines(data)
    lines += text_lines(data.get("extra_texts"))
    lines += ["", f"![Perplexity ratio against the share of non-embedding parameters removed]({figure})", "", MARK[1]]
    return "\n".join(lines)


def _row_cells(row: dict, data: dict, protocols: list[str]) -> list[str]:
    """One row of the docs table: a method at a budget (a failed row: its status and error, the rest empty)."""
    if row.get("status") != "ok":
        why = row.get("error") or row.get("torch_pruning", {}).get("error", "")
        return [row["method"], f"{row['budget']:.0%}", f"{row.get('status')}: {why}", *[""] * (len(protocols) + 4)]
    cells = [f"{row['ratio'][p]:.3f} ({row['ratio_ci95'][p][0]:.3f}-{row['ratio_ci95'][p][1]:.3f})" for p in protocols]
    sz = row["sizes"]
    flops = f"{sz['flops_per_token']:.3g}" if "flops_per_token" in sz else "-"
    kv = f"{sz['kv_cache_bytes_per_token']:,}" if "kv_cache_bytes_per_token" in sz else "-"
    speed = f"{row['decode']['speedup']:.2f}" if "decode" in row else "-"
    name = row["method"] + (" (selected)" if data.get("selected", {}).get(str(row["budget"])) == row["method"] else "")
    return [name, f"{row['budget']:.0%}", f"{_removed(row, data['unpruned']):.1%}", *cells, flops, kv, speed,
            f"{row['prune_seconds']:.1f}"]


def verdict_lines(data: dict) -> list[str]:
    """One bullet per budget and protocol: the selected headprune configuration against the best peer."""
    lines = []
    for budget, per in sorted(data.get("verdicts", {}).items(), key=lambda kv: float(kv[0])):
        for p, v in per.items():
            lo, hi = v["ratio_ci95"]
            lower = "lower than every peer's" if v["lower_than_every_peer"] else "**not** lower than every peer's"
            ci = ("its interval's upper end is below" if v["interval_below_best_peer"]
                  else "its interval's upper end is **not** below")
            direct = ""
            if "ratio_to_best_peer" in v:
                a, b = v["ratio_to_best_peer_ci95"]
                direct = (f" Paired, headprune / {v['best_peer']}: x{v['ratio_to_best_peer']:.3f} [{a:.3f}, {b:.3f}]"
                          + (" (below 1)" if b < 1 else " (includes 1)" if a <= 1 else " (above 1)"))
                if "ratio_to_best_peer_ci_simultaneous" in v:
                    a, b = v["ratio_to_best_peer_ci_simultaneous"]
                    direct += (f"; simultaneous over the {v['simultaneous_over']} comparisons (Bonferroni): "
                               f"[{a:.3f}, {b:.3f}]" + (", below 1" if b < 1 else ", includes 1" if a <= 1 else
                                                        ", above 1"))
                direct += "."
            lines.append(f"- {float(budget):.0%}, {p}: {v['headprune']} x{v['ratio']:.3f} [{lo:.3f}, {hi:.3f}] "
                         f"vs the best peer {v['best_peer']} x{v['best_peer_ratio']:.3f}: perplexity {lower} "
                         f"({len(v['peers_compared'])} peers run); {ci} the best peer's point estimate.{direct}")
    return lines


def text_lines(extra: dict | None) -> list[str]:
    """The rows scored on the extra English texts (``--texts``, ``llm_peers_texts.json``): per text, what it is,
    the unpruned perplexities, one table row per method and budget, and the verdicts."""
    if not extra or not extra.get("rows"):
        return []
    lines = ["", "### The same rows on other English texts", "",
             "Rows scored with `--texts` (evaluation only; the pruned model kept when the row ran, or the method run "
             "again and accepted only when its held-out calibration perplexity equals the row's), in "
             f"`benchmarks/results/llm_peers_texts.json`. Last invocation: `{extra['command']}`."]
    for name, d in extra.get("texts", {}).items():
        rows = sorted((r for r in extra["rows"] if r["text"] == name), key=lambda r: (r["budget"], r["method"]))
        if not rows or name not in extra.get("unpruned", {}):
            continue
        base = extra["unpruned"][name]["perplexity"]
        protocols = list(base)
        lines += ["", f"**{name}**: {d['what']} (`{d['file']}`, {d['lines']:,} lines). Unpruned perplexity: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in base.items()) + ".", "",
                  *markdown_table(["method", "budget", *(f"{p} ratio (95% CI)" for p in protocols)],
                                  [[r["method"], f"{r['budget']:.0%}", *_text_cells(r, protocols)] for r in rows])]
        verdicts = extra.get("verdicts", {}).get(name)
        if verdicts:
            lines += ["", f"Verdicts on {name} (the peers scored on it only):", ""]
            lines += verdict_lines({"verdicts": verdicts})
    return lines


def _text_cells(r: dict, protocols: list[str]) -> list[str]:
    if r.get("status") != "ok":
        return [f"{r['status']}: {r['model_from']}", *[""] * (len(protocols) - 1)]
    return [f"{r['ratio'][p]:.3f} ({r['ratio_ci95'][p][0]:.3f}-{r['ratio_ci95'][p][1]:.3f})" for p in protocols]


def prune_time_lines(data: dict) -> list[str]:
    """Per budget: the selected headprune configuration's pruning time against FLAP's (the goal: at most x3)."""
    times = data.get("prune_time", {})
    if not times:
        return []
    lines = ["", "Pruning time, the selected headprune configuration against FLAP (goal: at most x3; rows of "
             "different invocations ran at different machine loads, given where recorded):", ""]
    for budget, t in sorted(times.items(), key=lambda kv: float(kv[0])):
        loads = {k: v[0] for k, v in (t.get("loadavg_before") or {}).items() if v}
        load = f" (load {loads['headprune']:.1f} / {loads['flap']:.1f})" if len(loads) == 2 else ""
        lines.append(f"- {float(budget):.0%}: {t['headprune']} {t['headprune_seconds']:.0f} s, FLAP "
                     f"{t['flap_seconds']:.0f} s: x{t['ratio_to_flap']:.2f}{load}.")
    return lines


def _machine(data: dict) -> str:
    m = data["machine"]
    load = m.get("loadavg_at_start")
    return (f"{m.get('processor')}, {m.get('cpus_usable')} CPUs usable, {m.get('torch_threads')} torch threads, "
            f"device {data['settings'].get('device', 'cpu')}" + (f", load average {load[0]:.1f} at start" if load else ""))


def plot(data: dict, path: str | Path) -> Path:
    """Perplexity ratio pruned / unpruned against the share of non-embedding parameters removed, one line per
    method, 95% intervals as error bars; one panel per protocol."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    base = data["unpruned"]
    protocols = list(base["perplexity"])
    fig, axes = plt.subplots(1, len(protocols), figsize=(4.2 * len(protocols), 3.6), squeeze=False)
    methods = sorted({r["method"] for r in data["rows"] if r.get("status") == "ok"})
    for ax, p in zip(axes[0], protocols, strict=True):
        for m in methods:
            rows = sorted((r for r in data["rows"] if r["method"] == m and r.get("status") == "ok"),
                          key=lambda r: r["budget"])
            x = [_removed(r, base) for r in rows]
            y = [r["ratio"][p] for r in rows]
            err = [[r["ratio"][p] - r["ratio_ci95"][p][0] for r in rows], [r["ratio_ci95"][p][1] - r["ratio"][p] for r in rows]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=m)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_xlim(0, max(0.55, *(_removed(r, base) + 0.05 for r in data["rows"] if r.get("status") == "ok")))
        lows = [r["ratio_ci95"][p][0] for r in data["rows"] if r.get("status") == "ok"] + [1.0]
        highs = [r["ratio_ci95"][p][1] for r in data["rows"] if r.get("status") == "ok"] + [1.0]
        if max(highs) / min(lows) > 3:  # ratios spanning many-fold: log scale, plain numbers on the ticks
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("share of non-embedding parameters removed")
        ax.set_title(p)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("perplexity ratio pruned / unpruned")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_docs(page: str | Path, data: dict | None) -> None:
    """Replace the generated block of ``page`` (kept: the protocol around it) with the table and figure from
    ``data``, or with a note that no committed run exists yet."""
    if data is not None:
        plot(data, Path(page).parent / FIGURE)
    results_io.replace_block(page, MARK, docs_section(data) if data is not None else None,
                             "benchmarks/results/llm_peers.json", "python benchmarks/llm_peers.py")
