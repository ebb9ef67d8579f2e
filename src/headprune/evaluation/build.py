"""An evaluator from a task name and data paths: what ``headprune evaluate`` and the study commands build."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .classification import Classification
from .data import load_classification, load_parallel, load_text, python_docs_text
from .lm import LanguageModelling
from .translation import Translation

TASKS = ("classification", "translation", "lm")
PYDOC = "builtin:pydoc"  # data value for the English prose shipped with CPython (pydoc_data)
COLUMNS = ("text_column", "text_pair_column", "label_column", "source_column", "target_column")


def build_task(task: str, tokenizer, config, *, data: str, data2: Path | None = None, columns: dict | None = None,
               limit: int | None = None, batch_size: int | None = None, metric: str | None = None,
               max_length: int | None = None, beams: int = 1, max_new_tokens: int | None = None,
               block_size: int = 128, split: str | None = None):
    """The evaluator of ``task`` on ``data`` (all checks raise HeadpruneError; flags that do not apply
    to the task are refused by name)."""
    if task not in TASKS:
        raise ConfigError(f"--task {task!r}; allowed: {', '.join(TASKS)}")
    columns = {k: (columns or {}).get(k) for k in COLUMNS}
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


def _refuse(task: str, **given: object) -> None:
    for flag, value in given.items():
        if value is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} does not apply to --task {task}")
