"""The prefix cache under ``generate`` (greedy and beam search) on an encoder-decoder equals the naive sweep.

Naive: every head masked in turn and every sentence generated from scratch. Cached: the unmasked run's
encoder block outputs recorded once and the blocks below the masked site replayed (decoder blocks run
once per generated token, so they are always computed). Translations and BLEU statistics must be
identical, and the replay must really skip blocks (else the comparison proves nothing).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import headprune as hp
from headprune.evaluation import Translation
from headprune.experiments.ablation import SweepSettings, one_head_ablation
from headprune.experiments.prefix_cache import recording, replaying
from tiny import build, word_tokenizer

WORDS = [f"w{i}" for i in range(40)]


@pytest.fixture(scope="module")
def setup():
    rng = random.Random(0)
    sources = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(6)]
    targets = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) for _ in range(6)]
    tok = word_tokenizer(sources + targets, bos_eos=True)
    torch.manual_seed(0)
    model = build("marian")
    with torch.no_grad():  # larger weights: random models otherwise emit one token whatever the mask
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(4.0)
    return model, tok, (sources, targets)


@pytest.mark.parametrize("beams", [1, 2])
def test_cached_generate_equals_naive_generate_for_every_head(setup, beams):
    model, tok, data = setup
    task = Translation(tok, data, batch_size=3, num_beams=beams, max_new_tokens=8)
    sites = hp.find_sites(model)
    with recording(model, sites, decoder_replay=False) as cache:
        base = task.evaluate(model)
    first_encoder_block = model.get_submodule("model.encoder.layers.0.self_attn")  # runs only if block 0 runs
    calls = []
    handle = first_encoder_block.register_forward_hook(lambda *_: calls.append(1))
    changed = 0
    try:
        for site in sites:
            for head in range(site.num_heads):
                mask = {site.name: torch.ones(site.num_heads)}
                mask[site.name][head] = 0.0
                naive = task.evaluate(model, mask)
                calls.clear()
                with replaying(cache, site):
                    cached = task.evaluate(model, mask)
                assert cached.extra["hypotheses"] == naive.extra["hypotheses"], (site.name, head)
                np.testing.assert_array_equal(cached.per_example["bleu_stats"], naive.per_example["bleu_stats"])
                if site.kind != "encoder" or site.layer > 0:  # the first encoder block was replayed, not run
                    assert not calls, (site.name, head)
                changed += naive.extra["hypotheses"] != base.extra["hypotheses"]
    finally:
        handle.remove()
    assert changed >= len(sites)  # masks do change the translations: the equality is not trivial


def test_sweep_with_and_without_the_cache_agree(setup):
    model, tok, data = setup
    task = Translation(tok, data, batch_size=3, num_beams=2, max_new_tokens=8)
    sites = ["encoder.1.self", "decoder.1.cross"]
    fast = one_head_ablation(model, task, sites=sites, settings=SweepSettings(), progress=False)
    slow = one_head_ablation(model, task, sites=sites, settings=SweepSettings(prefix_cache=False),
                             progress=False)
    assert [r["score"] for r in fast.rows] == [r["score"] for r in slow.rows]
    assert fast.base.score == slow.base.score and len({r["score"] for r in fast.rows}) > 2
