"""``headprune report DIR`` writes only into a headprune run directory (issue 24): a folder with a
results.json but no run.json is the user's own, and its report.html is left as it was."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.report import build_report

runner = CliRunner()
RESULTS = {"title": "t", "headline": [["a", "1"]], "figures": [], "tables": [], "notes": [], "signature": {}}


def _folder(tmp_path, run_json: bool):
    (tmp_path / "results.json").write_text(json.dumps(RESULTS))
    (tmp_path / "report.html").write_text("<p>the user's own page</p>")
    if run_json:
        (tmp_path / "run.json").write_text(json.dumps({"signature": {}}))
    return tmp_path


def test_report_refuses_a_folder_that_is_not_a_headprune_run(tmp_path):
    folder = _folder(tmp_path, run_json=False)
    before = sorted(p.name for p in folder.iterdir())
    result = runner.invoke(app, ["report", str(folder)])
    assert result.exit_code == 2, result.output
    assert "no run.json" in result.output and "Traceback" not in result.output
    assert (folder / "report.html").read_text() == "<p>the user's own page</p>"
    assert sorted(p.name for p in folder.iterdir()) == before
    with pytest.raises(hp.HeadpruneError, match="run.json"):
        build_report(folder)


def test_report_rebuilds_a_headprune_run(tmp_path):
    folder = _folder(tmp_path, run_json=True)
    result = runner.invoke(app, ["report", str(folder)])
    assert result.exit_code == 0, result.output
    assert "the user's own page" not in (folder / "report.html").read_text()
