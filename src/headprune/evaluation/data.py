"""Local data in, plain Python out: classification tables, parallel text, plain text (no downloads).

Formats and column guessing live in `headprune.evaluation.formats`; every problem raises `DataError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any, Literal

from ..errors import DataError
from .formats import describe, field, guess_column, iter_lines, open_table, resolve_column

# (text, text pair) column names, tried in order: GLUE/SNLI (sentence1/2), MRPC, QNLI, MNLI-style, QQP
PAIR_COLUMNS = [
    ("sentence1", "sentence2"), ("#1 String", "#2 String"), ("question", "sentence"),
    ("premise", "hypothesis"), ("question1", "question2"),
]
TEXT_COLUMNS = ["sentence", "text", "content", "review"]
LABEL_COLUMNS = ["label", "gold_label", "Quality", "labels"]
COLA_COLUMNS = (3, None, 1)  # headerless CoLA: source, label, original mark, sentence
NO_LABEL = "-"  # SNLI/MNLI rows without annotator consensus


@dataclass(frozen=True)
class ClassificationData:
    """One split of a (pair) classification set; labels are the raw strings of the file."""

    texts: list[str]
    text_pairs: list[str] | None
    labels: list[str] | None  # None: the file has no label column (e.g. a GLUE test split)
    source: str  # the path read
    text_column: str = ""
    text_pair_column: str | None = None
    label_column: str | None = None
    dropped: int = 0  # rows skipped because their label was "-" (SNLI/MNLI: no gold label)
    columns: tuple[str, ...] = ()  # every column the file has (named when a label column is missing)

    def __post_init__(self) -> None:
        for name in ("text_pairs", "labels"):
            other = getattr(self, name)
            if other is not None and len(other) != len(self.texts):
                raise DataError(f"{name} has {len(other)} entries but texts has {len(self.texts)}")

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class ParallelData:
    """Line-aligned source and target sentences."""

    sources: list[str]
    targets: list[str]
    source: str  # the path(s) read, 'a | b' for two files

    def __post_init__(self) -> None:
        if len(self.sources) != len(self.targets):
            raise DataError(f"sources has {len(self.sources)} lines but targets has {len(self.targets)}")

    def __len__(self) -> int:
        return len(self.sources)


def same_data(a: str | Path, b: str | Path) -> bool:
    """Two data arguments that name the same file (or the same builtin): calibration must not be the
    evaluation data."""
    if str(a) == str(b):
        return True
    pa, pb = Path(a), Path(b)
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise DataError(f"limit={limit!r} must be a positive int (number of examples) or None for all")


def _by_position(*specs: Any) -> bool:
    """All given columns are integer positions: the file is read without a header row (unless header=True)."""
    given = [s for s in specs if s is not None]
    return bool(given) and all(isinstance(s, int) and not isinstance(s, bool) for s in given)


def load_classification(
    path: str | Path,
    *,
    text_column: int | str | None = None,
    text_pair_column: int | str | None = None,
    label_column: int | str | None = None,
    limit: int | None = None,
    encoding: str = "utf-8",
    header: bool | None = None,
    split: str | None = None,
) -> ClassificationData:
    """Read a TSV/CSV/JSONL file (optionally .gz) or a `datasets.save_to_disk` directory.

    Columns are names or integer positions; left out, they are guessed from common names (GLUE, SNLI,
    MRPC, QNLI). `header=None` assumes a header row unless columns are positions or the file has
    CoLA's headerless layout (then text=3, label=1). Rows labelled "-" are dropped (`dropped`).
    `split` picks one split of a saved `DatasetDict`.
    """
    check_limit(limit)
    by_position = _by_position(text_column, text_pair_column, label_column)
    table = open_table(path, encoding=encoding, header=header, by_position=by_position, split=split)
    cola = not table.header and header is None and not by_position  # only CoLA's layout turns the header off
    if cola and text_column is None and text_pair_column is None and label_column is None:
        text_column, text_pair_column, label_column = COLA_COLUMNS
    if text_column is None:
        pair = next(((a, b) for a, b in PAIR_COLUMNS if guess_column(table, [a]) and guess_column(table, [b])), None)
        if pair is not None:
            text_column, text_pair_column = guess_column(table, [pair[0]]), guess_column(table, [pair[1]])
        else:
            text_column = guess_column(table, TEXT_COLUMNS)
        if text_column is None:
            hint = "" if table.header else " (the file has no header row: give integer positions)"
            raise DataError(
                f"cannot guess the text column of {describe(path)}: columns present: {table.columns}{hint}; "
                f"pass text_column= (and text_pair_column=) with one of them; known names: "
                f"{TEXT_COLUMNS + [n for p in PAIR_COLUMNS for n in p]}"
            )
    label_given = label_column is not None
    if label_column is None and table.header:
        label_column = guess_column(table, LABEL_COLUMNS)
    keys = {
        "text_column": resolve_column(table, text_column, "text_column"),
        "text_pair_column": None if text_pair_column is None else resolve_column(
            table, text_pair_column, "text_pair_column"),
        "label_column": None if label_column is None else resolve_column(table, label_column, "label_column"),
    }
    names = {arg: None if key is None else table.columns[table.keys.index(key)] for arg, key in keys.items()}
    texts: list[str] = []
    pairs: list[str] | None = None if keys["text_pair_column"] is None else []
    labels: list[str] | None = None if keys["label_column"] is None else []
    dropped = 0
    for number, record in table.rows:
        if labels is not None:
            label = field(table, number, record, keys["label_column"], names["label_column"])
            if label is None:
                raise DataError(f"file {describe(path)} line {number}: column {names['label_column']!r} is empty")
            label = str(label).strip()
            if label == NO_LABEL:
                dropped += 1
                continue
            labels.append(label)
        texts.append(_text(table, number, record, keys["text_column"], names["text_column"]))
        if pairs is not None:
            pairs.append(_text(table, number, record, keys["text_pair_column"], names["text_pair_column"]))
        if limit is not None and len(texts) >= limit:
            break
    if not texts:
        extra = f" ({dropped} rows dropped for label {NO_LABEL!r})" if dropped else ""
        raise DataError(f"file {describe(path)} holds no examples{extra}")
    if labels is not None and not label_given and all(lb == "-1" for lb in labels):
        labels = None  # datasets' convention for an unlabelled (test) split
    return ClassificationData(
        texts, pairs, labels, str(path), names["text_column"] or "", names["text_pair_column"],
        names["label_column"] if labels is not None else None, dropped, tuple(map(str, table.columns)),
    )


def _text(table: Any, number: int, record: Any, key: int | str, name: str) -> str:
    value = field(table, number, record, key, name)
    if not isinstance(value, str):
        raise DataError(
            f"file {describe(table.path)} line {number}: column {name!r} holds {value!r:.40} "
            f"({type(value).__name__}), expected text"
        )
    return value


def encode_labels(labels: Sequence[str] | None, config_or_label2id: Any, *,
                  num_labels: int | None = None) -> list[int]:
    """Label strings -> ids via a transformers config's `label2id` (case-insensitive) or a mapping.

    A label that is not a name but an integer string ("0", "1") is taken as the id itself and must
    lie in 0..num_labels-1 (`num_labels`, else `config.num_labels`, else the mapping's size). Labels
    that map to nothing are refused together, each named with its count and first row.
    """
    if labels is None:
        raise DataError("labels is None: the data has no label column; pass label_column= when loading")
    if isinstance(config_or_label2id, Mapping):
        label2id, known = dict(config_or_label2id), len(config_or_label2id)
    elif hasattr(config_or_label2id, "label2id") or hasattr(config_or_label2id, "id2label"):
        # transformers 5 may leave label2id None when only id2label was given: use both directions
        id2label = getattr(config_or_label2id, "id2label", None) or {}
        label2id = {**{str(name): int(i) for i, name in id2label.items()},
                    **(getattr(config_or_label2id, "label2id", None) or {})}
        known = int(getattr(config_or_label2id, "num_labels", None) or len(label2id))
    else:
        raise DataError(
            f"config_or_label2id={type(config_or_label2id).__name__} must be a transformers config or a "
            "mapping {label: id}"
        )
    checked = num_labels is not None or not isinstance(config_or_label2id, Mapping)  # a bare mapping sets the ids
    num_labels = known if num_labels is None else num_labels
    lookup = {str(name).lower(): int(i) for name, i in label2id.items()}
    if checked and (wrong := sorted((str(n), i) for n, i in lookup.items() if not 0 <= i < num_labels)):
        raise DataError(f"label2id maps {wrong[0][0]!r} to id {wrong[0][1]}; allowed: ids 0..{num_labels - 1} "
                        f"(num_labels={num_labels})")
    ids, unknown = [], {}  # unknown: label -> [first row, count]
    for row, label in enumerate(labels):
        key = str(label).strip().lower()
        if key in lookup:
            ids.append(lookup[key])
        elif re.fullmatch(r"[+-]?\d+", key) and 0 <= int(key) < num_labels:
            ids.append(int(key))
        else:
            unknown.setdefault(str(label), [row, 0])[1] += 1
    if unknown:
        named = [f"{label!r} at row {row} ({count} row{'s' if count > 1 else ''})"
                 for label, (row, count) in list(unknown.items())[:10]]
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        raise DataError(
            f"unknown label{'s' if len(unknown) > 1 else ''} {', '.join(named)}{more} (rows 0-based); allowed: "
            f"{sorted(label2id)} or integer ids 0..{num_labels - 1}; map labels to ids with label2id={{label: id}}"
        )
    return ids


def load_parallel(
    source_path: str | Path,
    target_path: str | Path | None = None,
    *,
    source_column: int | str | None = None,
    target_column: int | str | None = None,
    limit: int | None = None,
    encoding: str = "utf-8",
    split: str | None = None,
) -> ParallelData:
    """Two line-aligned files (optionally .gz; lines kept as they are, empty ones included), or one
    table (TSV/CSV/JSONL, or a `datasets.save_to_disk` directory: `split` picks one of its splits).
    A table's columns are named or guessed (source/target, src/tgt); a two-column table without
    those names is read as headerless: source 0, target 1.
    """
    check_limit(limit)
    if target_path is None:
        return _parallel_table(source_path, source_column, target_column, limit, encoding, split)
    if source_column is not None or target_column is not None:
        raise DataError("source_column= and target_column= apply to one table file; with target_path= give neither")
    if split is not None:
        raise DataError(f"split={split!r} applies to a datasets directory; with target_path= the data are two "
                        "line-aligned text files")
    counts, kept = [0, 0], ([], [])
    for side, path in enumerate((source_path, target_path)):
        for line in iter_lines(path, encoding):
            if limit is None or counts[side] < limit:
                kept[side].append(line.rstrip("\r\n"))
            counts[side] += 1
    if counts[0] != counts[1]:
        raise DataError(
            f"parallel files differ in length: {describe(source_path)} has {counts[0]} lines, "
            f"{describe(target_path)} has {counts[1]}"
        )
    if counts[0] == 0:
        raise DataError(f"parallel files {describe(source_path)} and {describe(target_path)} are empty")
    return ParallelData(kept[0], kept[1], f"{source_path} | {target_path}")


def _parallel_table(path: str | Path, source_column: Any, target_column: Any, limit: int | None,
                    encoding: str, split: str | None = None) -> ParallelData:
    by_position = _by_position(source_column, target_column)
    table = open_table(path, encoding=encoding, header=None, by_position=by_position, split=split)
    if source_column is None and target_column is None:
        named = guess_column(table, ["source", "src"]), guess_column(table, ["target", "tgt"])
        if all(named):
            source_column, target_column = named
        elif len(table.columns) == 2:  # a bare "source<TAB>target" file: the first row is data
            table = open_table(path, encoding=encoding, header=False, by_position=True, split=split)
            source_column, target_column = 0, 1
        else:
            raise DataError(
                f"cannot tell source and target columns of {describe(path)}: columns present: {table.columns}; "
                "pass source_column= and target_column=, or target_path= for two line-aligned files"
            )
    if source_column is None or target_column is None:
        raise DataError(f"give both source_column= and target_column= (got {source_column!r}, {target_column!r})")
    keys = resolve_column(table, source_column, "source_column"), resolve_column(table, target_column, "target_column")
    sources, targets = [], []
    for number, record in table.rows:
        sources.append(_text(table, number, record, keys[0], str(source_column)))
        targets.append(_text(table, number, record, keys[1], str(target_column)))
        if limit is not None and len(sources) >= limit:
            break
    if not sources:
        raise DataError(f"file {describe(path)} holds no sentence pairs")
    return ParallelData(sources, targets, str(path))


def load_text(
    path: str | Path, *, limit: int | None = None, encoding: str = "utf-8",
    unit: Literal["line", "paragraph"] = "line",
) -> list[str]:
    """Non-empty lines (or blank-line separated paragraphs, lines joined by a space) of a text file."""
    check_limit(limit)
    if unit not in ("line", "paragraph"):
        raise DataError(f"unit={unit!r} must be 'line' or 'paragraph'")
    lines = (line.strip() for line in iter_lines(path, encoding))
    items = _paragraphs(lines) if unit == "paragraph" else (line for line in lines if line)
    out = []
    for item in items:
        out.append(item)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise DataError(f"file {describe(path)} holds no non-empty {unit}s")
    return out


def _paragraphs(lines: Any) -> Any:
    block: list[str] = []
    for line in chain(lines, [""]):
        if line:
            block.append(line)
        elif block:
            yield " ".join(block)
            block = []


def python_docs_text(max_chars: int | None = None) -> list[str]:
    """English prose paragraphs of the Python reference (`pydoc_data.topics`, shipped with CPython).

    Code blocks, grammar rules, headings and short fragments are left out; topics in sorted order.
    `max_chars` stops once the paragraphs reach that many characters in total.
    """
    if max_chars is not None and (isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars <= 0):
        raise DataError(f"max_chars={max_chars!r} must be a positive int or None")
    try:
        from pydoc_data.topics import topics
    except ImportError as err:  # some distributions strip it
        raise DataError("pydoc_data.topics is not available in this Python installation") from err
    out, total = [], 0
    for name in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[name]):
            lines = block.split("\n")
            if any(ln.startswith((" ", "\t")) or re.fullmatch(r"[*=\-~^]{3,}", ln.strip()) for ln in lines):
                continue
            text = " ".join(block.split())
            if len(text.split()) < 8 or not text.endswith(".") or ">>>" in text:
                continue
            out.append(text)
            total += len(text)
            if max_chars is not None and total >= max_chars:
                return out
    return out
