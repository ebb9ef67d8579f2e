"""Argument checks shared by every stage: one message shape, ``name=value; allowed: ...``.

Settings dataclasses call these in ``__post_init__``; library functions call them before they change
anything. Each raises :class:`~headprune.errors.ConfigError` (a typed error, never ``assert``).
"""

from __future__ import annotations

import math
from typing import Any

from .errors import ConfigError


def is_int(value: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_int(name: str, value: Any, minimum: int, *, optional: bool = False) -> None:
    """``value`` is an integer >= ``minimum`` (or None when ``optional``)."""
    if optional and value is None:
        return
    if not is_int(value) or value < minimum:
        allowed = f"{'None or ' if optional else ''}an integer >= {minimum}"
        raise ConfigError(f"{name}={value!r}; allowed: {allowed}")


def check_share(name: str, value: Any, *, optional: bool = False, one: bool = True) -> None:
    """``value`` is a number in [0, 1] (``one=False``: [0, 1)), or None when ``optional``."""
    if optional and value is None:
        return
    if not is_number(value) or not 0.0 <= value <= 1.0 or (not one and value == 1.0):
        allowed = f"{'None or ' if optional else ''}a number 0.0..1.0{'' if one else ' (1 excluded)'}"
        raise ConfigError(f"{name}={value!r}; allowed: {allowed}")


def check_number(name: str, value: Any, *, low: float | None = None, strict: bool = False,
                 optional: bool = False) -> None:
    """``value`` is a finite number, ``>= low`` (``> low`` when ``strict``), or None when ``optional``."""
    if optional and value is None:
        return
    ok = is_number(value) and (low is None or (value > low if strict else value >= low))
    if not ok:
        bound = "" if low is None else f" {'>' if strict else '>='} {low:g}"
        raise ConfigError(f"{name}={value!r}; allowed: {'None or ' if optional else ''}a finite number{bound}")


def check_choice(name: str, value: Any, allowed: tuple) -> None:
    """``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(f"{name}={value!r}; allowed: {', '.join(map(str, allowed))}")
