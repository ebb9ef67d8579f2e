"""The shared-data helper: skipped without $HEADPRUNE_SHARED_DATA, FAILED (never skipped) when it is set and
a file is missing, so CI, which always sets it, cannot pass by skipping."""

from __future__ import annotations

import pytest

from shared_data import ENV, check_marked, shared_file


class _Item:
    def __init__(self, *paths):
        self.marks = [pytest.mark.shared_data(*paths).mark]

    def iter_markers(self, name):
        return [m for m in self.marks if m.name == name]


def test_unset_skips(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    with pytest.raises(pytest.skip.Exception):
        shared_file("sst2/dev.tsv")
    with pytest.raises(pytest.skip.Exception):
        check_marked(_Item("sst2/dev.tsv"))


def test_set_but_missing_fails(monkeypatch, tmp_path):
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "dev.tsv").write_text("sentence\tlabel\n")
    monkeypatch.setenv(ENV, str(tmp_path))
    assert shared_file("sst2/dev.tsv") == tmp_path / "sst2" / "dev.tsv"
    assert shared_file() == tmp_path
    check_marked(_Item("sst2/dev.tsv"))  # present: nothing happens
    with pytest.raises(pytest.fail.Exception, match="is set but .*mrpc/dev.tsv is missing"):
        shared_file("mrpc/dev.tsv")
    with pytest.raises(pytest.fail.Exception, match="missing"):
        check_marked(_Item("sst2/dev.tsv", "cola/dev.tsv"))
