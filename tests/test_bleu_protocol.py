"""One BLEU generation protocol: training-time evaluation == ``Translation.evaluate``; batching changes nothing."""

from __future__ import annotations

import random

import pytest
import sacrebleu
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from headprune.evaluation.translation import Translation, equal_length_batches, new_token_bound
from headprune.train import TranslationTrainSettings, train_translation

WORDS = "red blue green cat dog sun moon tree".split()


def _copy_task(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(n)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    src, ev = _copy_task(240, seed=0), _copy_task(24, seed=1)
    settings = TranslationTrainSettings(epochs=8, batch_size=16, lr=3e-3, warmup_steps=10, vocab_size=40,
                                        encoder_layers=2, decoder_layers=2, d_model=32, attention_heads=4, ffn_dim=64,
                                        max_length=12, dropout=0.0, progress=False, eval_batch_size=5)
    out = tmp_path_factory.mktemp("mt")
    res = train_translation(src, src, settings=settings, output_dir=out, eval_sources=ev, eval_targets=ev)
    model, tok = AutoModelForSeq2SeqLM.from_pretrained(out / "final"), AutoTokenizer.from_pretrained(out / "final")
    return res, model, tok, ev


def test_training_time_bleu_equals_evaluate(trained):
    res, model, tok, ev = trained
    logged = res.log[-1]
    result = Translation(tok, (ev, ev), batch_size=7, max_source_length=12).evaluate(model)  # other batch size
    assert result.score == logged["eval_bleu_exact"] > 0  # the very same number, not a near one
    assert result.score == pytest.approx(sacrebleu.corpus_bleu(result.extra["hypotheses"], [ev]).score, abs=1e-12)
    assert logged["bleu_signature"] == result.extra["sacrebleu"]
    assert logged["generation"] == result.extra["signature"]["generation"]


@pytest.mark.parametrize("beams", [1, 3])
def test_batch_size_does_not_change_translations(trained, beams):
    _, model, tok, ev = trained
    one = Translation(tok, (ev, ev), batch_size=1, num_beams=beams).evaluate(model)
    many = Translation(tok, (ev, ev), batch_size=16, num_beams=beams).evaluate(model)
    assert one.extra["hypotheses"] == many.extra["hypotheses"] and one.score == many.score


def test_equal_length_batches_and_the_bound():
    lengths = [3, 5, 3, 5, 5, 2]
    assert equal_length_batches(lengths, 2) == [[1, 3], [4], [0, 2], [5]]

    class Config:
        max_position_embeddings = 40

    model = type("M", (), {"config": Config()})()
    assert new_token_bound(model, 10) == 25  # ceil(1.5 * 10) + 10
    assert new_token_bound(model, 11) == 27  # ceil(16.5) + 10
    assert new_token_bound(model, 30) == 39  # 55, but below the 40 positions
    assert new_token_bound(model, 30, max_new_tokens=5) == 5


def test_study_results_state_sacrebleus_signature_and_the_protocol(trained, tmp_path):
    import csv
    import json

    from headprune.experiments.ablation import SweepSettings
    from headprune.experiments.rundir import RunOutput
    from headprune.experiments.study import run_ablation

    _, model, tok, ev = trained
    task = Translation(tok, (ev, ev), batch_size=8)
    run_ablation(model, task, RunOutput(tmp_path / "abl", progress=False), sites=["decoder.1.cross"],
                 settings=SweepSettings())
    results = json.loads((tmp_path / "abl" / "results.json").read_text())
    bleu = sacrebleu.metrics.BLEU()
    bleu.corpus_score(["a"], [["a"]])  # sacreBLEU's signature needs one evaluation (it knows nrefs then)
    assert results["bleu"]["sacrebleu"] == bleu.get_signature().format()
    assert results["bleu"]["generation"] == task.signature["generation"] and "1.5*src" in results["bleu"]["generation"]
    with open(tmp_path / "abl" / "ablation.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header[-7:] == ["p_value", "p_bootstrap", "p_sacrebleu", "p_adjusted", "ci_low", "ci_high", "significant"]
