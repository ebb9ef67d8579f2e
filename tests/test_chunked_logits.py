"""Losses of models with large vocabularies are computed chunk by chunk over the tokens (issue #47 item 4).

On a tiny random model of several decoder families (Gemma-2/3 with a final logit soft-capping that bites),
the chunked per-example losses, the mask gradients (head importance), the perplexity and the distillation
loss equal those computed here by hand from the model's own full logits; the output head never produces
more than one chunk of rows once the first batch's check is done; a model whose forward changes its logits
after the head falls back to the full logits and is still right."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import transformers as T
from transformers.modeling_outputs import CausalLMOutputWithPast

import headprune as hp
import tiny
from headprune.compression.distill import distill_loss
from headprune.core.masks.masking import masked, ones_mask
from headprune.core.model import chunked
from headprune.core.model.inputs import model_inputs
from headprune.evaluation.lm import LanguageModelling
from headprune.scoring.gradients import mask_gradients, scoring_mode

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("families", ROOT / "benchmarks" / "families.py")
families = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("families", families)
_spec.loader.exec_module(families)

FAMILIES = ["llama", "gemma2", "gemma3_text", "qwen2", "gpt2"]
ROWS = 3  # token rows per chunk in these tests


def _model(family: str):
    _, config, model = families.build(family)
    if hasattr(config, "final_logit_softcapping"):  # Gemma-2 and -3 read it in their forward
        config.final_logit_softcapping = 0.3  # the tiny model's logits reach ~0.3: the cap bites
    return model


def _batch(model, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, model.config.vocab_size, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # one left-padded row
    return {"input_ids": ids, "attention_mask": mask}


def _small_chunks(monkeypatch, model) -> None:
    monkeypatch.setattr(chunked, "LOGIT_BYTES", 4 * model.config.vocab_size * ROWS)


def _hand_losses(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """[B] mean NLL of each row's next tokens whose predicting position is real, in float64."""
    logp = torch.log_softmax(logits.double(), -1)[:, :-1]  # [B, T-1, V]
    target = batch["input_ids"][:, 1:]
    real = (batch["attention_mask"][:, :-1] * batch["attention_mask"][:, 1:]).bool()
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1) * real
    return nll.sum(-1) / real.sum(-1)


def _reference_gradients(model, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    xi = ones_mask(model, batch["input_ids"].shape[0], requires_grad=True)
    with scoring_mode(model), masked(model, xi), torch.enable_grad():
        logits = model(**model_inputs(model, batch, cache=False)).logits  # [B, T, V], all of them
        losses = _hand_losses(logits, batch)
        grads = torch.autograd.grad(losses.sum(), list(xi.values()))
    return losses.detach(), dict(zip(xi, grads, strict=True))


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_losses_and_mask_gradients_equal_the_full_logits(family, monkeypatch):
    model = _model(family)
    _small_chunks(monkeypatch, model)
    batch = _batch(model)
    want_losses, want = _reference_gradients(model, batch)
    got, valid = mask_gradients(model, batch)
    assert chunked._UNCHUNKED not in model.__dict__  # the hidden-state path was taken, not the fallback
    assert bool(valid.all())
    for name in want:
        assert _relative(got[name], want[name]) < 1e-5, name
    with scoring_mode(model), torch.no_grad():
        losses = hp.scoring.mean_loss(model, [batch])
    assert abs(losses - float(want_losses.mean())) <= 1e-5 * float(want_losses.mean())


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text"])
def test_the_soft_capping_is_applied_by_behaviour(family):
    model = _model(family)
    batch = _batch(model)
    with torch.no_grad():
        out = chunked.token_outputs(model, batch)
        full = model(**batch).logits
        raw = model.get_output_embeddings()(out.features)  # the head alone: no cap
    assert out.chunked
    assert _relative(raw, full) > 1e-2  # the cap changes the logits a lot...
    assert _relative(out.to_logits(out.features), full) < 1e-6  # ...and the chunked map has it


def _rows_recorder(model) -> tuple[list[int], object]:
    head, vocab = model.get_output_embeddings(), model.config.vocab_size
    rows: list[int] = []
    handle = head.register_forward_hook(lambda m, a, out: rows.append(out.numel() // vocab))
    return rows, handle


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_the_head_never_produces_more_than_a_chunk(family, monkeypatch):
    model = _model(family)
    _small_chunks(monkeypatch, model)
    b1 = {k: v.repeat(2, 2) for k, v in _batch(model).items()}  # [6, 18]: 108 token rows
    b1["attention_mask"][:] = 1
    probe = b1["input_ids"].shape[0] * chunked.PROBE_TOKENS  # the head's rows inside the forward: [B, 4, V]
    rows, handle = _rows_recorder(model)
    try:
        mask_gradients(model, b1)  # the first batch checks the shift on one row: [1, T, V] at most
        assert max(rows) <= max(b1["input_ids"].shape[1], probe)
        rows.clear()
        mask_gradients(model, b1)
        scored = max(rows)
        rows.clear()
        hp.scoring.mean_loss(model, [b1])
    finally:
        handle.remove()
    assert ROWS in rows  # the chunks ran
    assert scored <= max(ROWS, probe) and max(rows) <= max(ROWS, probe)
    assert b1["input_ids"].numel() >= 4 * max(ROWS, probe)  # the full [B, T, V] would have shown


def test_perplexity_is_chunked_and_equals_the_full_logits(monkeypatch):
    texts = ["the cat sat on the mat and the dog sat on the log " * 3, "a bird flew over the house " * 4]
    tok = tiny.word_tokenizer(texts)
    model = _model("gemma3_text")
    _small_chunks(monkeypatch, model)
    task = LanguageModelling(tok, texts, block_size=8, batch_size=4)
    rows, handle = _rows_recorder(model)
    try:
        result = task.evaluate(model)
    finally:
        handle.remove()
    blocks = task.blocks
    with torch.no_grad():
        logits = model(input_ids=blocks, attention_mask=torch.ones_like(blocks)).logits
    batch = {"input_ids": blocks, "attention_mask": torch.ones_like(blocks)}
    want = _hand_losses(logits, batch) * (blocks.shape[1] - 1)  # [N] NLL sums
    assert _relative(torch.as_tensor(result.per_example["nll_sum"]), want) < 1e-5
    assert max(rows) <= max(ROWS, 4 * chunked.PROBE_TOKENS) < blocks[:4].numel()


def test_distillation_loss_and_its_gradients_equal_the_full_logits(monkeypatch):
    teacher = _model("gemma2")
    student = _model("gemma2")
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.05 * torch.randn_like(p))
    _small_chunks(monkeypatch, student)
    batch = _batch(student)
    loss = distill_loss(student, teacher, batch)
    got = torch.autograd.grad(loss, [student.model.layers[0].self_attn.q_proj.weight])[0]
    with torch.no_grad():
        t = torch.log_softmax(teacher(**batch).logits.double(), -1)
    s = torch.log_softmax(student(**batch).logits.double(), -1)
    keep = batch["attention_mask"].bool()
    want_loss = (t.exp() * (t - s)).sum(-1)[keep].mean()
    want = torch.autograd.grad(want_loss, [student.model.layers[0].self_attn.q_proj.weight])[0]
    assert abs(float(loss.detach()) - float(want_loss.detach())) <= 1e-5 * abs(float(want_loss.detach()))
    assert _relative(got, want) < 1e-5
    assert teacher.model.layers[0].self_attn.q_proj.weight.grad is None


class _BiasedLlama(T.LlamaForCausalLM):
    """A causal LM whose forward adds a bias to the head's output: something after the head that no candidate
    map knows; its own loss is computed from the biased logits."""

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
        logits = self.lm_head(hidden) + torch.linspace(-1, 1, self.config.vocab_size)
        loss = None if labels is None else self.loss_function(logits, labels, self.config.vocab_size)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


def test_a_forward_that_changes_the_logits_after_the_head_falls_back_to_them(monkeypatch):
    _, config, _ = families.build("llama")
    torch.manual_seed(0)
    model = _BiasedLlama(config).eval()
    _small_chunks(monkeypatch, model)
    batch = _batch(model)
    want_losses, want = _reference_gradients(model, batch)
    got, _ = mask_gradients(model, batch)
    assert model.__dict__.get(chunked._UNCHUNKED) is True
    for name in want:
        assert _relative(got[name], want[name]) < 1e-5, name


def test_an_encoder_decoder_is_chunked_with_the_decoder_inputs_it_builds_from_labels(monkeypatch):
    model = tiny.marian().eval()
    _small_chunks(monkeypatch, model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (2, 6), generator=g)
    labels = torch.randint(3, model.config.vocab_size, (2, 5), generator=g)
    labels[1, 3:] = -100
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    with torch.no_grad():
        out = chunked.token_outputs(model, batch)
        logits = model(**batch).logits  # [B, T, V]: the model builds its decoder inputs from the labels
    assert out.chunked
    logp = torch.log_softmax(logits.double(), -1)
    want = -logp.gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1) * (labels != -100)
    assert _relative(out.token_nll(labels), want) < 1e-5
