"""``headprune evaluate``: score a model directory on a task's data, optionally with heads masked."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..errors import ConfigError
from .app import app, friendly, json_arg, no_repeated_heads
from .dataflags import argument_as_flag
from .options import DATA2, QUIET, TaskFlags, TaskSetup, with_flags


def _heads_off(heads_off: str | None) -> dict[str, list[int]]:
    dropped = no_repeated_heads(json_arg(heads_off, "--heads-off"), "--heads-off") if heads_off else {}
    for site, heads in dropped.items():
        if not isinstance(heads, list):
            raise ConfigError(f"--heads-off[{site!r}] = {heads!r}; allowed: a list of head indices")
    return dropped


@app.command("evaluate")
@friendly
@with_flags(flags=TaskFlags)
def evaluate(
    model_dir: Path = typer.Argument(..., help="A Hugging Face model directory (or one written by headprune), or a .gguf file."),
    task: str = typer.Option(..., "--task", help="One of: classification, translation, lm."),
    data: str = typer.Option(..., "--data", help="TSV/CSV/JSONL file or datasets directory; translation: the source "
                             "file or one source/target table; lm: a text file, or 'builtin:pydoc'."),
    data2: Path = DATA2,
    max_length: int = typer.Option(None, "--max-length", help="Truncate inputs (default 128; translation 256)."),
    max_new_tokens: int = typer.Option(None, "--max-new-tokens", help="Translation: generation bound "
                                       "(default min(1.5 * source length + 10, 256))."),
    block_size: int = typer.Option(128, "--block-size", help="LM: tokens per block."),
    heads_off: str = typer.Option(None, "--heads-off", help='Mask these heads: JSON {"site": [heads]} or a file '
                                  "(default: none, the full model)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
    quiet: bool = QUIET,
    *, flags: TaskFlags,
):
    """Evaluate a model on a task: corpus score, examples/s and the signature that reproduces it."""
    from ..core.masks.masking import mask_from_heads
    from ..evaluation.build import check_task
    from ..evaluation.metrics import format_score
    from ..provenance import code_identity, own_name, versions

    check_task(task)
    off = _heads_off(heads_off)  # refuse bad JSON before loading anything
    t = TaskSetup(model_dir, task, flags, quiet)  # refuses a model without the task's head before reading data
    model = t.model
    evaluator = t.on(data, data2, max_length=max_length, max_new_tokens=max_new_tokens, block_size=block_size)
    with argument_as_flag("heads", "--heads-off"):
        mask = mask_from_heads(model, off) if off else None
    result = evaluator.evaluate(model, mask, progress=not quiet)
    out = result.to_dict()
    extra = dict(out.pop("extra"))
    extra.pop("hypotheses", None)
    signature = {**extra.pop("signature", evaluator.signature), "n": result.n, "model": own_name(model_dir),
                 "heads_off": off, "code": code_identity(), "versions": versions()}
    if as_json:
        typer.echo(json.dumps({"task": task, **out, "extra": extra, "signature": signature}, indent=2))
        return
    # scores as every command prints them (format_score: accuracy, F1, Matthews x 100); --json keeps fractions
    typer.echo(f"{result.metric}: {format_score(result.metric, result.score)}  (n={result.n}, "
               f"{result.examples_per_s:.1f} examples/s, {result.tokens_per_s:.0f} tokens/s)")
    for key, value in extra.items():
        if key == result.metric:
            continue  # the first line has it
        typer.echo(f"{key}: {format_score(key, value)}" if isinstance(value, float) else f"{key}: {value}")
    typer.echo("signature: " + ", ".join(f"{k}={v}" for k, v in signature.items() if k != "versions"))
