"""Test-wide hooks: the ``shared_data`` mark (see shared_data.py)."""

from __future__ import annotations

from shared_data import check_marked


def pytest_configure(config):
    config.addinivalue_line("markers", "shared_data(*paths): needs these files under $HEADPRUNE_SHARED_DATA; "
                            "skipped when the variable is unset, failed when it is set and a file is missing")


def pytest_runtest_setup(item):
    check_marked(item)
