"""Progress of long stages on stderr: one mechanism for every pass that shows it (issue 47).

Where a bar can be drawn (stderr is a terminal, or a notebook where tqdm draws a widget) a stage is a tqdm bar.
Anywhere else (a file under ``nohup``, a pipe, a CI log, a notebook cell running the command line) a bar
prints nothing useful, so a stage is plain lines instead, as pip and transformers write into logs::

    headprune: importance: 0/120 batches, 00:00 elapsed     (the stage starts)
    headprune: importance: 41/120 batches, 00:30 elapsed    (at most one every INTERVAL seconds)
    headprune: importance: 120/120 batches, 01:27 elapsed   (the stage ends)

A step without a count (``loading ...``) is one :func:`note` line where a bar would be drawn. ``show=False`` (a
function's ``progress=False``, the command line's ``--quiet``) prints none of these.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sized

from tqdm.auto import tqdm

INTERVAL = 30.0  # seconds: at most one line this often within a stage, when no bar can be drawn
clock = time.monotonic  # read on every update (tests replace it with a fake clock)
NOTEBOOK = any(c.__module__ == "tqdm.notebook" for c in tqdm.__mro__)  # tqdm.auto draws widgets in this kernel


def note(message: str, show: bool = True) -> None:
    """One line ``headprune: message`` on stderr for a step without a count (loading, saving), where a bar would
    be drawn; into a log or a pipe nothing, so a command refused after it started still writes its one-line
    error alone (its long passes print their own plain lines there)."""
    if show and drawn(sys.stderr):
        print(f"headprune: {message}", file=sys.stderr, flush=True)


def progress_bar(iterable: Iterable | None = None, *, desc: str, unit: str, total: int | None = None,
                 show: bool = True, leave: bool = True):
    """Progress of one stage over ``iterable`` (or ``total`` steps counted with ``update()``): a tqdm bar where one
    can be drawn, :class:`Lines` elsewhere, nothing when ``show`` is False. Iterate it, or call ``update()`` and
    ``close()`` (or use it as a context manager); ``set_postfix(key=value)`` adds values to the bar or line."""
    if not show:
        return tqdm(iterable, total=total, disable=True)
    if drawn(sys.stderr):
        return tqdm(iterable, desc=desc, unit=unit, total=total, leave=leave)
    return Lines(iterable, desc=desc, unit=unit, total=total)


def drawn(stream) -> bool:
    """Whether a bar can be drawn: ``stream`` is a terminal, or tqdm draws widgets (a notebook kernel)."""
    isatty = getattr(stream, "isatty", None)
    return NOTEBOOK or bool(isatty and isatty())


class Lines:
    """A stage as plain lines on stderr: one when it starts, at most one every :data:`INTERVAL` seconds while it
    runs (written by the update that finds the interval passed) and one when it ends (``close()``, or the end
    of the iteration); each says what, n/total and the time elapsed."""

    def __init__(self, iterable: Iterable | None = None, *, desc: str, unit: str, total: int | None = None):
        if total is None and isinstance(iterable, Sized):
            total = len(iterable)
        self.iterable, self.desc, self.unit, self.total = iterable, desc, unit, total
        self.n, self.postfix, self.closed = 0, "", False
        self.started = self.last = clock()
        self.written = self._write(self.started)

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable if self.iterable is not None else ():
                yield item
                self.update()
        finally:
            self.close()

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = clock()
        if now - self.last >= INTERVAL:
            self.written = self._write(now)

    def set_postfix(self, refresh: bool = True, **values) -> None:
        """Values shown after the count (``loss=0.4123``), as tqdm's ``set_postfix``."""
        self.postfix = "".join(f", {k}={v}" for k, v in values.items())

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.written != self.n:  # the end, unless the last line already said it
                self._write(clock())

    def _write(self, now: float) -> int:
        units = self.unit if self.total == 1 else _plural(self.unit)
        count = f"{self.n} {units}" if self.total is None else f"{self.n}/{self.total} {units}"
        elapsed = tqdm.format_interval(now - self.started)
        print(f"headprune: {self.desc}: {count}, {elapsed} elapsed{self.postfix}", file=sys.stderr, flush=True)
        self.last = now
        return self.n


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith(("s", "sh", "ch", "x")) else "s")
