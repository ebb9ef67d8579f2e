"""Data as users hold it: ``--split`` of a datasets directory, ``--label-map`` for string labels, and the
library's data errors in the CLI's terms.

The library names its arguments (``text_column=``, ``split=``, ``label2id=``); a message on the command
line names the flag a user types (``--text-column``, ``--split`` or ``--calib-split``, ``--label-map``).
:func:`cli_terms` rewrites the one into the other, for the data set a flag such as ``--calib-data`` reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from ..errors import ConfigError, DataError, MaskError, PlanError, SiteError

# a data flag -> the flags of its split, its example limit and its target file (translation)
DATA_FLAGS = {
    "--data": {"split": "--split", "limit": "--limit", "target_path": "--data2"},
    "--calib-data": {"split": "--calib-split", "limit": "--calib-limit", "target_path": "--calib-data2"},
    "--choose-data": {"split": "--choose-split", "limit": "--calib-limit", "target_path": "--choose-data2"},
    "--val-data": {"split": "--val-split", "limit": "--val-limit", "target_path": "--val-data2"},
    "--data-b": {"split": "--split-b", "limit": "--limit", "target_path": "--data2-b"},
    "--eval-data": {"split": "--eval-split", "limit": "--eval-limit", "target_path": "--eval-data2"},
}
# library argument -> flag, the same for every data set
ARGUMENT_FLAGS = {"text_column": "--text-column", "text_pair_column": "--text-pair-column",
                  "label_column": "--label-column", "source_column": "--source-column",
                  "target_column": "--target-column", "label2id": "--label-map", "metric": "--metric",
                  "batch_size": "--batch-size", "max_length": "--max-length", "num_beams": "--beams",
                  "max_new_tokens": "--max-new-tokens", "block_size": "--block-size",
                  "n_resamples": "--resamples", "alpha": "--alpha", "min_per_site": "--min-per-site",
                  "seq_len": "--seq-len", "tgt_len": "--tgt-len", "n_keep": "--n-keep", "share": "--share",
                  "damping": "--damping", "target": "--target", "gqa": "--gqa", "price": "--price", "units": "--units"}
# whole library phrases whose CLI form is not a flag name
PHRASES = (
    ("label2id={label: id}", "--label-map LABEL=ID,... (e.g. negative=0,positive=1)"),
    ("or None for all", "or left out for all"),
    ("allowed: None or ", "allowed: "),  # a flag that is given has a value
    ("(or pass val_batches)", "(or pass --val-data, or a smaller --batch-size)"),
    ("pass encoding= with the file's encoding, e.g. encoding='utf-16-le'",
     "convert it to UTF-8 first (iconv -f utf-16le -t utf-8)"),
    ("pass encoding= with the file's encoding, e.g. encoding='utf-16-be'",
     "convert it to UTF-8 first (iconv -f utf-16be -t utf-8)"),
    ("pass encoding= with the file's encoding, e.g. encoding='cp1252'",
     "convert it to UTF-8 first from its encoding (e.g. iconv -f cp1252 -t utf-8 for Windows Western text)"),
)
LABEL_MAP_HELP = ("Classification: the data's labels as the model's label ids, LABEL=ID pairs, e.g. "
                  "negative=0,positive=1 (an ID may be one of the model's label names; default: labels are matched "
                  "to the model's id2label/label2id, integer labels are ids).")
LABEL_MAP = typer.Option(None, "--label-map", help=LABEL_MAP_HELP)


def cli_terms(message: str, flag: str = "--data") -> str:
    """``message`` with the library's argument names (``text_column=``, ``split='dev'``) as the flags of the
    data set read through ``flag`` (``--text-column``, ``--split 'dev'``; for ``--calib-data``: ``--calib-split``)."""
    for phrase, cli in PHRASES:
        message = message.replace(phrase, cli)
    names = {**ARGUMENT_FLAGS, **DATA_FLAGS[flag]}
    alternatives = "|".join(sorted(names, key=len, reverse=True))
    message = re.sub(rf"\b({alternatives})=(?=[\s,;)]|$)", lambda m: names[m[1]], message)  # "pass split= ..."
    return re.sub(rf"\b({alternatives})=", lambda m: names[m[1]] + " ", message)  # "split='dev' is not ..."


@contextmanager
def in_cli_terms(flag: str = "--data") -> Iterator[None]:
    """Data and setting errors raised inside the block are re-raised in the CLI's terms (:func:`cli_terms`)."""
    try:
        yield
    except (DataError, ConfigError) as err:
        raise type(err)(cli_terms(str(err), flag)) from err


@contextmanager
def argument_as_flag(argument: str, flag: str) -> Iterator[None]:
    """A head-list error raised inside the block that names the library's ``argument`` (``heads: unknown site``,
    ``dropped['encoder.0.self']: head index 12 out of range``) is re-raised naming ``flag`` (``--heads-off``)."""
    try:
        yield
    except (SiteError, MaskError, PlanError) as err:
        text = str(err)
        if not re.match(rf"{re.escape(argument)}[:\[]", text):
            raise
        raise type(err)(flag + text[len(argument):]) from err


def split_option(flag: str, without: str = ""):
    """The ``--...split`` flag of the data set read through ``flag`` (``--data``, ``--calib-data``, ...)."""
    name = DATA_FLAGS[flag]["split"]
    return typer.Option(None, name, help=f"Split of {flag} when it is a datasets save_to_disk directory (default: its "
                        f"only split; required when it has several){without}.")


def parse_label_map(value: str | None, config=None) -> dict[str, int] | None:
    """``--label-map negative=0,positive=1`` as ``{data label: model id}``; None when not given.

    An ID is an integer or, given the model's ``config``, one of its label names (``id2label``, any case);
    with a config every ID must lie in 0..num_labels-1. Two IDs for one label (any case) are refused.
    """
    if value is None:
        return None
    id2label = (getattr(config, "id2label", None) or {}) if config is not None else {}
    names = {str(name).lower(): int(i) for i, name in id2label.items()}
    num_labels = int(getattr(config, "num_labels", 0) or 0) if config is not None else 0
    allowed = "comma-separated LABEL=ID pairs, e.g. negative=0,positive=1"
    out: dict[str, int] = {}
    for item in (part.strip() for part in value.split(",")):
        label, sep, target = (s.strip() for s in item.rpartition("="))
        if not sep or not label or not target:
            raise ConfigError(f"--label-map {value!r}: {item!r} is not LABEL=ID; allowed: {allowed}")
        if re.fullmatch(r"\d+", target):
            index = int(target)
        elif target.lower() in names:
            index = names[target.lower()]
        else:
            known = f" or one of the model's labels {sorted(id2label.values())}" if names else ""
            raise ConfigError(f"--label-map {value!r}: ID {target!r} of {label!r} is not an integer id{known}")
        if num_labels and index >= num_labels:
            raise ConfigError(f"--label-map {value!r}: {label!r} maps to id {index}, but the model has "
                              f"num_labels={num_labels}; allowed: ids 0..{num_labels - 1}")
        twin = next((k for k in out if k.lower() == label.lower()), None)
        if twin is not None and out[twin] != index:
            raise ConfigError(f"--label-map {value!r}: {label!r} maps to both {out[twin]} and {index}; allowed: one "
                              "ID per label")
        out[label] = index
    return out
