"""The presentation of a :class:`headprune.bench.BenchResult`: a plain-text table and a PNG figure.

matplotlib is imported only when a figure is drawn, so the table costs no plotting import.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..report.plotting import pyplot

if TYPE_CHECKING:
    from .timing import BenchResult


def bench_table(result: BenchResult) -> str:
    """Plain-text table: examples/s (IQR), latency, measured speed-up, FLOP limit, efficiency."""
    head = (f"{'model':<22} {'batch':>5} {'examples/s':>11} {'IQR':>15} {'latency ms':>10} "
            f"{'speed-up':>8} {'FLOP limit':>10} {'efficiency':>10}")
    lines = [head, "-" * len(head)]
    ups = {(s["model"], s["batch"]): s for s in result.speedups}
    for r in result.runs:
        s = ups.get((r["model"], r["batch"]))
        up = f"{s['measured']:>7.3f}x {s['flop_limit']:>9.3f}x {_two_decimals(s['efficiency']):>10}" if s else \
            f"{'-':>8} {'-':>10} {'-':>10}"
        iqr = f"{r['examples_per_s_q25']:.1f}-{r['examples_per_s_q75']:.1f}"
        lines.append(f"{r['model']:<22} {r['batch']:>5} {r['examples_per_s']:>11.2f} {iqr:>15} "
                     f"{1e3 * r['latency_s']:>10.2f} {up}")
    return "\n".join(lines)


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
