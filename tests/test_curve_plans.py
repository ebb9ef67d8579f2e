"""The pruning curve's Fisher orders run through the head plan (``PruneSettings`` with a count override): the
plain ``fisher`` order masks the lowest-Fisher heads, and every order's last step masks every head."""

from __future__ import annotations

import random

import pytest

import headprune as hp
from headprune.evaluation import LanguageModelling
from headprune.experiments.curves import CurveInputs, CurveSettings, pruning_curves
from tiny import build, word_tokenizer


def _texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice("a b c d e f g h i j".split()) for _ in range(40)) for _ in range(12)]


def test_fisher_orders_mask_the_lowest_fisher_heads_and_end_with_none_kept():
    texts, calib_texts = _texts(0), _texts(1)
    tok = word_tokenizer(texts + calib_texts)
    model = build("gpt2")
    ev = LanguageModelling(tok, texts, block_size=16, batch_size=16)
    calib = list(LanguageModelling(tok, calib_texts, block_size=16, batch_size=8).batches())
    settings = CurveSettings(fractions=(0.0, 0.5, 1.0), orders=("fisher", "fisher+tune"))
    rows = pruning_curves(model, ev, settings=settings, inputs=CurveInputs(calibration=lambda: calib), progress=False)
    by = {(r["order"], r["fraction"]): r for r in rows}
    diag = hp.fisher_information(model, calib).diag  # the reference: the Fisher diagonal ranked by lowest_heads
    half = ev.evaluate(model, hp.mask_from_heads(model, hp.lowest_heads(diag, fraction=0.5)))
    assert by[("fisher", 0.5)]["score"] == pytest.approx(half.score, rel=1e-9)
    everything = {s.name: list(range(s.num_heads)) for s in hp.find_sites(model)}
    none_kept = ev.evaluate(model, hp.mask_from_heads(model, everything))
    for order in settings.orders:  # n_keep 0: below what PruneSettings allows, through plan_heads' override
        assert by[(order, 1.0)]["score"] == pytest.approx(none_kept.score, rel=1e-9), order
