"""A left-padded causal-LM row scores only targets predicted from real tokens (never from a pad position)."""

from __future__ import annotations

import pytest
import torch

from headprune.scoring.gradients import per_example_loss
from tiny import build, inputs


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_left_padded_row_loss_is_the_models_own_loss_without_the_target_after_padding(family):
    model = build(family).eval()
    batch = inputs(family, batch=3, length=7)
    assert (batch["attention_mask"][-1, :2] == 0).all()  # the last row is left-padded by two tokens
    with torch.no_grad():
        out = model(**batch)
        losses, valid = per_example_loss(model, batch, out)
        for b in range(3):
            row = {k: v[b:b + 1] for k, v in batch.items()}
            labels = row["input_ids"].masked_fill(row["attention_mask"] == 0, -100)
            pads = int((row["attention_mask"] == 0).sum())
            if pads:
                labels[0, pads] = -100  # predicted from the last pad position: nothing to predict from
            want = model(**row, labels=labels).loss  # the model's own loss, hand-labelled
            assert valid[b]
            assert losses[b].item() == pytest.approx(want.item(), rel=1e-5)
