"""The shared real data sets of the tests: ``$HEADPRUNE_SHARED_DATA`` (CI always sets it).

Unset (a user's clone), tests that need a shared file are skipped; set, a missing file FAILS the test
(it is never silently skipped). Mark such a test ``@pytest.mark.shared_data("sst2/dev.tsv", ...)``, or call
:func:`shared_file` in a fixture.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "HEADPRUNE_SHARED_DATA"


def shared_root() -> Path | None:
    """The shared data directory, or None when the variable is unset."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def shared_file(*relative: str) -> Path:
    """``$HEADPRUNE_SHARED_DATA/relative`` (the root itself when none is given): skip when the variable is
    unset, fail when it is set and the file or directory is missing."""
    root = shared_root()
    if root is None:
        pytest.skip(f"{ENV} is not set (the shared data sets; CI sets it)")
    path = root.joinpath(*relative)
    if not path.exists():
        pytest.fail(f"{ENV}={root} is set but {path} is missing; the shared data is incomplete", pytrace=False)
    return path


def check_marked(item) -> None:
    """For the conftest: every path named by the test's ``shared_data`` marks."""
    for mark in item.iter_markers("shared_data"):
        for relative in mark.args or ("",):
            shared_file(relative) if relative else shared_file()
