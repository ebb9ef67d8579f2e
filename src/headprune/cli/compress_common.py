"""What both branches of ``headprune compress`` (heads; heads and neurons) check and record the same way."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError
from .identity import identity
from .options import check_calib_limit

DEFAULT_SEQ_LEN = 128


def check_inputs(*, output: Path, data: str, calib_data, calib_data2, calib_split, split, allow_same_data: bool,
                 calib_limit, bench_batch: int, bench_repeats: int, no_bench: bool, more: tuple = ()) -> tuple:
    """Refuse, before any work, what compress cannot use; returns (calibration data, its split): ``--data``
    and ``--split`` without ``--calib-data``."""
    from ..evaluation.data import same_data

    if output.exists():
        raise ConfigError(f"--output {str(output)!r} already exists; choose a new directory")
    calib = calib_data or data
    calib_split = split if calib_split is None and calib_data is None else calib_split
    if same_data(data, calib) and calib_split == split and not allow_same_data:
        raise ConfigError(f"--calib-data {calib!r} is the evaluation data --data; calibrating on it overstates the "
                          "result; allowed: a disjoint file or split (e.g. a train split; --calib-split for a datasets "
                          "directory), or --allow-same-data")
    if calib_data2 is not None and calib_data is None:
        raise ConfigError("--calib-data2 needs --calib-data")
    check_calib_limit(calib_limit)
    if not no_bench and (bench_batch < 1 or bench_repeats < 1):
        raise ConfigError(f"--bench-batch {bench_batch} --bench-repeats {bench_repeats}; allowed: integers >= 1")
    for path in [p for p in (data, calib, *more) if p is not None and not str(p).startswith("builtin:")]:
        if not Path(path).exists():
            raise ConfigError(f"data file {path!r} does not exist")
    return calib, calib_split


def with_seq_len(settings, seq_len, model):
    """``settings`` with the default sequence length when ``--seq-len`` was not given: 128 tokens, or what the
    model's position table allows (``--limit`` stays the examples' count)."""
    from ..evaluation.build import position_limit

    if seq_len is not None:
        return settings
    positions = position_limit(model.config)
    return replace(settings, seq_len=min(DEFAULT_SEQ_LEN, positions or DEFAULT_SEQ_LEN))


def signature(*, model_dir, task, data, data2, calib, calib_data, calib_data2, calib_split, calib_limit, flags, ev,
              calib_ev, files: dict | None = None) -> dict:
    """The run's identity: data and calibration data (names, sizes, contents' hashes), model and every task flag."""
    return {"model": str(model_dir), "task": task, "data": [data] + ([str(data2)] if data2 else []),
            "split": Path(data).name, "n": len(ev),
            **{k: v for k, v in (("data_split", flags.split), ("calib_split", calib_split)) if v},
            "calib_data": [calib] + ([str(calib_data2 or data2)] if (calib_data2 or data2) else []),
            "calib_n": len(calib_ev), "calib_limit": calib_limit,
            **identity(flags, ev, model_dir, {"--data": data, "--data2": data2, "--calib-data": calib_data,
                                              "--calib-data2": calib_data2, **(files or {})})}
