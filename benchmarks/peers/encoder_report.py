"""The encoder table of ``docs/peers.md``, generated from a results JSON of ``benchmarks/encoder_peers.py`` and
nothing else (every number in the block is read from it)."""

from __future__ import annotations

from pathlib import Path

from doc_tables import markdown_table

from . import results_io

MARK = ("<!-- encoder_peers:begin -->", "<!-- encoder_peers:end -->")


def row_line(row: dict) -> str:
    """One console line per finished row."""
    if row.get("status") != "ok":
        return f"{row['method']} at {row['budget']:.0%}: {row.get('status')} -- {row.get('error')}"
    lo, hi = row["ci95"]
    return (f"{row['method']} at {row['budget']:.0%}: accuracy {row['accuracy']:.4f} ({row['delta']:+.4f}, 95% CI "
            f"[{lo:+.4f}, {hi:+.4f}], p {row['p']:.3g}), FLOPs kept {row['flops_kept']:.3f}, "
            f"speed-up x{row['speedup']:.2f}, pruned in {row['prune_seconds']:.1f} s")


def docs_section(data: dict) -> str:
    s, base = data["settings"], data["unpruned"]
    m = data["machine"]
    lines = [MARK[0], "", "!!! note \"Generated\"",
             "    Every number below is read from `benchmarks/results/encoder_peers.json` by "
             "`python benchmarks/encoder_peers.py --write-docs docs/peers.md`; nothing is typed by hand.", "",
             f"Model: `{s['model']}`. Calibration: {s['calib_examples']} examples of `{s['calib']}` with their labels. "
             f"Evaluation: `{s['eval']}` ({base['n']} examples), read after every plan was made. Budget: "
             f"{s['budget']}. Machine: {m.get('processor')}, {s['threads']} torch thread(s)"
             + (f", load average {m['loadavg_at_start'][0]:.1f} at start" if m.get("loadavg_at_start") else "")
             + f". Command: `{data['command']}`.", "",
             f"Unpruned accuracy {base['accuracy']:.4f}; {data['unpruned_sizes']['pool_flops'] / 1e9:.4f} GFLOPs of "
             f"heads and neurons (pool) and {data['unpruned_sizes']['total_flops'] / 1e9:.4f} GFLOPs in all per "
             f"example at {s['seq_len']} tokens.", "",
             *markdown_table(["method", "budget", "pool FLOPs kept", "all FLOPs kept", "params kept",
                              "heads / neurons", "accuracy", "difference (95% CI)", "McNemar mid-p", "speed-up",
                              "prune s"],
                             [_row_cells(row, data) for row in sorted(data["rows"], key=lambda r: (
                                 -r["budget"], r["tool"] != "headprune", r["method"]))])]
    lines += ["", "Speed-up: median wall time of a batched forward pass over the evaluation set, unpruned / pruned, "
              f"{s['speed_rounds']} alternating rounds each, batch size {s['batch_size']}, on the CPU.", ""]
    if data.get("verdicts"):
        lines += ["\"(selected)\": per budget, the headprune configuration most accurate on the held-out "
                  f"selection examples ({data['settings'].get('select', '-')}); it alone is compared with the peer "
                  "most accurate on the evaluation set (McNemar mid-p of the two rows, 95% interval of the "
                  "difference):", ""]
    for budget, v in sorted(data.get("verdicts", {}).items(), key=lambda kv: -float(kv[0])):
        lo, hi = v["ci95"]
        lines.append(f"- {float(budget):.0%}: {v['headprune']} {v['accuracy']:.4f} vs {v['best_peer']} "
                     f"{v['best_peer_accuracy']:.4f}: {v['difference']:+.4f} [{lo:+.4f}, {hi:+.4f}], p = {v['p']:.3g}"
                     + (f" (Holm over the {len(data['verdicts'])} budgets: {v['p_holm']:.3g})" if "p_holm" in v else "")
                     + ("" if v["higher_than_every_peer"] else " (**not** above every peer)")
                     + (f"; on the selection examples it tied with {', '.join(v['tied_on_selection'])}, and the "
                        "configuration run first wins a tie" if v.get("tied_on_selection") else "") + ".")
    lines += ["", MARK[1]]
    return "\n".join(lines)


def _row_cells(row: dict, data: dict) -> list[str]:
    """One row of the table: a method at a budget (a failed row: its status and error, the rest empty)."""
    if row.get("status") != "ok":
        why = str(row.get("error", "")).replace("|", "/").splitlines()[0][:160] if row.get("error") else ""
        phase = row.get("torch_pruning", {}).get("phase_reached")
        return [row["method"], f"{row['budget']:.0%}",
                f"{row.get('status')}" + (f" (phase {phase})" if phase else "") + f": {why}", *[""] * 8]
    lo, hi = row["ci95"]
    sz = row["sizes"]
    name = row["method"] + (" (selected)" if data.get("selected", {}).get(str(row["budget"])) == row["method"] else "")
    return [name, f"{row['budget']:.0%}", f"{row['flops_kept']:.3f}", f"{row['total_flops_kept']:.3f}",
            f"{row['params_kept']:.3f}", f"{sz['heads']} / {sz['neurons']}", f"{row['accuracy']:.4f}",
            f"{row['delta']:+.4f} ({lo:+.4f}, {hi:+.4f})", f"{row['p']:.3g}", f"{row['speedup']:.2f}",
            f"{row['prune_seconds']:.1f}"]


def write_docs(page: str | Path, data: dict | None) -> None:
    """Replace the encoder block of ``page`` with the table from ``data`` (or a note that no run exists yet)."""
    results_io.replace_block(page, MARK, docs_section(data) if data is not None else None,
                             "benchmarks/results/encoder_peers.json", "python benchmarks/encoder_peers.py --threads 1")
