"""NaN and inf are refused in one line wherever they appear -- a weight, a loss, a site's scores -- by every
library entry point that takes a model and data and by the CLI alike, before any model change or file write;
a finite model is scored as before (checked against finite differences of its own loss)."""

from __future__ import annotations

import functools

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from headprune.compression import PruneSettings
from headprune.core.model.finite import check_finite_weights
from headprune.errors import NonFiniteError
from headprune.evaluation import Classification, LanguageModelling
from headprune.evaluation.data import load_classification
from headprune.scoring import mean_loss, unit_fisher
from headprune.scoring.scorer import ScoreRequest
from headprune.scoring.scorers import BUILT_IN
from llm_tiny import TEXTS, bpe_tokenizer, tiny_decoder
from tiny import build, inputs, word_tokenizer

UNUSED_ROW = 310  # the tiny decoder's vocabulary is 320, its tokenizer's 300: no text ever reaches this row
EMBED = "model.embed_tokens.weight"
Q_PROJ = "model.layers.1.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def tokenizer():
    return bpe_tokenizer()


def _lm_batches(tokenizer) -> list[dict[str, torch.Tensor]]:
    ids = torch.tensor([tokenizer(t)["input_ids"][:12] for t in TEXTS])  # [3, 12]
    return [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}]


def _poisoned(name: str, value: float):
    model = tiny_decoder(layers=2)
    with torch.no_grad():
        dict(model.named_parameters())[name][UNUSED_ROW if name == EMBED else 3, 5] = value
    return model


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


ENTRY_POINTS = {
    "head_importance": lambda m, b, tok: hp.head_importance(m, b),
    "fisher_information": lambda m, b, tok: hp.fisher_information(m, b),
    "mask_gradients": lambda m, b, tok: hp.mask_gradients(m, b[0]),
    "fluctuation_scores": lambda m, b, tok: hp.fluctuation_scores(m, b),
    "unit_fisher": lambda m, b, tok: unit_fisher(m, b),
    "mean_loss": lambda m, b, tok: mean_loss(m, b),
    "score_heads": lambda m, b, tok: hp.score_heads(m, b, "random"),  # a scorer that never runs the model
    "LanguageModelling.evaluate": lambda m, b, tok: LanguageModelling(tok, TEXTS, block_size=8).evaluate(m),
    **{f"scorer {s.name}": functools.partial(lambda s, m, b, tok: s.score(m, b, ScoreRequest(units="heads")), s)
       for s in BUILT_IN},  # a scorer called directly, not through score_heads or compress
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("name, value, kind", [(EMBED, float("nan"), "1 NaN"), (Q_PROJ, float("inf"), "1 inf")])
def test_a_non_finite_weight_is_refused_naming_it(tokenizer, entry, name, value, kind):
    model = _poisoned(name, value)
    batches = _lm_batches(tokenizer)
    if name == EMBED:  # the silent case: the batches never reach the row, the model's outputs are finite
        with torch.no_grad():
            assert bool(torch.isfinite(model(**batches[0]).logits).all())
    with pytest.raises(NonFiniteError) as excinfo:
        ENTRY_POINTS[entry](model, batches, tokenizer)
    message = _one_line(excinfo)
    assert f"parameter {name!r} of LlamaForCausalLM is not finite: {kind} of" in message, message
    assert isinstance(excinfo.value, hp.DataError)  # the CLI's one-line errors, and existing handlers, catch it


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_weight_check_names_the_first_bad_parameter_in_model_order(dtype):
    model = tiny_decoder(layers=2).to(dtype)
    params = dict(model.named_parameters())
    check_finite_weights(model)  # finite: accepted
    with torch.no_grad():
        params["lm_head.weight"][7, 1] = float("nan")
        params[Q_PROJ][2, 9] = -float("inf")
        params[Q_PROJ][3, 0] = float("nan")
    with pytest.raises(NonFiniteError) as excinfo:
        check_finite_weights(model)
    assert _one_line(excinfo).startswith(f"parameter {Q_PROJ!r} of LlamaForCausalLM is not finite: 1 NaN and 1 inf "
                                         f"of 4096 values (the first at index [2, 9]) (1 more parameters too); ")


def test_an_empty_parameter_is_checked_without_error():
    model = tiny_decoder(layers=2)
    model.model.layers[0].empty = torch.nn.Parameter(torch.empty(0, 16))  # aminmax has no answer for it
    check_finite_weights(model)
    with torch.no_grad():
        model.model.norm.weight[0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"parameter 'model.norm.weight' of LlamaForCausalLM is not finite: "
                                              r"1 inf of 64 values \(the first at index \[0\]\)"):
        check_finite_weights(model)


@pytest.mark.parametrize("settings", [PruneSettings(share=0.5, seq_len=8, compensate="tune"),
                                      PruneSettings(units="both", share=0.6, seq_len=8, compensate="none")],
                         ids=["head plan", "heads and neurons"])
@pytest.mark.parametrize("name, value", [(EMBED, float("nan")), (Q_PROJ, float("-inf"))])
def test_compress_refuses_before_changing_the_model(tokenizer, settings, name, value):
    model = _poisoned(name, value)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    shapes = hp.kept_heads(model)
    kwargs = {"inplace": True} if settings.head_plan else {}
    with pytest.raises(NonFiniteError, match=f"parameter '{name}'") as excinfo:
        hp.compress(model, _lm_batches(tokenizer), settings, **kwargs)
    _one_line(excinfo)
    assert hp.kept_heads(model) == shapes
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        torch.testing.assert_close(after[k], before[k], rtol=0, atol=0, equal_nan=True)


def test_classification_evaluate_refuses_a_nan_weight():
    model = build("bert")
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[60, 0] = float("nan")  # a token no text below holds

    class Words:  # a tokenizer-free evaluator input: token ids as text
        pad_token_id = 0

        def __call__(self, texts, text_pair=None, truncation=True, max_length=None):
            return {"input_ids": [[1] + [3 + len(w) % 50 for w in t.split()] for t in texts]}

    task = Classification(Words(), (["a bb ccc", "dd e"], ["0", "1"]), config=model.config)
    with pytest.raises(NonFiniteError, match=r"parameter 'bert.embeddings.word_embeddings.weight' of "
                                              r"BertForSequenceClassification is not finite: 1 NaN of 2048 values "
                                              r"\(the first at index \[60, 0\]\)") as excinfo:
        task.evaluate(model)
    _one_line(excinfo)


def _overflowing(tokenizer):
    """Finite weights whose logits overflow float32: lm_head filled with 3e38 (finite), so every logit is a sum
    of products beyond float32's range."""
    model = tiny_decoder(layers=2)
    with torch.no_grad():
        model.lm_head.weight.fill_(3e38)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    with torch.no_grad():  # the premise, from the model itself
        assert not bool(torch.isfinite(model(**_lm_batches(tokenizer)[0]).logits).all())
    return model


def _token_losses(outputs, batch):  # a user's loss_fn: mean next-token cross-entropy per example, [B]
    logits, labels = outputs.logits[:, :-1].float(), batch["labels"][:, 1:]
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none").mean(-1)


@pytest.mark.parametrize("entry, pattern", [
    (lambda m, b: hp.head_importance(m, b), r"the logits of LlamaForCausalLM on the first batch are not finite: \d+ (NaN|inf)"),
    (lambda m, b: hp.head_importance(m, b, loss_fn=_token_losses),
     r"the losses of batch 0 \(one per example\) are not finite: \d+ (NaN|inf)"),
    (lambda m, b: hp.fisher_information(m, b + b, loss_fn=_token_losses), r"the losses of batch 0 "),
    (lambda m, b: unit_fisher(m, b, loss_fn=_token_losses), r"the losses of batch 0 "),
    (lambda m, b: hp.compress(m, b, PruneSettings(share=0.5, seq_len=8), loss_fn=_token_losses, inplace=True),
     r"the losses of batch 0 "),
])
def test_a_finite_model_whose_loss_overflows_is_refused(tokenizer, entry, pattern):
    model = _overflowing(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(NonFiniteError, match=pattern) as excinfo:
        entry(model, _lm_batches(tokenizer))
    assert "allowed: finite values" in _one_line(excinfo)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_lm_evaluate_refuses_overflowing_losses(tokenizer):
    with pytest.raises(NonFiniteError, match=r"the token losses of batch 0 are not finite: \d+ ") as excinfo:
        LanguageModelling(tokenizer, TEXTS, block_size=8).evaluate(_overflowing(tokenizer))
    _one_line(excinfo)


def test_a_nan_label_is_refused_naming_the_loss():
    """A regression head (one label) with a NaN target: finite weights and logits, a NaN loss."""
    config = build("bert").config
    config.num_labels = 1
    torch.manual_seed(0)
    model = type(build("bert"))(config).eval()
    model.set_attn_implementation("eager")
    x = {"input_ids": torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]]), "attention_mask": torch.ones(2, 4, dtype=torch.long)}
    with pytest.raises(NonFiniteError, match=r"headprune's losses of the first batch are not finite: 1 NaN") as excinfo:
        hp.head_importance(model, [{**x, "labels": torch.tensor([0.5, float("nan")])}])
    _one_line(excinfo)
    finite = hp.head_importance(model, [{**x, "labels": torch.tensor([0.5, 0.25])}])  # the same model, finite labels
    assert finite.keys() == {"encoder.0.self", "encoder.1.self"}
    assert all(bool(torch.isfinite(v).all()) for v in finite.values())


def test_a_scorer_returning_nan_is_refused_naming_the_site(tokenizer):
    from headprune.scoring.scorer import UnitScores
    from headprune.scoring.scorers import RandomScorer

    class Broken(RandomScorer):
        name = "broken"  # what a method is: a class variable, not a setting

        def score(self, model, batches, request):
            heads = super().score(model, batches, request).heads
            heads["decoder.1.self"][2] = float("nan")
            return UnitScores(heads)

    with pytest.raises(NonFiniteError, match=r"the broken scores of 'decoder.1.self' are not finite: 1 NaN of 4 values "
                                              r"\(the first at index \[2\]\)") as excinfo:
        hp.score_heads(tiny_decoder(layers=2), _lm_batches(tokenizer), Broken())
    _one_line(excinfo)


def test_a_finite_model_is_scored_as_before():
    """Accepted, and I_h equal to central differences of the model's next-token loss (float64 GPT-2: Llama-like
    models keep RMSNorm and rotary tables in float32), so the checks change no number."""
    model = build("gpt2").double()
    with torch.no_grad():  # larger weights than the init's: gradients well above rounding
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(3.0)
    batch = inputs("gpt2", batch=1)
    batch["labels"] = batch["input_ids"]
    scores = hp.head_importance(model, [batch], normalize=None)  # one example: I_h is |dL/dxi_h| itself
    eps = 1e-6
    for site in hp.find_sites(model):
        want = torch.zeros(site.num_heads, dtype=torch.float64)
        for h in range(site.num_heads):
            losses = []
            for sign in (1, -1):
                mask = {site.name: torch.ones(site.num_heads, dtype=torch.float64)}
                mask[site.name][h] += sign * eps
                with torch.no_grad(), hp.masked(model, mask):  # next-token loss in float64 (.loss is float32)
                    logits = model(**batch).logits[0, :-1]
                    losses.append(float(torch.nn.functional.cross_entropy(logits, batch["labels"][0, 1:])))
            want[h] = abs(losses[0] - losses[1]) / (2 * eps)
        got = scores[site.name].double()
        assert want.max() > 1e-3 and (got - want).abs().max() <= 1e-5 * want.max(), (site.name, got, want)
    with torch.no_grad():
        own = float(model(**batch).loss)
    assert mean_loss(model, [batch]) == pytest.approx(own, rel=1e-6)  # float32's .loss


WORDS = "the a good bad film plot actor slow fun dull".split()


def test_the_cli_refuses_the_model_the_library_refuses(tmp_path):
    """``headprune importance`` and ``hp.head_importance`` on one saved model with a NaN in an embedding row no
    text reaches: the same line, a non-zero exit, nothing written."""
    model = build("bert")
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[63, 1] = float("nan")  # past the word tokenizer's ids
    tok = word_tokenizer(WORDS)
    assert len(tok) < 63
    hp.save_pruned(model, tmp_path / "model", tokenizer=tok)
    data = tmp_path / "data.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{w} film\t{i % 3}\n" for i, w in enumerate(WORDS)))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["importance", str(tmp_path / "model"), "--task", "classification",
                                      "--data", str(data), "-o", str(out)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.startswith("error: parameter 'bert.embeddings.word_embeddings.weight'"), result.output
    assert not out.exists() or not any(out.iterdir())

    loaded = hp.load_pruned(tmp_path / "model")
    ev = Classification(tok, load_classification(data), config=loaded.config)
    with pytest.raises(NonFiniteError) as excinfo:
        hp.head_importance(loaded, ev.batches())
    assert result.output == f"error: {_one_line(excinfo)}\n"  # the same line
