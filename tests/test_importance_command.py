"""``headprune importance``: the library's scores, checked against finite differences of the masked loss."""

from __future__ import annotations

import csv
import json
import random

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.core.io import load_tokenizer
from headprune.evaluation import Classification
from headprune.evaluation.data import load_classification
from tiny import build, word_tokenizer

runner = CliRunner()
WORDS = "the a good bad film plot actor slow fun dull great awful story ending music".split()


def write_data(path, n: int, seed: int = 0):
    rng = random.Random(seed)
    lines = ["sentence\tlabel"] + [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + f"\t{rng.randint(0, 2)}"
                                   for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("importance")
    data = write_data(root / "data.tsv", 10)
    model = build("bert")
    hp.save_pruned(model, root / "model", tokenizer=word_tokenizer(WORDS))
    return root, root / "model", data


def _finite_difference_scores(model_dir, data, *, square: bool, eps: float = 1e-4) -> dict[str, torch.Tensor]:
    """Mean over examples of |dL_b/dxi_h| (or its square), each example alone, by central differences of the
    loss of the float64 model with one head's mask at 1 +- eps (no autograd, no batching)."""
    model = hp.load_pruned(model_dir).double().eval()
    tok = load_tokenizer(model_dir)
    ds = load_classification(data)
    sites = hp.find_sites(model)
    total = {s.name: torch.zeros(s.num_heads, dtype=torch.float64) for s in sites}
    for text, label in zip(ds.texts, ds.labels, strict=True):
        x = dict(tok(text, return_tensors="pt"))
        y = torch.tensor([int(label)])
        for s in sites:
            for h in range(s.num_heads):
                losses = []
                for sign in (1, -1):
                    mask = {s.name: torch.ones(s.num_heads, dtype=torch.float64)}
                    mask[s.name][h] += sign * eps
                    with torch.no_grad(), hp.masked(model, mask):
                        losses.append(torch.nn.functional.cross_entropy(model(**x).logits, y).item())
                g = (losses[0] - losses[1]) / (2 * eps)
                total[s.name][h] += g * g if square else abs(g)
    return {k: v / len(ds.texts) for k, v in total.items()}


def test_importance_command_equals_the_library_and_finite_differences(setup, tmp_path):
    _, model_dir, data = setup
    out = tmp_path / "run"
    result = runner.invoke(app, ["importance", str(model_dir), "--task", "classification", "--data", str(data),
                                 "--batch-size", "4", "--normalize", "none", "-o", str(out)])
    assert result.exit_code == 0, result.output
    written = json.loads((out / "importance.json").read_text())
    assert written["n"] == 10 and written["signature"]["settings"]["absolute"] == "example"
    assert written["signature"]["model"] == model_dir.name and "versions" in written["signature"]  # its own name, not a path
    scores = {k: torch.tensor(v, dtype=torch.float64) for k, v in written["scores"].items()}

    model = hp.load_pruned(model_dir)  # the library on the same data
    ev = Classification(load_tokenizer(model_dir), load_classification(data), config=model.config, batch_size=4)
    library = hp.head_importance(model, ev.batches(), normalize=None)
    assert scores.keys() == library.keys() == {"encoder.0.self", "encoder.1.self"}
    for name, want in library.items():
        assert torch.allclose(scores[name], want.double(), rtol=1e-6, atol=1e-12 * float(want.abs().max()))

    reference = _finite_difference_scores(model_dir, data, square=False)
    scale = max(float(v.abs().max()) for v in reference.values())
    assert scale > 0
    for name, want in reference.items():
        assert (scores[name] - want).abs().max().item() <= 1e-4 * scale, (name, scores[name], want)

    with open(out / "importance.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["site", "layer", "kind", "head", "score"] and len(rows) == 8
    for r in rows:
        assert float(r["score"]) == pytest.approx(written["scores"][r["site"]][int(r["head"])], rel=1e-12)
        assert r["kind"] == "encoder" and int(r["layer"]) == int(r["site"].split(".")[1])
    assert (out / "importance_heatmap.png").stat().st_size > 1000 and (out / "report.html").is_file()


def test_fisher_and_l2_normalisation(setup, tmp_path):
    _, model_dir, data = setup
    out = tmp_path / "fisher"
    result = runner.invoke(app, ["importance", str(model_dir), "--task", "classification", "--data", str(data),
                                 "--scores", "fisher", "--calib-limit", "6", "-o", str(out)])
    assert result.exit_code == 0, result.output
    written = json.loads((out / "importance.json").read_text())
    assert written["n"] == 6
    six = setup[0] / "six.tsv"
    six.write_text("\n".join(data.read_text().splitlines()[:7]) + "\n")
    reference = _finite_difference_scores(model_dir, six, square=True)
    for name, want in reference.items():
        got = torch.tensor(written["scores"][name], dtype=torch.float64)
        assert abs(got.norm().item() - 1.0) <= 1e-9  # l2 per site (the default)
        want = want / want.norm()
        assert (got - want).abs().max().item() <= 1e-4, (name, got, want)


@pytest.mark.parametrize("args, message", [
    (["--absolute", "token"], "--absolute 'token'; allowed: example, batch"),
    (["--normalize", "l1"], "--normalize 'l1'; allowed: l2, none"),
    (["--scores", "taylor"], "--scores 'taylor'; allowed: ih, fisher"),
    (["--calib-limit", "0"], "--calib-limit 0; allowed"),
    (["--scores", "fisher", "--absolute", "batch"], "--absolute 'batch' with --scores fisher"),
])
def test_bad_flags_exit_2_and_write_nothing(setup, tmp_path, args, message):
    _, model_dir, data = setup
    out = tmp_path / "never"
    result = runner.invoke(app, ["importance", str(model_dir), "--task", "classification", "--data", str(data),
                                 *args, "-o", str(out)])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_importance_of_a_causal_lm_equals_the_library(tmp_path):
    """A GQA Llama on the LM task: the command's scores are the library's over the same blocks."""
    from headprune.evaluation.build import EvalOptions, TaskData, build_task
    from headprune.experiments.demo import tiny_llama

    model, tok = tiny_llama()
    hp.save_pruned(model, tmp_path / "lm", tokenizer=tok)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))) * 3)
    out = tmp_path / "run"
    result = runner.invoke(app, ["importance", str(tmp_path / "lm"), "--task", "lm", "--data", str(text),
                                 "--block-size", "16", "--limit", "6", "-o", str(out)])
    assert result.exit_code == 0, result.output
    written = json.loads((out / "importance.json").read_text())
    loaded = hp.load_pruned(tmp_path / "lm")
    ev = build_task("lm", tok, loaded.config, TaskData(str(text), limit=6), EvalOptions(block_size=16))
    want = hp.head_importance(loaded, ev.batches())
    assert written["n"] == 6 and set(written["scores"]) == set(want)
    for name, w in want.items():
        assert torch.allclose(torch.tensor(written["scores"][name]), w, rtol=1e-5, atol=1e-7)
