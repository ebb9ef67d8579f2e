"""Scoring uses a loss checked against the model's own ``.loss``, whatever the class is called (issue 24).

Whether token labels are shifted is decided by what the model does: a decoder-only
``*ForConditionalGeneration`` (Gemma 3 with a tiny text and vision config) is scored on the shifted loss
its own ``.loss`` computes, and its importance equals a brute force written here without headprune's
masking; a model whose own loss headprune cannot reproduce is refused for scoring, with the way out
(``loss_fn=``) in the message.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T

import headprune as hp
from headprune.scoring import per_example_loss
from headprune.scoring.gradients import own_loss_check


def gemma3_conditional_generation() -> T.Gemma3ForConditionalGeneration:
    config = T.Gemma3Config(
        text_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         intermediate_size=37, vocab_size=64, max_position_embeddings=64, sliding_window=16),
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4, image_token_index=63, boi_token_index=61, eoi_token_index=62)
    torch.manual_seed(0)
    return T.Gemma3ForConditionalGeneration(config).double().eval()


def _batches(seed: int = 1, labels: bool = False) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        ids = torch.randint(3, 60, (3, 10), generator=g)
        mask = torch.ones_like(ids)
        mask[1, -3:] = 0  # right padding on one row
        out.append({"input_ids": ids, "attention_mask": mask})
        if labels:  # as the issue found it: labels=input_ids, scored unshifted before
            out[-1]["labels"] = ids.masked_fill(mask == 0, -100)
    return out


def _brute_force(model, batches) -> dict[str, torch.Tensor]:
    """Per example: d(model(...).loss)/d(xi_h) by autograd on a mask applied by a hook written here
    (the input of each output projection times xi repeated over head_dim), |.|, mean, l2 per site."""
    sites = hp.find_sites(model)
    totals = {s.name: torch.zeros(s.num_heads, dtype=torch.float64) for s in sites}
    n = 0
    for p in model.parameters():
        p.requires_grad_(False)
    for batch in batches:
        for b in range(batch["input_ids"].shape[0]):
            xi = {s.name: torch.ones(s.num_heads, dtype=torch.float64, requires_grad=True) for s in sites}
            hooks = []
            for s in sites:
                def pre(module, args, xi=xi[s.name], h=s.num_heads):
                    x = args[0]  # [..., heads * head_dim]
                    return (x * xi.repeat_interleave(x.shape[-1] // h).to(x.dtype),) + tuple(args[1:])
                hooks.append(s.o.register_forward_pre_hook(pre))
            try:
                row = {k: v[b:b + 1] for k, v in batch.items() if k != "labels"}
                labels = row["input_ids"].masked_fill(row["attention_mask"] == 0, -100)
                loss = model(**row, labels=labels, use_cache=False).loss  # the model's own loss
                grads = torch.autograd.grad(loss, list(xi.values()), allow_unused=True)
            finally:
                for h in hooks:
                    h.remove()
            for name, g in zip(xi, grads, strict=True):
                if g is not None:
                    totals[name] += g.abs()
            n += 1
    means = {k: t / n for k, t in totals.items()}
    return {k: m / m.norm().clamp_min(1e-20) for k, m in means.items()}


@pytest.mark.parametrize("labels", [True, False], ids=["labels=input_ids", "no labels"])
def test_decoder_only_conditional_generation_is_scored_on_its_own_shifted_loss(labels):
    model = gemma3_conditional_generation()
    assert not model.config.is_encoder_decoder and not type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
    batches = _batches(labels=labels)
    want = _brute_force(copy.deepcopy(model), batches)
    got = hp.head_importance(model, batches)
    assert set(got) == set(want)
    for name in want:
        scale = float(want[name].abs().max()) or 1.0
        assert torch.allclose(got[name].double(), want[name], rtol=0, atol=1e-4 * scale), (name, got[name], want[name])
    assert any(float(w.abs().max()) > 0 for w in want.values())  # something was scored


def test_the_check_reads_the_model_and_is_kept_on_it():
    model = gemma3_conditional_generation()
    batch = _batches()[0]
    with torch.no_grad():
        assert own_loss_check(model, batch, model(**batch)) is True  # it shifts, though its name does not say so
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        own_loss_check(model, batch, model(**batch))
    assert len(calls) == 1  # the answer is kept: no second check forward


class _ScaledLoss(torch.nn.Module):
    """A token classifier whose own loss is twice the cross-entropy: a loss headprune cannot reproduce."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inner = T.BertForTokenClassification(T.BertConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37,
            num_labels=5, max_position_embeddings=64))
        self.config = self.inner.config

    def forward(self, input_ids, attention_mask=None, labels=None):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        if out.loss is not None:
            out.loss = out.loss * 2
        return out


def test_a_model_whose_own_loss_differs_is_refused_for_scoring_with_the_way_out():
    model = _ScaledLoss().eval()
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(3, 60, (2, 7), generator=g), "labels": torch.randint(0, 5, (2, 7), generator=g)}
    with pytest.raises(hp.UnsupportedModelError, match="loss_fn=") as e:
        hp.head_importance(model, [batch])
    assert "_ScaledLoss" in str(e.value)
    # with the user's own loss the same model scores
    scores = hp.head_importance(model, [batch], loss_fn=lambda out, b: out.logits.logsumexp(-1).mean(-1))
    assert all(torch.isfinite(s).all() for s in scores.values())


def test_token_classification_is_not_shifted():
    torch.manual_seed(0)
    model = T.BertForTokenClassification(T.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37, num_labels=5,
        max_position_embeddings=64)).eval()
    g = torch.Generator().manual_seed(0)
    batch = {"input_ids": torch.randint(3, 60, (2, 7), generator=g), "labels": torch.randint(0, 5, (2, 7), generator=g)}
    with torch.no_grad():
        out = model(**batch)
        assert own_loss_check(model, batch, out) is False
        losses, valid = per_example_loss(model, batch, out)
    assert valid.all() and abs(float(losses.mean()) - float(out.loss)) <= 1e-5 * float(out.loss)
