"""``headprune evaluate``: score a model directory on a task's data, optionally with heads masked."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ..cli import _json_arg, app, friendly
from ..errors import ConfigError

TASKS = ("classification", "translation", "lm")
PYDOC = "builtin:pydoc"  # --data value for the English prose shipped with CPython (pydoc_data)


def _column(value: str | None) -> int | str | None:
    """A column flag: digits are a position (a headerless file), anything else a name."""
    return int(value) if value is not None and value.strip().isdigit() else value


def _refuse(task: str, **given: object) -> None:
    for flag, value in given.items():
        if value is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} does not apply to --task {task}")


def _heads_off(heads_off: str | None) -> dict[str, list[int]]:
    plan = _json_arg(heads_off, "--heads-off") if heads_off else {}
    for site, heads in plan.items():
        if not isinstance(heads, list):
            raise ConfigError(f"--heads-off[{site!r}] = {heads!r}; allowed: a list of head indices")
    return plan


def build_task(task: str, tokenizer, config, *, data: str, data2: Path | None, columns: dict, limit: int | None,
               batch_size: int | None, metric: str | None, max_length: int | None, beams: int,
               max_new_tokens: int | None, block_size: int, split: str | None):
    """The evaluator of ``task`` on the data the flags name (all checks raise HeadpruneError)."""
    from ..data import load_classification, load_parallel, load_text, python_docs_text
    from ..tasks import Classification, LanguageModelling, Translation

    text_cols = {k: columns[k] for k in ("text_column", "text_pair_column", "label_column")}
    pair_cols = {k: columns[k] for k in ("source_column", "target_column")}
    if task == "classification":
        _refuse(task, data2=data2, **pair_cols, max_new_tokens=max_new_tokens)
        rows = load_classification(data, **text_cols, limit=limit, split=split)
        return Classification(tokenizer, rows, config=config, metric=metric or "accuracy",
                              max_length=max_length or 128, batch_size=batch_size or 32)
    if task == "translation":
        _refuse(task, **text_cols, metric=metric, split=split)
        pairs = load_parallel(data, data2, **pair_cols, limit=limit)
        return Translation(tokenizer, pairs, batch_size=batch_size or 32, num_beams=beams,
                           max_new_tokens=max_new_tokens, max_source_length=max_length or 256)
    _refuse(task, data2=data2, **text_cols, **pair_cols, metric=metric, split=split, max_new_tokens=max_new_tokens)
    texts = python_docs_text() if data == PYDOC else load_text(data)
    return LanguageModelling(tokenizer, texts, block_size=block_size, batch_size=batch_size or 8, max_blocks=limit)


@app.command("evaluate")
@friendly
def evaluate(
    model_dir: Path = typer.Argument(..., help="A Hugging Face model directory (or one written by headprune)."),
    task: str = typer.Option(..., "--task", help=f"One of: {', '.join(TASKS)}."),
    data: str = typer.Option(..., "--data", help="TSV/CSV/JSONL file or datasets directory; translation: the source "
                             f"file or one source/target table; lm: a text file, or {PYDOC!r}."),
    data2: Path = typer.Option(None, "--data2", help="Translation: the target file, line-aligned with --data."),
    text_column: str = typer.Option(None, "--text-column", help="Classification text column (name or position)."),
    text_pair_column: str = typer.Option(None, "--text-pair-column", help="Second text of pair tasks."),
    label_column: str = typer.Option(None, "--label-column", help="Classification label column."),
    source_column: str = typer.Option(None, "--source-column", help="Translation table: source column."),
    target_column: str = typer.Option(None, "--target-column", help="Translation table: target column."),
    split: str = typer.Option(None, "--split", help="Split of a datasets directory (classification)."),
    limit: int = typer.Option(None, "--limit", help="Only the first N examples (lm: N blocks)."),
    batch_size: int = typer.Option(None, "--batch-size", help="Batch size (default 32; lm 8)."),
    metric: str = typer.Option(None, "--metric", help="Classification: accuracy (default), f1 or matthews."),
    max_length: int = typer.Option(None, "--max-length", help="Truncate inputs (default 128; translation 256)."),
    beams: int = typer.Option(1, "--beams", help="Translation: beam size (1 = greedy)."),
    max_new_tokens: int = typer.Option(None, "--max-new-tokens", help="Translation: generation bound "
                                       "(default min(1.5 * source length + 10, 256))."),
    block_size: int = typer.Option(128, "--block-size", help="LM: tokens per block."),
    heads_off: str = typer.Option(None, "--heads-off", help='Mask these heads: JSON {"site": [heads]} or a file.'),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
    progress: bool = typer.Option(False, "--progress", help="Show a progress bar."),
):
    """Evaluate a model on a task: corpus score, examples/s and the signature that reproduces it."""
    from ..loading import load_model, load_tokenizer
    from ..masking import mask_from_heads
    from ..tasks.base import versions

    if task not in TASKS:
        raise ConfigError(f"--task {task!r}; allowed: {', '.join(TASKS)}")
    plan = _heads_off(heads_off)  # refuse bad JSON before loading anything
    model = load_model(model_dir)
    if task == "lm" and not type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")):
        raise ConfigError(f"--task lm needs a causal language model; {str(model_dir)!r} holds a "
                          f"{type(model).__name__}; allowed: a ...ForCausalLM or ...LMHeadModel")
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None:
        raise ConfigError(f"model directory {str(model_dir)!r} has no tokenizer (tokenizer.json, "
                          "tokenizer_config.json, vocab.txt or spiece.model)")
    columns = {"text_column": _column(text_column), "text_pair_column": _column(text_pair_column),
               "label_column": _column(label_column), "source_column": _column(source_column),
               "target_column": _column(target_column)}
    evaluator = build_task(task, tokenizer, model.config, data=data, data2=data2, columns=columns, limit=limit,
                           batch_size=batch_size, metric=metric, max_length=max_length, beams=beams,
                           max_new_tokens=max_new_tokens, block_size=block_size, split=split)
    mask = mask_from_heads(model, plan) if plan else None
    result = evaluator.evaluate(model, mask, progress=progress)
    out = result.to_dict()
    extra = dict(out.pop("extra"))
    extra.pop("hypotheses", None)
    signature = {**extra.pop("signature", evaluator.signature), "n": result.n, "model": str(model_dir),
                 "heads_off": plan,
                 "versions": versions()}
    if as_json:
        typer.echo(json.dumps({"task": task, **out, "extra": extra, "signature": signature}, indent=2))
        return
    typer.echo(f"{result.metric}: {result.score:.4f}  (n={result.n}, {result.examples_per_s:.1f} examples/s, "
               f"{result.tokens_per_s:.0f} tokens/s)")
    for key, value in extra.items():
        typer.echo(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    typer.echo("signature: " + ", ".join(f"{k}={v}" for k, v in signature.items() if k != "versions"))
