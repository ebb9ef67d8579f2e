"""Flags shared by several commands, declared once.

Typer reads a command's flags from its signature. :func:`with_flags` adds a group of flags (a
:class:`Flags` subclass: one field per flag, its default the ``typer.Option``) to a command's
signature and hands the command one object holding their values, so a group is written once
however many commands take it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from pathlib import Path

import typer

from ..errors import ConfigError
from ..progress import note
from .dataflags import LABEL_MAP, in_cli_terms, parse_label_map, split_option

TASK = typer.Option(..., "--task", help="classification, translation or lm.")
DATA = typer.Option(..., "--data", help="Data file (TSV/CSV/JSONL/datasets dir; translation: source file or table; "
                    "lm: text file or 'builtin:pydoc').")
DATA2 = typer.Option(None, "--data2", help="Translation: target file, line-aligned with --data (default: none, "
                     "--data is then one source/target table).")
SEED = typer.Option(0, "--seed", help="Seed of the bootstrap and of the random order.")
OUT = typer.Option(..., "-o", "--output", help="Run directory (rerun the same command to resume).")
FRESH = typer.Option(False, "--fresh", help="Start over in an existing run directory.")
MINSITE = typer.Option(0, "--min-per-site", help="Keep at least this many heads in every site.")
GQA = typer.Option("uniform", "--gqa", help="Grouped-query attention: uniform (the same query heads kept per key/value "
                   "group; never enlarges the KV cache), groups (whole key/value groups) or free (any heads; warns "
                   "when the KV cache grows). Models without GQA: no effect.")
TEXT = typer.Option(None, "--text-column", help="Classification text column, a name or a position (default: "
                    "guessed from common names, e.g. sentence).")
PAIR = typer.Option(None, "--text-pair-column", help="Second text column of pair tasks (default: guessed, e.g. "
                    "sentence2; none for single texts).")
LABEL = typer.Option(None, "--label-column", help="Classification label column (default: guessed, e.g. label).")
SRC = typer.Option(None, "--source-column", help="Translation table: source column (default: source or src, or "
                   "the first of two columns).")
TGT = typer.Option(None, "--target-column", help="Translation table: target column (default: target or tgt, or "
                   "the second of two columns).")
LIMIT = typer.Option(None, "--limit", help="Only the first N examples of --data (lm: N blocks; default: all).")
BATCH = typer.Option(None, "--batch-size", help="Batch size (default 32; lm 8).")
METRIC = typer.Option(None, "--metric", help="Classification: accuracy (default), f1 or matthews.")
BEAMS = typer.Option(1, "--beams", help="Translation: beam size (1 = greedy).")
CALIB_LIMIT = 256  # the first N examples of a calibration or choice data set
DEVICE = typer.Option(None, "--device", help="Where the model runs: cpu, cuda, cuda:1, mps (default: the best "
                      "available: cuda, else mps, else cpu).")
DTYPE = typer.Option(None, "--dtype", help="The model's dtype: float32, bfloat16 or float16 (default: as saved). "
                     "Scores are summed in float64 either way.")
QUIET = typer.Option(False, "--quiet", "-q", help="No progress on stderr (default: bars on a terminal; elsewhere, e.g. "
                     "a log file, a line per stage and at most one every 30 s within it).")


def calib_limit_option(flag: str, use: str):
    """``--calib-limit``: the same flag, default and meaning wherever a second data set calibrates or chooses."""
    return typer.Option(CALIB_LIMIT, "--calib-limit", help=f"Use only the first N examples of {flag} ({use}; lm: N "
                        "blocks); --limit applies to --data only.")


def check_calib_limit(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"--calib-limit {value}; allowed: an integer >= 1")
    return value


@dataclasses.dataclass
class Flags:
    """A group of flags: subclasses declare ``name: type = dataclasses.field(default=typer.Option(...))``."""


@dataclasses.dataclass
class TaskFlags(Flags):
    """How to read a task's data and run its evaluator (every command that evaluates)."""

    text_column: str = dataclasses.field(default=TEXT)
    text_pair_column: str = dataclasses.field(default=PAIR)
    label_column: str = dataclasses.field(default=LABEL)
    source_column: str = dataclasses.field(default=SRC)
    target_column: str = dataclasses.field(default=TGT)
    limit: int = dataclasses.field(default=LIMIT)
    batch_size: int = dataclasses.field(default=BATCH)
    metric: str = dataclasses.field(default=METRIC)
    beams: int = dataclasses.field(default=BEAMS)
    split: str = dataclasses.field(default=split_option("--data"))
    label_map: str = dataclasses.field(default=LABEL_MAP)
    device: str = dataclasses.field(default=DEVICE)
    dtype: str = dataclasses.field(default=DTYPE)
    no_prefix_token: bool = dataclasses.field(default=typer.Option(
        False, "--no-prefix-token", help="LM: cut plain text blocks (default: every block starts with the model's "
        "prefix token, its BOS else EOS, as the model is used and as lm-evaluation-harness measures it). Recorded in "
        "the run's signature."))

    def columns(self) -> dict:
        """The column flags as library arguments: digits are a position (a headerless file), else a name."""
        return {k: column(getattr(self, k)) for k in
                ("text_column", "text_pair_column", "label_column", "source_column", "target_column")}


@dataclasses.dataclass
class SweepFlags(Flags):
    """Which sites a sweep covers and how its significance is tested."""

    sites: str = dataclasses.field(default=typer.Option(None, "--sites", help="Comma-separated site names or kinds "
                                   "(encoder, decoder, cross); default: every site."))
    alpha: float = dataclasses.field(default=typer.Option(0.01, "--alpha", help="Significance level for the flag."))
    resamples: int | None = dataclasses.field(default=typer.Option(
        None, "--resamples", help="Resamples / permutations per test; default: sized for the sweep "
        "(max(1000, 5 m / alpha) for m tests). Fewer than m / alpha is refused: nothing could be significant."))
    seed: int = dataclasses.field(default=SEED)
    correction: str = dataclasses.field(default=typer.Option(
        "holm", "--correction", help="Multiplicity control over the sweep: holm (family-wise error) or bh "
        "(Benjamini-Hochberg, false discovery rate); 'significant' uses the adjusted p."))
    prefix_cache: str = dataclasses.field(default=typer.Option(
        "full", "--prefix-cache", help="full: record every block's output once and replay the blocks below each "
        "masked site; stream: hold only the input of the layer being swept (one extra pass per layer; for large "
        "models); off: every unit a full pass. The rows are the same."))

    def settings(self):
        from ..errors import ConfigError
        from ..experiments.ablation import SweepSettings

        if self.correction not in ("holm", "bh"):
            raise ConfigError(f"--correction {self.correction!r}: allowed: holm, bh")
        cache = {"full": True, "stream": "stream", "off": False}
        if self.prefix_cache not in cache:
            raise ConfigError(f"--prefix-cache {self.prefix_cache!r}: allowed: full, stream, off")
        with in_cli_terms():
            return SweepSettings(alpha=self.alpha, n_resamples=self.resamples, seed=self.seed,
                                 correction=self.correction, prefix_cache=cache[self.prefix_cache])

    def site_list(self) -> list[str] | None:
        return comma_list(self.sites)


def with_flags(**groups: type[Flags]):
    """Decorator: add every field of each ``Flags`` class to the command's flags; the command receives
    one instance per group under the keyword given here (e.g. ``@with_flags(task=TaskFlags)``)."""

    def decorate(fn):
        signature = inspect.signature(fn)
        own = [p for p in signature.parameters.values() if p.name not in groups]
        added = {key: [f.name for f in dataclasses.fields(cls)] for key, cls in groups.items()}
        extra = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                   annotation=typing.get_type_hints(cls)[f.name])
                 for cls in groups.values() for f in dataclasses.fields(cls)]
        names = [p.name for p in own] + [p.name for p in extra]
        if len(set(names)) != len(names):
            raise TypeError(f"{fn.__name__}: a flag group repeats a parameter ({names})")

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for key, cls in groups.items():
                kwargs[key] = cls(**{name: kwargs.pop(name) for name in added[key]})
            return fn(*args, **kwargs)

        wrapper.__signature__ = signature.replace(parameters=_ordered(own + extra))
        return wrapper

    return decorate


def _ordered(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """Positional parameters first, keyword-only after (stable), as ``inspect.Signature`` requires."""
    return sorted(params, key=lambda p: p.kind)


def column(value: str | None) -> int | str | None:
    """A column flag: digits are a position (a headerless file), anything else a name."""
    return int(value) if value is not None and value.strip().isdigit() else value


def comma_list(value: str | None) -> list[str] | None:
    return None if not value else [s.strip() for s in value.split(",") if s.strip()]


def load_model_dir(model_dir: Path, task: str | None = None, device: str | None = None, dtype: str | None = None,
                   quiet: bool = False):
    """(model, tokenizer) of a model directory, on ``--device`` in ``--dtype``; a directory without a tokenizer is
    refused, and so is a model without the head ``task`` needs (one line naming its class and what to do).
    ``quiet``: no ``loading ...`` line on stderr."""
    from ..core.io import load_model, load_tokenizer
    from ..evaluation.build import check_model, check_task

    if task is not None:
        check_task(task)
    note(f"loading {model_dir} ...", show=not quiet)
    tokenizer = load_tokenizer(model_dir)  # first: reading a GGUF's vocabulary takes memory the weights then reuse
    if tokenizer is None:
        raise ConfigError(f"model directory {str(model_dir)!r} has no tokenizer (tokenizer.json, "
                          "tokenizer_config.json, vocab.txt or spiece.model); save one beside the model")
    model = load_model(model_dir, **device_dtype(device, dtype))
    if task is not None:
        check_model(task, model, str(model_dir))
    return model, tokenizer


def device_dtype(device: str | None, dtype: str | None) -> dict:
    """``--device`` and ``--dtype`` as :func:`headprune.load_model` arguments (refused in one line when unknown)."""
    from ..core.model.devices import resolve_device, resolve_dtype

    return {"device": resolve_device(device), "dtype": resolve_dtype(dtype)}


def check_checkpoint(model_dir: Path, task: str) -> None:
    """:func:`headprune.evaluation.build.check_model` from ``config.json`` alone (no weights loaded)."""
    import transformers

    from ..core.store.checkpoint import hf_config
    from ..evaluation.build import check_model

    config = hf_config(Path(model_dir))
    arch = (getattr(config, "architectures", None) or [None])[0]
    cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
    if isinstance(cls, type):
        check_model(task, cls, str(model_dir), config=config)


class TaskSetup:
    """A loaded model, checked to have the head ``task`` needs, and the task flags shared by a command;
    ``on(data)`` builds an evaluator. Every command that evaluates goes through it, so a wrong model is
    refused before any data is read or anything is written. ``quiet`` (``--quiet``): no ``loading ...`` line."""

    def __init__(self, model_dir: Path, task: str, flags: TaskFlags, quiet: bool = False):
        self.model, self.tokenizer = load_model_dir(model_dir, task, flags.device, flags.dtype, quiet)
        self.task, self.flags = task, flags
        self.label_map = parse_label_map(flags.label_map, self.model.config)

    def on(self, data: str, data2=None, *, limit: int | None = None, flag: str = "--data", split: str | None = None,
           **options):
        """The evaluator of ``data``, read through ``flag`` (``--data``, ``--calib-data``, ...: its errors name
        that data set's flags): ``limit`` (default ``--limit``) its first N examples, ``split`` (default
        ``--split`` for ``--data``) its split; ``options`` (``max_length``, ``max_new_tokens``, ``block_size``) go to
        :class:`headprune.evaluation.build.EvalOptions`."""
        from ..evaluation.build import EvalOptions, TaskData, build_task

        f = self.flags
        split = f.split if flag == "--data" and split is None else split
        with in_cli_terms(flag):
            examples = TaskData(data, data2, columns=f.columns(), limit=f.limit if limit is None else limit,
                                split=split, label_map=self.label_map)
            settings = EvalOptions(batch_size=f.batch_size, metric=f.metric, beams=f.beams, prefix=not f.no_prefix_token,
                                   **options)
            return build_task(self.task, self.tokenizer, self.model.config, examples, settings)
