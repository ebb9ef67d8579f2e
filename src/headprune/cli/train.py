"""``headprune train classifier|translation``: make the models the study runs on, here, on a CPU.

Each epoch is a checkpoint directory (``OUT/epoch-k``) that every other command accepts; rerunning
the same command resumes after the newest one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from ..errors import ConfigError
from ..train.settings import ClassifierTrainSettings, TranslationTrainSettings
from .app import App, app, friendly
from .dataflags import in_cli_terms, parse_label_map, split_option
from .options import LABEL, PAIR, QUIET, SRC, TEXT, TGT, column

train_app = App(no_args_is_help=True, help="Fine-tune a classifier or train a translation model.")
app.add_typer(train_app, name="train")

_C, _T, _I = ClassifierTrainSettings(), TranslationTrainSettings(), TranslationTrainSettings.iwslt()  # defaults


def _both(small, iwslt) -> str:
    return f"default {small}" if small == iwslt else f"default {small}; --preset iwslt {iwslt}"


THREADS = typer.Option(None, "--threads", help="torch threads (default: torch's own choice).")
SEED = typer.Option(0, "--seed", help="Seed of the initial weights (the new head; a translation model's weights) "
                    "and of the batch order and dropout of every epoch.")
LIMIT = typer.Option(None, "--limit", help="Only the first N training examples (default: all).")
OUT = typer.Option(..., "-o", "--output", help="Output directory (epoch-k checkpoints, final/, train_log.jsonl).")


# settings field -> the flag that sets it (a refused value is named as typed)
FLAGS = {"epochs": "--epochs", "batch_size": "--batch-size", "lr": "--lr", "max_length": "--max-length",
         "attention_heads": "--heads", "d_model": "--d-model", "ffn_dim": "--ffn-dim", "vocab_size": "--vocab-size",
         "warmup_steps": "--warmup-steps", "encoder_layers": "--layers", "decoder_layers": "--layers", "seed": "--seed"}


@contextmanager
def _flag_terms() -> Iterator[None]:
    """A settings error (``ClassifierTrainSettings.epochs=0; ...``) re-raised naming the flag (``--epochs 0``)."""
    try:
        yield
    except ConfigError as err:
        text = re.sub(r"\b\w+TrainSettings\.(\w+)=", lambda m: f"{FLAGS[m[1]]} " if m[1] in FLAGS else m[0], str(err))
        raise ConfigError(text) from err


def _options(**values) -> dict:
    return {k: v for k, v in values.items() if v is not None}


def _label_map(value: str | None) -> dict[str, int] | None:
    """``--label-map`` of a new classifier: integer ids 0..N-1, every one used (one output per id)."""
    mapping = parse_label_map(value)
    if mapping is not None:
        missing = sorted(set(range(max(mapping.values()) + 1)) - set(mapping.values()))
        if missing:
            raise ConfigError(f"--label-map {value!r} leaves out ids {missing}; allowed: ids 0..N-1 without gaps "
                              "(a new classifier has one output per id)")
    return mapping


def _threads(threads: int | None) -> None:
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads {threads}; allowed: >= 1")
        import torch

        torch.set_num_threads(threads)


def _check_positions(model_dir: Path, max_length: int) -> None:
    """``--max-length`` within the pretrained model's position table (from its config alone)."""
    from ..core.store.checkpoint import hf_config
    from ..evaluation.build import position_limit

    if not (Path(model_dir) / "config.json").is_file():
        return  # the loader names a directory without a model
    positions = position_limit(hf_config(Path(model_dir)))
    if positions is not None and max_length > positions:
        raise ConfigError(f"--max-length {max_length}; allowed: an integer 2..{positions} (the model has "
                          f"{positions} positions)")


@train_app.command("classifier")
@friendly
def classifier(
    model_dir: Path = typer.Argument(..., help="Pretrained encoder directory (a fresh classification head is added)."),
    data: str = typer.Option(..., "--data", help="Training data (TSV/CSV/JSONL/datasets dir)."),
    eval_data: str = typer.Option(None, "--eval-data", help="Evaluation data, scored after every epoch (default: "
                                  "none)."),
    eval_limit: int = typer.Option(None, "--eval-limit", help="Only the first N evaluation examples (default: all)."),
    text_column: str = TEXT, text_pair_column: str = PAIR, label_column: str = LABEL, limit: int = LIMIT,
    split: str = split_option("--data"), eval_split: str = split_option("--eval-data"),
    label_map: str = typer.Option(None, "--label-map", help="The data's labels as the new classifier's ids 0..N-1, "
                                  "LABEL=ID pairs, e.g. negative=0,positive=1 (default: the labels sorted, "
                                  "numbers by value, words alphabetically)."),
    epochs: int = typer.Option(None, "--epochs", help=f"Epochs (default {_C.epochs})."),
    batch_size: int = typer.Option(None, "--batch-size", help=f"Training batch size (default {_C.batch_size})."),
    lr: float = typer.Option(None, "--lr", help=f"Peak learning rate of AdamW, after a linear warm-up over "
                             f"{_C.warmup_ratio:.0%} of the steps, then linear decay (default {_C.lr:g})."),
    max_length: int = typer.Option(None, "--max-length", help="Truncate each example (pair) to this many tokens, "
                                   f"special tokens included (default {_C.max_length})."),
    seed: int = SEED, threads: int = THREADS, output: Path = OUT, quiet: bool = QUIET,
):
    """Fine-tune a pretrained encoder for (pair) classification."""
    from ..core.io import load_tokenizer
    from ..evaluation.data import encode_labels, load_classification
    from ..train import ClassifierData, ClassifierTrainSettings, finetune_classifier

    cols = dict(text_column=column(text_column), text_pair_column=column(text_pair_column),
                label_column=column(label_column))
    with _flag_terms():
        settings = ClassifierTrainSettings(**_options(epochs=epochs, batch_size=batch_size, lr=lr,
                                                      max_length=max_length), seed=seed, progress=not quiet)
    if max_length is not None:
        _check_positions(model_dir, max_length)
    mapping = _label_map(label_map)
    with in_cli_terms("--data"):
        train = load_classification(data, **cols, limit=limit, split=split)
        if train.labels is None:
            raise ConfigError(f"--data {data!r} has no labels; training needs a label column")
        names = sorted(set(train.labels), key=lambda x: (len(x), x))  # "0" < "1" < "10"; words alphabetically
        index = {name: i for i, name in enumerate(names)}
        ids = [index[x] for x in train.labels] if mapping is None else encode_labels(train.labels, mapping)
    with in_cli_terms("--eval-data"):
        dev = load_classification(eval_data, **cols, limit=eval_limit, split=eval_split) if eval_data else None
        if dev is not None and dev.labels is None:
            raise ConfigError(f"--eval-data {eval_data!r} has no labels; scoring each epoch needs a label column")
        if dev is not None and mapping is None and (unknown := sorted(set(dev.labels or []) - set(names))):
            raise ConfigError(f"--eval-data {eval_data!r} has labels {unknown} not in the training data ({names})")
        dev_ids = (None if dev is None else [index[x] for x in dev.labels] if mapping is None
                   else encode_labels(dev.labels, mapping))
    if mapping is not None:  # the first label given for each id names it
        names = [next(k for k, v in mapping.items() if v == i) for i in range(len(set(mapping.values())))]
    tokenizer = load_tokenizer(model_dir)
    _threads(threads)
    examples = ClassifierData(train.texts, ids, text_pairs=train.text_pairs, eval_texts=dev.texts if dev else None,
                              eval_labels=dev_ids, eval_text_pairs=dev.text_pairs if dev else None, label_names=names)
    result = finetune_classifier(model_dir, tokenizer, examples, settings=settings, output_dir=output)
    last = result.log[-1] if result.log else {}
    typer.echo(f"done in {result.seconds:.0f} s: {result.final_dir or result.output_dir}; last epoch: "
               + ", ".join(f"{k} {v:.4g}" for k, v in last.items() if isinstance(v, float)))


@train_app.command("translation")
@friendly
def translation(
    data: str = typer.Option(..., "--data", help="Source file (or a two-column table)."),
    data2: Path = typer.Option(None, "--data2", help="Target file, line-aligned with --data (default: none, --data "
                               "is a two-column table)."),
    eval_data: str = typer.Option(None, "--eval-data", help="Evaluation source file, BLEU after every epoch "
                                  "(default: none)."),
    eval_data2: Path = typer.Option(None, "--eval-data2", help="Evaluation target file (default: none)."),
    eval_limit: int = typer.Option(None, "--eval-limit", help="Only the first N evaluation pairs (default: all)."),
    source_column: str = SRC, target_column: str = TGT, limit: int = LIMIT,
    split: str = split_option("--data"), eval_split: str = split_option("--eval-data"),
    preset: str = typer.Option("small", "--preset", help="small (3+3 layers x 4 heads, d 256) or iwslt "
                               "(6+6 layers x 8 heads, d 512, the paper's IWSLT shape)."),
    layers: int = typer.Option(None, "--layers", help="Encoder and decoder layers, each "
                               f"({_both(_T.encoder_layers, _I.encoder_layers)})."),
    heads: int = typer.Option(None, "--heads", help="Attention heads per site "
                              f"({_both(_T.attention_heads, _I.attention_heads)})."),
    d_model: int = typer.Option(None, "--d-model", help=f"Model width ({_both(_T.d_model, _I.d_model)})."),
    ffn_dim: int = typer.Option(None, "--ffn-dim", help=f"Feed-forward width ({_both(_T.ffn_dim, _I.ffn_dim)})."),
    vocab_size: int = typer.Option(None, "--vocab-size", help="Joint BPE vocabulary size "
                                   f"({_both(_T.vocab_size, _I.vocab_size)})."),
    warmup_steps: int = typer.Option(None, "--warmup-steps", help="Linear warm-up steps before inverse-sqrt decay "
                                     f"({_both(_T.warmup_steps, _I.warmup_steps)})."),
    epochs: int = typer.Option(None, "--epochs", help=f"Epochs ({_both(_T.epochs, _I.epochs)})."),
    batch_size: int = typer.Option(None, "--batch-size", help=f"Sentence pairs per batch (default {_T.batch_size}; "
                                   f"--preset iwslt: batches of up to {_I.max_tokens} tokens instead)."),
    lr: float = typer.Option(None, "--lr", help=f"Peak learning rate ({_both(f'{_T.lr:g}', f'{_I.lr:g}')})."),
    max_length: int = typer.Option(None, "--max-length", help="Longest training pair in tokens, </s> included: longer "
                                   "pairs are skipped, not truncated; evaluation sources are truncated to it and it "
                                   f"bounds the generated length (default {_T.max_length})."),
    seed: int = SEED, threads: int = THREADS, output: Path = OUT, quiet: bool = QUIET,
):
    """Train an encoder-decoder translation model from scratch (tokenizer trained here too)."""
    from ..evaluation.data import load_parallel
    from ..train import TranslationTrainSettings, train_translation

    if preset not in ("small", "iwslt"):
        raise ConfigError(f"--preset {preset!r}; allowed: small, iwslt")
    overrides = _options(epochs=epochs, batch_size=batch_size, lr=lr, max_length=max_length, attention_heads=heads,
                         d_model=d_model, ffn_dim=ffn_dim, vocab_size=vocab_size, warmup_steps=warmup_steps)
    if layers is not None:
        overrides.update(encoder_layers=layers, decoder_layers=layers)
    with _flag_terms():
        settings = (TranslationTrainSettings.iwslt(**overrides, seed=seed, progress=not quiet) if preset == "iwslt"
                    else TranslationTrainSettings(**overrides, seed=seed, progress=not quiet))
    cols = dict(source_column=column(source_column), target_column=column(target_column))
    with in_cli_terms("--data"):
        train = load_parallel(data, data2, **cols, limit=limit, split=split)
    with in_cli_terms("--eval-data"):
        dev = load_parallel(eval_data, eval_data2, **cols, limit=eval_limit, split=eval_split) if eval_data else None
    _threads(threads)
    result = train_translation(train.sources, train.targets, settings=settings, output_dir=output,
                               eval_sources=dev.sources if dev else None, eval_targets=dev.targets if dev else None)
    last = result.log[-1] if result.log else {}
    typer.echo(f"done in {result.seconds:.0f} s: {result.final_dir or result.output_dir}; last epoch: "
               + ", ".join(f"{k} {v:.4g}" for k, v in last.items() if isinstance(v, float)))
