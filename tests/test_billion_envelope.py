"""The 1B memory benchmark's cases on its quick shape: what it measures is what the plain code computes."""

from __future__ import annotations

import json
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


def test_compress_selected_is_the_selected_configuration_in_low_memory_and_prunes_as_the_normal_path():
    from peers.headprune_rows import settings_for

    n, length = 2, 24
    out = be.run_case("compress_selected", be.QUICK, n, length, 0)
    settings = out["settings"]
    assert settings["low_memory"] is True and settings["scores"] == "fisher"
    assert settings["compensate"] == [{"name": "linear", "damping": 0.3}]  # the method with its own setting
    assert out["stages"]["linear"].startswith("kept") and out["neurons_dropped"] > 0
    model = be.build(be.QUICK)
    want = settings_for(be.SELECTED, model, be.BUDGET)
    assert settings == {**want.to_dict(), "low_memory": True}
    ids = be.sequences(n, length, be.QUICK["vocab_size"])
    normal = hp.compress(model, [{"input_ids": ids[i : i + 1], "attention_mask": torch.ones_like(ids[i : i + 1])}
                                 for i in range(n)], want)
    assert out["params_after"] == normal.sizes["after"]["params"] < out["params"]
    assert out["heads_dropped"] == sum(map(len, normal.dropped_heads.values()))
    assert out["peak_over_weights"] == out["peak_rss_bytes"] / out["weight_bytes"]
    assert set(out["load"]) >= {"other_cpu", "cores", "before", "after"}


def test_growth_run_fits_the_law_and_its_docs_section_says_what_the_json_does(tmp_path):
    import numpy as np

    path = tmp_path / "scale.json"
    be.main(["--growth", "--quick", "--calib-blocks", "2", "--calib-length", "16", "--output", str(path)])
    data = json.loads(path.read_text())
    assert list(data["shapes"]) == list(be.GROWTH_QUICK)
    rows = list(data["shapes"].values())
    assert [r["params"] for r in rows] == sorted(r["params"] for r in rows)
    slope = np.polyfit(np.log([r["params"] for r in rows]), np.log([r["seconds"] for r in rows]), 1)[0]
    assert abs(data["alpha"] - slope) <= 1e-9 * max(1.0, abs(slope))
    assert data["meets_goal"] == (rows[-1]["peak_over_weights"] <= 1.5)
    assert data["config"]["calib_blocks"] == 2 and data["config"]["calib_length"] == 16
    _section_matches(data)


def _section_matches(data: dict) -> None:
    text = be.scale_section(data)
    for name, f in data["shapes"].items():
        assert f"| {name} | {f['params'] / 1e6:,.0f}M |" in text and f"| {f['peak_over_weights']:.2f} |" in text
    assert f"parameters^{data['alpha']:.2f}" in text
    last = list(data["shapes"].values())[-1]
    assert (": met (" in text) == data["meets_goal"] and f"({last['peak_over_weights']:.2f}x)" in text



def test_the_docs_section_is_the_committed_json():
    data = json.loads(be.SCALE_OUTPUT.read_text())
    _section_matches(data)
    page = (be.ROOT / "docs" / "llms.md").read_text()
    section = page.split(be.BEGIN, 1)[1].split(be.END, 1)[0].strip()
    assert section == be.scale_section(data), "run: python benchmarks/billion_envelope.py --write-docs docs/llms.md"
    assert list(data["shapes"]) == list(be.GROWTH) and data["config"]["low_memory"] is True
