"""What tests/test_isolation.py runs in child processes: module-level functions (a child finds them by name) that
import nothing heavy, so a child starts in a fraction of a second."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np

from headprune.errors import ConfigError


def die_by(signum: int) -> None:
    os.kill(os.getpid(), signum)


def exit_hard(status: int) -> None:
    os._exit(status)


def echo(array: np.ndarray, number: float) -> tuple[np.ndarray, float, int]:
    return array, number, os.getpid()


def imported(name: str) -> bool:
    return name in sys.modules


def lock():
    return threading.Lock()


class Stubborn(Exception):
    def __init__(self, text: str, *, why: str):
        super().__init__(text)
        self.why = why


def stubborn() -> None:
    raise Stubborn("no way back", why="keyword-only")


def refuse(value: int) -> None:
    raise ConfigError(f"value={value!r}; allowed: nothing")


def write_then_die(source: str, output: str, quant: str, n_threads: int) -> int:
    Path(output).write_bytes(b"half a GGUF file")  # what an interrupted quantizer leaves
    os.kill(os.getpid(), signal.SIGILL)
    return 0
