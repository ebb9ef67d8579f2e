"""Test-wide hooks: the ``shared_data`` mark (see shared_data.py), and transformers' deprecation notices from
headprune's own code as errors.

transformers says some deprecations through ``warnings.warn(..., FutureWarning)`` (pyproject's filterwarnings
turns those attributed to a ``headprune`` module into errors) and others only through its logger
(``logger.warning_once("`past_key_values`/`cache_params` are deprecated. Use `cache` instead.")``). A
handler on transformers' logger re-issues the latter as a FutureWarning attributed to the nearest headprune
frame that called into transformers, so the same filter makes them errors; a test's own direct calls
into transformers are left alone.
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

from shared_data import check_marked

SOURCE = str(Path(__file__).resolve().parents[1] / "src" / "headprune")


class DeprecationFromHeadprune(logging.Handler):
    """A transformers log record that says "deprecated", raised as a FutureWarning at headprune's call site."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "deprecat" not in message.lower():
            return
        frame = sys._getframe(1)
        while frame is not None and not frame.f_code.co_filename.startswith(SOURCE):
            frame = frame.f_back
        if frame is not None:
            warnings.warn_explicit(f"transformers: {message}", FutureWarning, frame.f_code.co_filename,
                                   frame.f_lineno, module=frame.f_globals.get("__name__", "headprune"))


def pytest_configure(config):
    logging.getLogger("transformers").addHandler(DeprecationFromHeadprune(logging.WARNING))
    config.addinivalue_line("markers", "shared_data(*paths): needs these files under $HEADPRUNE_SHARED_DATA; "
                            "skipped when the variable is unset, failed when it is set and a file is missing")


def pytest_runtest_setup(item):
    check_marked(item)
