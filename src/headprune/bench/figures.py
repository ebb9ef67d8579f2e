"""The presentation of a :class:`headprune.bench.BenchResult`: a plain-text table and a PNG figure.

matplotlib is imported only when a figure is drawn, so the table costs no plotting import.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

from ..report.plotting import pyplot

if TYPE_CHECKING:
    from .timing import BenchResult


def bench_table(result: BenchResult) -> str:
    """Plain-text table: examples/s (IQR), latency, measured speed-up (IQR of the paired ratios), FLOP
    limit, efficiency; a noisy speed-up (bench.json's ``noisy``) shows ``noisy!`` instead of a number; a footer
    says how each column is computed."""
    w = max([22] + [len(r["model"]) for r in result.runs])  # a long name (a .gguf file) keeps the columns aligned
    head = (f"{'model':<{w}} {'batch':>5} {'examples/s':>11} {'IQR':>15} {'latency ms':>10} "
            f"{'col ratio':>9} {'speed-up':>9} {'ratio IQR':>13} {'FLOP limit':>10} {'efficiency':>10}")
    lines = [head, "-" * len(head)]
    ups = {(s["model"], s["batch"]): s for s in result.speedups}
    for r in result.runs:
        s = ups.get((r["model"], r["batch"]))
        if s:
            spread = f"{s['measured_q25']:.3f}-{s['measured_q75']:.3f}"
            if s.get("noisy"):  # bench.json marks it unreadable: no number is printed as a result
                up = f"{s['ratio_of_medians']:>8.3f}x {'noisy!':>9} {spread:>13} {s['flop_limit']:>9.3f}x {'-':>10}"
            else:
                up = (f"{s['ratio_of_medians']:>8.3f}x {s['measured']:>7.3f}x  {spread:>13} {s['flop_limit']:>9.3f}x "
                      f"{_two_decimals(s['efficiency']):>10}")
        else:
            up = f"{'-':>9} {'-':>9} {'-':>13} {'-':>10} {'-':>10}"
        iqr = f"{r['examples_per_s_q25']:.1f}-{r['examples_per_s_q75']:.1f}"
        lines.append(f"{r['model']:<{w}} {r['batch']:>5} {r['examples_per_s']:>11.2f} {iqr:>15} "
                     f"{1e3 * r['latency_s']:>10.2f} {up}")
    notes = ["examples/s = batch / median round time (IQR over rounds). col ratio = this model's examples/s over "
             "the reference's (the columns' own ratio). speed-up = median over the same rounds of the paired ratio "
             "reference time / model time (ratio IQR: its quartiles): the rounds are alternated, so each pair saw "
             "the same machine load; where the two differ, the load changed during the run. FLOP limit = reference FLOPs / model FLOPs (2 x matmul multiply-"
             "accumulates); efficiency = (speed-up - 1) / (FLOP limit - 1)."]
    if any(s.get("noisy") for s in result.speedups):
        limit = result.settings.get("noisy_times", 0.1)
        notes.append("noisy!: the ratio IQR is wider than the speed-up's distance from 1, or a model's round "
                     f"times vary by more than {limit:.0%} (IQR / median): the speed-up cannot be read, so none is "
                     "shown (bench.json keeps the measurement).")
    return "\n".join(lines + [""] + [textwrap.fill(n, width=len(head)) for n in notes])


def bench_warnings(result: BenchResult) -> list[str]:
    """One line if the machine was busier than its cores, and one per noisy speed-up: the spread that makes it
    unreadable and what to do about it."""
    out, limit = [], result.settings.get("noisy_times", 0.1)
    load = result.machine.get("load") or {}
    if load and not load.get("reliable", True):
        out.append(f"warning: the machine was busy ({load.get('reason')}): these speeds are unreliable; do not quote "
                   "them, rerun on a quieter machine")
    for s in result.speedups:
        if not s.get("noisy"):
            continue
        rel = s.get("times_relative_iqr", {})
        out.append(f"warning: {s['model']} vs {s['reference']} at batch {s['batch']}: speed-up "
                   f"{s['measured']:.3f}x is too noisy to read (paired ratios' IQR {s['measured_q25']:.3f}-"
                   f"{s['measured_q75']:.3f}; IQR / median of the round times: {s['reference']} "
                   f"{rel.get('reference', 0):.0%}, {s['model']} {rel.get('model', 0):.0%}, limit {limit:.0%}); "
                   "rerun with more --repeats, a longer --min-repeat-s or fewer --threads, on a quieter machine")
    return out


def bench_plot(result: BenchResult, path: str | Path) -> Path:
    """PNG: examples/s vs batch size per model (IQR bars); measured speed-up vs FLOP limit."""
    plt = pyplot()
    two = bool(result.speedups)
    fig, axes = plt.subplots(1, 2 if two else 1, figsize=(12 if two else 6.5, 4.5), squeeze=False)
    ax = axes[0][0]
    for name in result.models:
        rs = [r for r in result.runs if r["model"] == name]
        x, y = [r["batch"] for r in rs], [r["examples_per_s"] for r in rs]
        err = [[v - r["examples_per_s_q25"] for v, r in zip(y, rs, strict=True)],
               [r["examples_per_s_q75"] - v for v, r in zip(y, rs, strict=True)]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=name)
    ax.set(xscale="log", yscale="log", xlabel="batch size (examples)", ylabel="throughput (examples/s)",
           title=f"Throughput, seq len {result.settings['seq_len']}")
    _batch_ticks(ax, result.settings["batch_sizes"])
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    if two:
        ax = axes[0][1]
        for name in dict.fromkeys(s["model"] for s in result.speedups):
            ss = [s for s in result.speedups if s["model"] == name]
            line = ax.plot([s["batch"] for s in ss], [s["measured"] for s in ss], marker="o",
                           label=f"{name} / {ss[0]['reference']} measured")[0]
            ax.plot([s["batch"] for s in ss], [s["flop_limit"] for s in ss], ls="--", color=line.get_color(),
                    label=f"{name} FLOP limit")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xscale="log", xlabel="batch size (examples)", ylabel="speed-up (x, median of paired rounds)",
               title="Measured speed-up vs FLOP limit")
        _batch_ticks(ax, result.settings["batch_sizes"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    m = result.machine
    load = m.get("loadavg_start") or [float("nan")]
    fig.suptitle(f"{m['cpu_count']} CPUs, {m['torch_threads']} torch threads, {m['processor']}; "
                 f"load average at start {load[0]:.1f}", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _batch_ticks(ax, sizes) -> None:
    from matplotlib.ticker import NullLocator

    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.xaxis.set_minor_locator(NullLocator())


def _two_decimals(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def unreadable(speedup: dict) -> str:
    """Why a measured speed-up must not be quoted ('' when it may): too noisy to read, measured while the
    machine was busy (the speed protocol's ``reliable``), or above its FLOP limit, which no removal of work
    can beat (5% margin for timer resolution)."""
    if speedup.get("noisy"):
        return "too noisy"
    if not speedup.get("reliable", True):
        return "the machine was busy"
    if speedup["measured"] > 1.05 * speedup["flop_limit"]:
        return f"above the FLOP limit x{speedup['flop_limit']:.2f}"
    return ""


def speed_text(speedup: dict) -> str:
    """A speed-up as a headline shows it: ``x1.23``, or why it was not measured reliably (never a number its own
    record marks unreadable; bench.json / compress.json keep the measurement)."""
    why = unreadable(speedup)
    return f"not measured reliably ({why}; x{speedup['measured']:.2f} kept in the JSON)" if why else \
        f"x{speedup['measured']:.2f}"
