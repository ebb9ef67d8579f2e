"""``torchrun --nproc_per_node 2`` gives what one process gives: importance scores (<= 1e-6 relative),
ablation, curve and evaluation results (identical), and a run resumed by two processes ends the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from test_importance_command import WORDS, write_data
from tiny import build, word_tokenizer

runner = CliRunner()
pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not built")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    hp.save_pruned(build("bert"), root / "model", tokenizer=word_tokenizer(WORDS))
    return root, root / "model", write_data(root / "data.tsv", 14, seed=3)


def _torchrun(args: list[str], cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "headprune", *args]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _single(args: list[str]):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result


def test_importance_under_torchrun_equals_one_process(setup):
    root, model, data = setup
    for scores in ("ih",):  # the Fisher shares the one summing path (scoring.gradients.gradient_sums)
        base = ["importance", str(model), "--task", "classification", "--data", str(data), "--batch-size", "3",
                "--normalize", "none", "--scores", scores]
        _single([*base, "-o", str(root / f"one-{scores}")])
        done = _torchrun([*base, "-o", str(root / f"two-{scores}")], root)
        one = json.loads((root / f"one-{scores}" / "importance.json").read_text())
        two = json.loads((root / f"two-{scores}" / "importance.json").read_text())
        assert one["n"] == two["n"] == 14
        for site, want in one["scores"].items():
            got, want = torch.tensor(two["scores"][site]), torch.tensor(want)
            assert (got - want).abs().max() <= 1e-6 * want.abs().max(), (site, got, want)
        assert done.stdout.count("examples scored") == 1  # rank 0 reports, once
        assert not any(p.name.endswith(".tmp") for p in (root / f"two-{scores}").iterdir())


def test_ablate_and_curve_under_torchrun_equal_one_process_and_resume(setup):
    root, model, data = setup
    base = ["--task", "classification", "--data", str(data), "--batch-size", "4"]
    ablate = ["ablate", str(model), *base]
    _single([*ablate, "-o", str(root / "abl-one")])
    _torchrun([*ablate, "-o", str(root / "abl-two")], root)
    for name in ("ablation.csv", "ablation_by_damage.csv"):
        assert (root / "abl-two" / name).read_text() == (root / "abl-one" / name).read_text()
    units = (root / "abl-two" / "units.jsonl").read_text().splitlines()
    assert len(units) == 8 and len({json.loads(u)["unit"] for u in units}) == 8  # each head exactly once

    (root / "abl-two" / "ablation.csv").unlink()  # a run killed after 3 heads, resumed by two processes
    (root / "abl-two" / "units.jsonl").write_text("\n".join(units[:3]) + "\n")
    _torchrun([*ablate, "-o", str(root / "abl-two")], root)
    assert (root / "abl-two" / "ablation.csv").read_text() == (root / "abl-one" / "ablation.csv").read_text()
    again = (root / "abl-two" / "units.jsonl").read_text().splitlines()
    assert again[:3] == units[:3] and len(again) == 8 and len({json.loads(u)["unit"] for u in again}) == 8

    curve = ["curve", str(model), *base, "--step", "0.25", "--seeds", "2", "--oracle-from", str(root / "abl-one")]
    _single([*curve, "-o", str(root / "curve-one")])
    _torchrun([*curve, "-o", str(root / "curve-two")], root)
    for name in ("curves.csv", "curves_summary.csv"):
        assert (root / "curve-two" / name).read_text() == (root / "curve-one" / name).read_text()


def test_evaluation_under_torchrun_equals_one_process(setup):
    root, model, data = setup
    args = ["evaluate", str(model), "--task", "classification", "--data", str(data), "--batch-size", "3", "--json"]
    one = json.loads(_single(args).stdout)
    two = json.loads(_torchrun(args, root).stdout)
    assert two["n"] == one["n"] == 14
    assert two["score"] == one["score"] and two["extra"]["matthews"] == one["extra"]["matthews"]


def tune_case():
    """A tiny BERT, 5 calibration batches and heads to drop (shared with tests/dist_worker.py)."""
    from tiny import inputs

    model = build("bert")
    batches = [inputs("bert", batch=3, seed=s) for s in range(5)]
    return model, batches, {"encoder.0.self": [1], "encoder.1.self": [0, 3]}


def test_units_split_sums_reduced_and_tuning_summed_across_ranks(tmp_path):
    """The mechanism itself: 7 units over 2 ranks run 4 + 3 times, every rank ends with all 7 rows; a rank
    that saw no batch of a site still takes part in the reduction; mask tuning's normal equations summed
    over the ranks' batches give one process's scales."""
    from headprune.compression.tuning import tune_scales

    out = tmp_path / "ranks.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(Path(__file__).with_name("dist_worker.py")), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = json.loads(out.read_text())
    assert [r["world"] for r in ranks] == [2, 2]
    assert ranks[0]["ran"] == ["0", "2", "4", "6"] and ranks[1]["ran"] == ["1", "3", "5"]
    for r in ranks:
        assert {k: v["square"] for k, v in r["rows"].items()} == {str(i): i * i for i in range(7)}
        assert {k: v["rank"] for k, v in r["rows"].items()} == {str(i): i % 2 for i in range(7)}
        assert r["a"] == [0.0 + 2 + 4] and r["count"] == 5  # rank 0's sum (rank 1 had no "a"); 3 + 2 batches

    model, batches, drop = tune_case()
    want = tune_scales(model, batches, drop).scales
    assert any(abs(v - 1.0) > 1e-3 for s in want.values() for v in s.tolist() if v != 0)  # really tuned
    for r in ranks:
        for name, scales in want.items():
            got = torch.tensor(r["scales"][name])
            assert torch.allclose(got, scales, rtol=1e-5, atol=1e-6), (name, got, scales)
