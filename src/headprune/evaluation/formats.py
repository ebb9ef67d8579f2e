"""File formats behind `headprune.evaluation.data`: open (gzip, encoding), read table rows, resolve columns."""

from __future__ import annotations

import csv
import gzip
import json
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path
from typing import Any

from ..errors import DataError

# suffix (after stripping .gz) -> table format; .txt is the MSRP corpus's own TSV suffix
TABLE_SUFFIXES = {".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
Key = int | str  # a position in a delimited row, or a key of a JSON/datasets record


@dataclass
class Table:
    """Rows of one file. `rows` yields (line or row number, record); a record is a list or a dict."""

    path: str
    columns: list[str]  # names; a headerless file gets "0", "1", ...
    keys: list[Key]  # how to index a record for each column
    header: bool
    rows: Iterator[tuple[int, Any]]


def describe(path: str | Path) -> str:
    return f"'{path}'"


def check_file(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise DataError(f"file {describe(path)} does not exist")
    return path


def _utf8_sig(encoding: str) -> str:
    # GLUE's MRPC files start with a byte-order mark; 'utf-8-sig' drops it and reads plain UTF-8 alike
    return "utf-8-sig" if encoding.lower().replace("-", "").replace("_", "") == "utf8" else encoding


def iter_lines(path: str | Path, encoding: str = "utf-8") -> Iterator[str]:
    """Lines of a text file (gzip if the name ends in .gz), newlines kept; read errors -> DataError."""
    path = check_file(path)
    if path.is_dir():
        raise DataError(f"{describe(path)} is a directory; expected a text file")
    try:
        if path.suffix == ".gz":
            handle = gzip.open(path, "rt", encoding=_utf8_sig(encoding), newline="")
        else:
            handle = open(path, encoding=_utf8_sig(encoding), newline="")
    except LookupError as err:
        raise DataError(f"encoding={encoding!r} is not a known text encoding (e.g. 'utf-8', 'latin-1')") from err
    with handle:
        try:
            yield from handle
        except UnicodeDecodeError as err:
            raise DataError(
                f"file {describe(path)} is not valid {encoding} text ({err.reason} at byte {err.start}); "
                "pass encoding= with the file's encoding, e.g. encoding='latin-1'"
            ) from err
        except (gzip.BadGzipFile, EOFError, zlib.error) as err:
            raise DataError(f"file {describe(path)} ends in .gz but is not a readable gzip file: {err}") from err


def table_format(path: Path) -> str:
    """'tsv', 'csv', 'jsonl' or 'datasets' (a directory written by `datasets.save_to_disk`)."""
    if path.is_dir():
        markers = ("dataset_info.json", "dataset_dict.json", "state.json")
        if not any((path / name).exists() for name in markers):
            raise DataError(
                f"directory {describe(path)} is not a Hugging Face datasets directory "
                f"(none of {', '.join(markers)} found); give a .tsv, .csv or .jsonl file or a save_to_disk directory"
            )
        return "datasets"
    suffix = path.suffixes[-2] if path.suffix == ".gz" and len(path.suffixes) > 1 else path.suffix
    if suffix.lower() not in TABLE_SUFFIXES:
        allowed = ", ".join(sorted({*TABLE_SUFFIXES, *(s + ".gz" for s in TABLE_SUFFIXES)}))
        raise DataError(
            f"file {describe(path)} has unsupported suffix {''.join(path.suffixes) or '(none)'!r}; "
            f"allowed: {allowed}, or a datasets save_to_disk directory"
        )
    return TABLE_SUFFIXES[suffix.lower()]


def _numbered(reader: Any, path: Path) -> Iterator[tuple[int, list[str]]]:
    try:
        for row in reader:
            if row and any(field.strip() for field in row):  # blank lines carry no example
                yield reader.line_num, row
    except csv.Error as err:
        raise DataError(f"file {describe(path)} line {reader.line_num}: malformed row ({err})") from err


_COLA_MARK = re.compile(r"^[*?#]*$")


def looks_like_cola(rows: list[list[str]]) -> bool:
    """CoLA's headerless layout: source, label 0/1, original mark ('', '*', '?', ...), sentence."""
    return bool(rows) and all(
        len(r) == 4 and r[1] in ("0", "1") and _COLA_MARK.match(r[2]) and r[3].strip() for r in rows
    )


def read_delimited(path: Path, fmt: str, *, encoding: str, header: bool | None, by_position: bool) -> Table:
    if fmt == "tsv":  # GLUE TSVs hold unbalanced quote characters (MRPC): never treat quotes specially
        reader = csv.reader(iter_lines(path, encoding), delimiter="\t", quoting=csv.QUOTE_NONE)
    else:
        reader = csv.reader(iter_lines(path, encoding))
    rows = _numbered(reader, path)
    peek = list(islice(rows, 5))  # [(line number, fields)]
    if not peek:
        raise DataError(f"file {describe(path)} is empty")
    if header is None:
        header = not by_position and not looks_like_cola([r for _, r in peek])
    width = len(peek[0][1])
    columns = [c.strip() for c in peek[0][1]] if header else [str(i) for i in range(width)]
    head_rows = peek[1:] if header else peek
    return Table(str(path), columns, list(range(width)), header, chain(head_rows, rows))


def read_jsonl(path: Path, *, encoding: str) -> Table:
    lines = iter_lines(path, encoding)
    first = next((ln for ln in lines if ln.strip()), None)
    if first is None:
        raise DataError(f"file {describe(path)} is empty")
    if first.lstrip().startswith("["):  # a .json file holding one array of records
        text = first + "".join(lines)
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"file {describe(path)}: invalid JSON at line {err.lineno}: {err.msg}") from err
        numbered: Iterator[tuple[int, Any]] = iter(enumerate(records, start=1))
    else:
        numbered = _json_lines(path, chain([first], lines))
    head = next(numbered, None)
    if head is None:
        raise DataError(f"file {describe(path)} holds no records")
    if not isinstance(head[1], dict):
        raise DataError(f"file {describe(path)} record {head[0]}: expected a JSON object, got {head[1]!r:.60}")
    columns = list(head[1])
    return Table(str(path), columns, list(columns), True, chain([head], numbered))


def _json_lines(path: Path, lines: Iterable[str]) -> Iterator[tuple[int, Any]]:
    number = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"file {describe(path)} line {number}: invalid JSON ({err.msg}): {line.strip()!r:.80}") from err


def read_datasets_dir(path: Path, *, split: str | None) -> Table:
    try:
        import datasets  # optional: only needed for save_to_disk directories
    except ImportError as err:
        raise DataError(
            f"{describe(path)} is a Hugging Face datasets directory, but the 'datasets' package is not installed; "
            "pip install datasets, or export the data to .jsonl/.tsv"
        ) from err
    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        splits = list(data)
        if split is None and len(splits) == 1:
            split = splits[0]
        if split is None:
            raise DataError(f"{describe(path)} holds several splits ({', '.join(splits)}); pass split= with one "
                            "of them")
        if split not in data:
            raise DataError(f"split={split!r} is not in {describe(path)}; splits present: {', '.join(splits)}")
        data = data[split]
    elif split is not None:
        raise DataError(f"split={split!r} given, but {describe(path)} is a single dataset without splits")
    columns = list(data.column_names)
    class_labels = {
        name: feature for name, feature in data.features.items() if isinstance(feature, datasets.ClassLabel)
    }
    rows = (
        (i, {k: (str(v) if k in class_labels else v) for k, v in record.items()})
        for i, record in enumerate(data, start=1)
    )
    return Table(str(path), columns, list(columns), True, rows)


def open_table(
    path: str | Path, *, encoding: str = "utf-8", header: bool | None = None, by_position: bool = False,
    split: str | None = None,
) -> Table:
    """Open a classification/parallel table; `by_position`: columns were given as integer indices."""
    path = check_file(path)
    fmt = table_format(path)
    if fmt == "datasets":
        return read_datasets_dir(path, split=split)
    if split is not None:
        raise DataError(f"split={split!r} only applies to a datasets directory, not to file {describe(path)}")
    if fmt == "jsonl":
        return read_jsonl(path, encoding=encoding)
    return read_delimited(path, fmt, encoding=encoding, header=header, by_position=by_position)


def resolve_column(table: Table, spec: int | str, arg: str) -> Key:
    """The record key of column `spec` (a name, case-insensitive if unique, or a position)."""
    if isinstance(spec, bool) or not isinstance(spec, int | str):
        raise DataError(f"{arg}={spec!r} must be a column name (str) or position (int)")
    if isinstance(spec, int):
        if not 0 <= spec < len(table.columns):
            raise DataError(
                f"{arg}={spec} is out of range for {describe(table.path)}: it has {len(table.columns)} columns "
                f"(positions 0..{len(table.columns) - 1}: {table.columns})"
            )
        return table.keys[spec]
    if not table.header:
        raise DataError(
            f"{arg}={spec!r} names a column, but {describe(table.path)} has no header row; "
            f"give an integer position 0..{len(table.columns) - 1}"
        )
    matches = [i for i, c in enumerate(table.columns) if c == spec] or [
        i for i, c in enumerate(table.columns) if c.lower() == spec.lower()
    ]
    if len(matches) != 1:
        raise DataError(f"{arg}={spec!r}: no such column in {describe(table.path)}; columns present: {table.columns}")
    return table.keys[matches[0]]


def guess_column(table: Table, candidates: Iterable[str]) -> str | None:
    lower = {c.lower(): c for c in table.columns}
    return next((lower[c.lower()] for c in candidates if c.lower() in lower), None)


def field(table: Table, number: int, record: Any, key: Key, name: str) -> Any:
    """record[key], or a DataError naming the line and column when the row is short or the key absent."""
    try:
        return record[key]
    except (IndexError, KeyError, TypeError) as err:
        if isinstance(record, dict):
            what = f"keys {list(record)[:10]}"
        elif isinstance(key, str):  # a JSON record that is not an object
            what = f"a {type(record).__name__}, not an object"
        else:
            what = f"{len(record)} fields"
        raise DataError(
            f"file {describe(table.path)} line {number}: no column {name!r} (row has {what}); "
            f"columns: {table.columns}"
        ) from err
