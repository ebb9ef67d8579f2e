"""The 1B memory benchmark's cases on its quick shape: what it measures is what the plain code computes."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import headprune as hp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import billion_envelope as be  # noqa: E402


def test_model_is_built_tied_and_initialised():
    model = be.build(be.QUICK)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert be.weight_bytes(model) == 4 * sum(p.numel() for p in model.parameters())
    reference = type(model.model.rotary_emb)(model.config)
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.inv_freq)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


def test_checkpointed_case_scores_equal_plain_importance_and_sweep_equals_masked_runs():
    n, length = 2, 24
    out = be.run_case("importance_checkpointed", be.QUICK, n, length, 3)
    assert out["parameter_grads"] == 0 and out["peak_rss_bytes"] >= out["peak_after_build_bytes"] > 0
    model = be.build(be.QUICK)
    ids = be.sequences(n, length, be.QUICK["vocab_size"])
    plain = hp.head_importance(model, [{"input_ids": ids[i : i + 1]} for i in range(n)], normalize=None)
    for name, ref in plain.items():
        got = torch.tensor(out["scores"][name])
        assert float((got - ref).abs().max()) <= 1e-5 * float(ref.abs().max()), name

    sweep = be.run_case("sweep_stream", be.QUICK, n, length, 3)
    assert sweep["extra_passes"] == 1 and len(sweep["units"]) == 3
    for row in sweep["units"]:  # perplexity of the masked model, computed here without any cache
        site = next(s for s in hp.find_sites(model) if s.name == row["site"])
        mask = torch.ones(site.num_heads)
        mask[row["head"]] = 0.0
        with torch.no_grad(), hp.masked(model, {site.name: mask}):
            nll = sum(float(torch.nn.functional.cross_entropy(model(input_ids=ids[i : i + 1]).logits[0, :-1],
                                                              ids[i, 1:], reduction="sum")) for i in range(n))
        want = float(torch.exp(torch.tensor(nll / (n * (length - 1)), dtype=torch.float64)))
        assert abs(row["perplexity"] - want) <= 1e-5 * want, row
