"""File formats behind `headprune.evaluation.data`: open (gzip, encoding), read table rows, resolve columns."""

from __future__ import annotations

import codecs
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


BOMS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xef\xbb\xbf", "utf-8-sig"),
        (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))  # longest first: UTF-32-LE starts like UTF-16-LE


def _is_utf8(encoding: str) -> bool:
    return encoding.lower().replace("-", "").replace("_", "") in ("utf8", "utf8sig")


def _raw(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def file_encoding(path: Path, encoding: str) -> str:
    """The encoding to read ``path`` with: for UTF-8 (the default), a byte-order mark decides (UTF-8 with or
    without one; UTF-16 or UTF-32 by theirs); any other encoding is the caller's."""
    if not _is_utf8(encoding):
        return encoding
    try:
        with _raw(path) as handle:
            start = handle.read(4)
    except (gzip.BadGzipFile, EOFError, zlib.error):
        return "utf-8-sig"  # the text read reports the broken gzip file
    return next((name for bom, name in BOMS if start.startswith(bom)), "utf-8-sig")


def _decode_error(path: Path, encoding: str) -> str:
    """Where ``path`` stops being ``encoding`` (byte offset, line, the byte) and what it looks like instead."""
    decoder = codecs.getincrementaldecoder(encoding)()
    offset, lines, head = 0, 1, b""
    with _raw(path) as handle:
        while block := handle.read(1 << 20):
            head = head or block[:4096]
            try:
                decoder.decode(block)
            except UnicodeDecodeError as err:
                bad = block[err.start]
                lines += block[:err.start].count(b"\n")
                where = f"byte 0x{bad:02x} at offset {offset + err.start}, line {lines}"
                break
            offset, lines = offset + len(block), lines + block.count(b"\n")
        else:
            where = "the file ends inside a character"
    return f"{where}; no byte-order mark){_hint(head)}"


def _hint(head: bytes) -> str:
    """What to pass for a file that is not the encoding read: UTF-16 without its mark when every other byte
    of ``head`` (the file's first bytes) is NUL, else an 8-bit code page as an example."""
    zeros = (head[1::2].count(0), head[0::2].count(0))
    if len(head) >= 4 and max(zeros) > len(head) // 4:  # ASCII text in UTF-16: every other byte NUL
        name = "utf-16-le" if zeros[0] > zeros[1] else "utf-16-be"
        return (f"; it looks like {name.upper()} without a byte-order mark; pass encoding= with the file's encoding, "
                f"e.g. encoding='{name}'")
    return "; pass encoding= with the file's encoding, e.g. encoding='cp1252'"


def _no_nul(path: Path, line: str, number: int) -> str:
    """``line`` of a text file; a NUL character (never in text: UTF-16 read as UTF-8) is refused."""
    if "\x00" in line:
        with _raw(path) as handle:
            head = handle.read(4096)
        raise DataError(f"file {describe(path)} line {number} holds NUL bytes, so it is not UTF-8 text{_hint(head)}")
    return line


def iter_lines(path: str | Path, encoding: str = "utf-8") -> Iterator[str]:
    """Lines of a text file (gzip if the name ends in .gz), newlines kept; read errors -> DataError. UTF-8 is
    read with or without a byte-order mark, and a UTF-16 or UTF-32 file by its mark (:func:`file_encoding`)."""
    path = check_file(path)
    if path.is_dir():
        raise DataError(f"{describe(path)} is a directory; expected a text file")
    try:
        codecs.lookup(encoding)
    except LookupError as err:
        raise DataError(f"encoding={encoding!r} is not a known text encoding (e.g. 'utf-8', 'latin-1')") from err
    used = file_encoding(path, encoding)
    if path.suffix == ".gz":
        handle = gzip.open(path, "rt", encoding=used, newline="")
    else:
        handle = open(path, encoding=used, newline="")
    with handle:
        try:
            for number, line in enumerate(handle, start=1):
                yield _no_nul(path, line, number) if _is_utf8(used) else line
        except UnicodeDecodeError as err:
            name = "UTF-8" if _is_utf8(used) else used
            raise DataError(f"file {describe(path)} is not valid {name} text ({err.reason}: "
                            f"{_decode_error(path, used)}") from err
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


FIELD_LIMIT = 2**31 - 1  # csv's own default (131,072 characters) refuses long but valid fields


def _tab_rows(path: Path, encoding: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of a TSV: one line one row, tab-separated, quote characters kept as they are
    (GLUE's files hold unbalanced quotes, MRPC) and fields of any length."""
    for number, line in enumerate(iter_lines(path, encoding), start=1):
        row = line.rstrip("\r\n").split("\t")
        if any(f.strip() for f in row):  # blank lines carry no example
            yield number, row


def _csv_rows(path: Path, encoding: str) -> Iterator[tuple[int, list[str]]]:
    """(line number where the row starts, fields) of a CSV. A quoted field may hold line breaks; one whose
    quote never closes is refused at the line it opens, not blamed on a later line that looks short."""
    reader = csv.reader(iter_lines(path, encoding))
    width = None
    while True:
        start = reader.line_num + 1
        limit = csv.field_size_limit(FIELD_LIMIT)  # raised only while csv reads a row: no process-wide change
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise DataError(f"file {describe(path)} line {start}: malformed row ({err})") from err
        finally:
            csv.field_size_limit(limit)
        if not (row and any(f.strip() for f in row)):
            continue
        width = len(row) if width is None else width
        spans = reader.line_num > start and any("\n" in f or "\r" in f for f in row)
        if spans and (len(row) != width or row[-1].endswith(("\n", "\r"))):
            raise DataError(f"file {describe(path)} line {start}: a quoted field opens on this line and its quote is "
                            f"not closed (the row runs to line {reader.line_num} with {len(row)} fields instead of "
                            f"{width}); close the quote, or write a quote inside a quoted field as \"\"")
        yield start, row


_COLA_MARK = re.compile(r"^[*?#]*$")


def looks_like_cola(rows: list[list[str]]) -> bool:
    """CoLA's headerless layout: source, label 0/1, original mark ('', '*', '?', ...), sentence."""
    return bool(rows) and all(
        len(r) == 4 and r[1] in ("0", "1") and _COLA_MARK.match(r[2]) and r[3].strip() for r in rows
    )


def read_delimited(path: Path, fmt: str, *, encoding: str, header: bool | None, by_position: bool) -> Table:
    rows = _tab_rows(path, encoding) if fmt == "tsv" else _csv_rows(path, encoding)
    peek = list(islice(rows, 5))  # [(line number, fields)]
    if not peek:
        raise DataError(f"file {describe(path)} is empty")
    if header is None:
        header = not by_position and not looks_like_cola([r for _, r in peek])
    width = len(peek[0][1])
    columns = [c.strip() for c in peek[0][1]] if header else [str(i) for i in range(width)]
    repeated = next((c for i, c in enumerate(columns) if c and c in columns[:i]), None)
    if repeated is not None:
        where = [i for i, c in enumerate(columns) if c == repeated]
        raise DataError(f"file {describe(path)} line {peek[0][0]}: the header names column {repeated!r} twice "
                        f"(positions {', '.join(map(str, where))}); allowed: one column per name (rename one)")
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
