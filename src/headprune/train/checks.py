"""Argument checks shared by the trainers: settings fields (in `__post_init__`), texts, `stop_after_epoch`.

Messages name the field, the allowed values and the value given; they raise ConfigError or DataError.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..checks import check_int, check_share, is_int, is_number
from ..errors import ConfigError, DataError


def check_setting(obj: Any, name: str, ok: bool, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{type(obj).__name__}.{name}={getattr(obj, name)!r}; allowed: {allowed}")


def check_ints(obj: Any, names: Sequence[str], lo: int, *, none_ok: bool = False) -> None:
    for n in names:
        check_int(f"{type(obj).__name__}.{n}", getattr(obj, n), lo, optional=none_ok)


def check_fractions(obj: Any, names: Sequence[str], *, one_ok: bool = False) -> None:
    for n in names:
        check_share(f"{type(obj).__name__}.{n}", getattr(obj, n), one=one_ok)


def check_common(s: Any) -> None:
    check_ints(s, ("epochs", "eval_batch_size", "sort_chunk"), 1)
    check_ints(s, ("max_length",), 2)
    check_ints(s, ("seed",), 0)
    check_setting(s, "lr", is_number(s.lr) and s.lr > 0, "a number > 0")
    check_setting(s, "adam_eps", is_number(s.adam_eps) and s.adam_eps > 0, "a number > 0")
    check_setting(s, "weight_decay", is_number(s.weight_decay) and s.weight_decay >= 0, "a number >= 0")
    g = s.max_grad_norm
    check_setting(s, "max_grad_norm", g is None or (is_number(g) and g > 0), "None (no clipping) or a number > 0")
    b = s.adam_betas
    ok = isinstance(b, (tuple, list)) and len(b) == 2 and all(is_number(x) and 0 <= x < 1 for x in b)
    check_setting(s, "adam_betas", ok, "two numbers in [0, 1)")
    s.adam_betas = (float(b[0]), float(b[1]))
    check_setting(s, "progress", isinstance(s.progress, bool), "a bool")


def check_texts(name: str, texts: Any, n: int | None = None) -> list[str]:
    if not isinstance(texts, (list, tuple)):
        raise DataError(f"{name} must be a list of str, got {type(texts).__name__}")
    if n is not None and len(texts) != n:
        raise DataError(f"{name} must have {n} items (one per text), got {len(texts)}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise DataError(f"{name}[{i}] must be a str, got {type(t).__name__}")
    return list(texts)


def check_stop(stop_after_epoch: int | None) -> None:
    if stop_after_epoch is not None and not (is_int(stop_after_epoch) and stop_after_epoch >= 1):
        raise ConfigError(f"stop_after_epoch must be None or an int >= 1, got {stop_after_epoch!r}")
