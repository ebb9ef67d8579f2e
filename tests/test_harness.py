"""lm-evaluation-harness scores a pruned model (different heads and FFN widths per layer) on local tasks,
end to end, and its numbers equal the model's own log-likelihoods computed here (skipped without lm_eval)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from typer.testing import CliRunner

import headprune
from headprune.cli import app
from headprune.errors import ConfigError
from llm_tiny import TEXTS, bpe_tokenizer, prune_unevenly, tiny_decoder

pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install 'headprune[eval]')")

from headprune.evaluation.harness import HarnessSettings, evaluate_harness, local_task_yaml  # noqa: E402

QUESTIONS = [("The quick brown fox", ["jumps over the lazy dog", "runs faster", "is blue"], 0),
             ("Attention heads that a trained model", ["does not need", "can be removed", "quick"], 0),
             ("Pruned models run", ["faster on the machines", "the dog", "over the lazy"], 0),
             ("The lazy dog", ["does not mind at all", "keeps their quality", "ships"], 0),
             ("Heads can be", ["removed before it ships", "brown", "lazy fox"], 1)]


def _sum_logprob(model, context_ids: list[int], target_ids: list[int]) -> float:
    ids = torch.tensor([context_ids + target_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids[:, :-1]).logits[0].double(), -1)
    positions = range(len(context_ids) - 1, ids.shape[1] - 1)
    return float(sum(logp[p, ids[0, p + 1]] for p in positions))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("harness")
    model, tok = tiny_decoder("llama"), bpe_tokenizer()
    prune_unevenly(model)
    mc = tmp / "mc.jsonl"
    mc.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n" for q, c, a in QUESTIONS))
    docs = tmp / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    local_task_yaml(tmp / "tasks", "hp_mc", mc, "multiple_choice")
    local_task_yaml(tmp / "tasks", "hp_ppl", docs, "perplexity")
    return tmp, model, tok


def test_scores_equal_the_models_own_loglikelihoods(setup):
    tmp, model, tok = setup
    out = evaluate_harness(model, tok, ["hp_mc", "hp_ppl"], HarnessSettings(include_path=tmp / "tasks"))
    # multiple choice: argmax over choices of log p(" " + choice | question), and the length-normalised one
    right = right_norm = 0
    for q, choices, answer in QUESTIONS:
        ctx = tok(q)["input_ids"]
        lls = [_sum_logprob(model, ctx, tok(q + " " + c)["input_ids"][len(ctx):]) for c in choices]
        right += max(range(len(lls)), key=lls.__getitem__) == answer
        right_norm += max(range(len(lls)), key=lambda i: lls[i] / len(choices[i])) == answer
    assert out["results"]["hp_mc"]["acc,none"] == pytest.approx(right / len(QUESTIONS))
    assert out["results"]["hp_mc"]["acc_norm,none"] == pytest.approx(right_norm / len(QUESTIONS))
    # perplexity: each document scored from the BOS/EOS token, per word and per byte
    nll = -sum(_sum_logprob(model, [tok.bos_token_id], tok(t)["input_ids"]) for t in TEXTS)
    words = sum(len(re.split(r"\s+", t)) for t in TEXTS)
    nbytes = sum(len(t.encode("utf-8")) for t in TEXTS)
    ppl = out["results"]["hp_ppl"]
    assert ppl["word_perplexity,none"] == pytest.approx(math.exp(nll / words), rel=1e-4)
    assert ppl["byte_perplexity,none"] == pytest.approx(math.exp(nll / nbytes), rel=1e-4)
    assert ppl["bits_per_byte,none"] == pytest.approx(nll / nbytes / math.log(2), rel=1e-4)


def test_cli_lm_eval_on_a_pruned_directory(setup):
    tmp, model, tok = setup
    headprune.save_pruned(model, tmp / "pruned", tok)
    r = CliRunner().invoke(app, ["lm-eval", str(tmp / "pruned"), "--tasks", "hp_ppl", "--include-path",
                                 str(tmp / "tasks"), "-o", str(tmp / "res.json")])
    assert r.exit_code == 0, r.output
    want = evaluate_harness(headprune.load_model(tmp / "pruned"), tok, ["hp_ppl"],
                            HarnessSettings(include_path=tmp / "tasks"))
    got = json.loads((tmp / "res.json").read_text())
    assert got["results"]["hp_ppl"]["word_perplexity,none"] == pytest.approx(
        want["results"]["hp_ppl"]["word_perplexity,none"], rel=1e-6)
    bad = CliRunner().invoke(app, ["lm-eval", str(tmp / "pruned"), "--tasks", "nope", "--include-path",
                                   str(tmp / "tasks")])
    assert bad.exit_code != 0 and "nope" in bad.output


def test_bad_arguments(setup):
    tmp, model, tok = setup
    with pytest.raises(ConfigError, match="tasks"):
        evaluate_harness(model, tok, [], HarnessSettings(include_path=tmp / "tasks"))
    with pytest.raises(ConfigError, match="include_path=None and include_defaults=False"):
        HarnessSettings()
    with pytest.raises(ConfigError, match="batch_size=0"):
        HarnessSettings(include_path=tmp / "tasks", batch_size=0)
    with pytest.raises(ConfigError, match="kind"):
        local_task_yaml(tmp / "tasks", "x", tmp / "mc.jsonl", "generation")
