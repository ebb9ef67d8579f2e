"""Argument checks shared by the trainers: settings fields (in `__post_init__`), texts, `stop_after_epoch`.

Messages name the field, the allowed values and the value given; they raise ConfigError or DataError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..errors import ConfigError, DataError


def _check(obj: Any, name: str, ok: bool, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{type(obj).__name__}.{name} must be {allowed}, got {getattr(obj, name)!r}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _ints(obj: Any, names: Sequence[str], lo: int, *, none_ok: bool = False) -> None:
    for n in names:
        v = getattr(obj, n)
        _check(obj, n, (none_ok and v is None) or (_is_int(v) and v >= lo),
               f"{'None or ' if none_ok else ''}an int >= {lo}")


def _fractions(obj: Any, names: Sequence[str], *, one_ok: bool = False) -> None:
    for n in names:
        v = getattr(obj, n)
        ok = _is_num(v) and 0 <= v and (v <= 1 if one_ok else v < 1)
        _check(obj, n, ok, "a number in [0, 1]" if one_ok else "a number in [0, 1)")


def _check_common(s: Any) -> None:
    _ints(s, ("epochs", "eval_batch_size", "sort_chunk"), 1)
    _ints(s, ("max_length",), 2)
    _ints(s, ("seed",), 0)
    _check(s, "lr", _is_num(s.lr) and s.lr > 0, "a number > 0")
    _check(s, "adam_eps", _is_num(s.adam_eps) and s.adam_eps > 0, "a number > 0")
    _check(s, "weight_decay", _is_num(s.weight_decay) and s.weight_decay >= 0, "a number >= 0")
    g = s.max_grad_norm
    _check(s, "max_grad_norm", g is None or (_is_num(g) and g > 0), "None (no clipping) or a number > 0")
    b = s.adam_betas
    ok = isinstance(b, (tuple, list)) and len(b) == 2 and all(_is_num(x) and 0 <= x < 1 for x in b)
    _check(s, "adam_betas", ok, "two numbers in [0, 1)")
    s.adam_betas = (float(b[0]), float(b[1]))
    _check(s, "progress", isinstance(s.progress, bool), "a bool")


def _check_texts(name: str, texts: Any, n: int | None = None) -> list[str]:
    if not isinstance(texts, (list, tuple)):
        raise DataError(f"{name} must be a list of str, got {type(texts).__name__}")
    if n is not None and len(texts) != n:
        raise DataError(f"{name} must have {n} items (one per text), got {len(texts)}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise DataError(f"{name}[{i}] must be a str, got {type(t).__name__}")
    return list(texts)


def _check_stop(stop_after_epoch: int | None) -> None:
    if stop_after_epoch is not None and not (_is_int(stop_after_epoch) and stop_after_epoch >= 1):
        raise ConfigError(f"stop_after_epoch must be None or an int >= 1, got {stop_after_epoch!r}")
