"""save -> load gives the same logits; bad input raises typed errors that name what is allowed."""

from __future__ import annotations

import json

import pytest
import torch

import headprune as hp
from tiny import build, inputs

PLANS = {
    "bert": {"encoder.0.self": [0, 1, 2, 3], "encoder.1.self": [1]},
    "llama": {"decoder.0.self": [0], "decoder.1.self": [3, 4, 5]},
    "t5": {"encoder.0.self": [0, 2], "decoder.0.cross": [0, 1, 2, 3], "decoder.1.self": [1]},
    "gpt2": {"decoder.1.self": [0, 3]},
    "bart": {"decoder.0.self": [0, 1, 2, 3], "encoder.1.self": [2]},
}


@pytest.mark.parametrize("family", list(PLANS))
def test_save_load_same_logits_and_prunable_again(family, tmp_path):
    model = build(family)
    hp.prune_heads(model, PLANS[family])
    x = inputs(family)
    with torch.no_grad():
        want = model(**x).logits
    hp.save_pruned(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["headprune_kept_heads"] == {k: v for k, v in hp.kept_heads(model).items() if k in config["headprune_kept_heads"]}
    assert not list((tmp_path / "m").glob("*.bin")) and not list((tmp_path / "m").glob("*.pt"))  # no pickle
    loaded = hp.load_pruned(tmp_path / "m")
    loaded.set_attn_implementation("eager")
    with torch.no_grad():
        got = loaded(**x).logits
    assert (got - want).abs().max().item() <= 1e-6
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in model.parameters())
    site = hp.find_sites(loaded)[-1]
    hp.prune_heads(loaded, {site.name: [0]})
    hp.prune_heads(model, {site.name: [0]})
    with torch.no_grad():
        assert (loaded(**x).logits - model(**x).logits).abs().max().item() <= 1e-6


def test_load_unpruned_directory_and_missing_path(tmp_path):
    model = build("bert")
    hp.save_pruned(model, tmp_path / "plain")
    loaded = hp.load_pruned(tmp_path / "plain")
    assert [s.num_heads for s in hp.find_sites(loaded)] == [4, 4]
    with pytest.raises(hp.PlanError, match="config.json"):
        hp.load_pruned(tmp_path / "nowhere")


def test_plan_for_a_different_model_is_refused(tmp_path):
    model = build("bert")
    hp.prune_heads(model, {"encoder.1.self": [0]})
    hp.save_pruned(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["headprune_original_heads"]["encoder.1.self"] = 12
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(hp.PlanError, match="different model"):
        hp.load_pruned(tmp_path / "m")
    with pytest.raises(hp.PlanError, match="unknown site 'decoder.0.self'"):
        hp.replay_kept_heads(build("bert"), {"decoder.0.self": [0]})


@pytest.mark.parametrize(
    "heads, error, pattern",
    [
        ({"encoder.9.self": [0]}, hp.PlanError, r"unknown site 'encoder.9.self'.*allowed: encoder.0.self"),
        ({"encoder.0.self": [4]}, hp.PlanError, r"head index 4 out of range; allowed: integers 0..3"),
        ({"encoder.0.self": [-1]}, hp.PlanError, r"head index -1"),
        ({"encoder.0.self": ["a"]}, hp.PlanError, r"head index 'a'"),
        ({"encoder.0.self": 3}, hp.PlanError, r"must be a list of head indices"),
        ([("encoder.0.self", [0])], hp.PlanError, r"must be a mapping"),
    ],
)
def test_bad_plans(heads, error, pattern):
    model = build("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=pattern):
        hp.prune_heads(model, heads)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing half-done


@pytest.mark.parametrize(
    "mask, pattern",
    [
        ({"encoder.7.self": torch.ones(4)}, r"unknown site 'encoder.7.self'; allowed: encoder.0.self, encoder.1.self"),
        ({"encoder.0.self": torch.ones(5)}, r"shape \(5,\); allowed: \(4,\) or \(batch, 4\)"),
        ({"encoder.0.self": torch.ones(2, 3, 4)}, r"shape \(2, 3, 4\)"),
        ({"encoder.0.self": torch.tensor([1.0, float("nan"), 1.0, 1.0])}, r"non-finite"),
        ({"encoder.0.self": torch.ones(2, 4), "encoder.1.self": torch.ones(3, 4)}, r"batch 3 .* batch 2"),
        ("encoder.0.self", r"must be a mapping"),
    ],
)
def test_bad_masks(mask, pattern):
    model = build("bert")
    with pytest.raises((hp.MaskError, hp.SiteError), match=pattern):
        hp.mask_heads(model, mask)
    assert not hp.is_masked(model)


def test_pruning_a_masked_model_is_refused():
    model = build("bert")
    with hp.masked(model, hp.ones_mask(model)), pytest.raises(hp.PlanError, match="unmask"):
        hp.prune_heads(model, {"encoder.0.self": [0]})


def test_list_masks_and_integer_masks_are_accepted():
    model = build("bert")
    x = inputs("bert")
    with torch.no_grad():
        with hp.masked(model, {"encoder.0.self": [1, 0, 1, 1]}):
            a = model(**x).logits
        with hp.masked(model, {"encoder.0.self": torch.tensor([1, 0, 1, 1])}):
            b = model(**x).logits
    assert torch.equal(a, b)


def test_pruning_a_model_whose_config_another_pruned_model_shares_is_refused():
    first = build("bert")
    second = type(first)(first.config)  # one config object, two models
    hp.prune_heads(first, {"encoder.0.self": [0, 1]})
    before = {k: v.clone() for k, v in second.state_dict().items()}
    with pytest.raises(hp.PlanError, match="shared with another model"):
        hp.prune_heads(second, {"encoder.1.self": [0]})
    after = second.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # refused before any change


def test_nan_weights_are_refused_by_scoring_and_evaluation():
    from headprune.evaluation import Classification

    model = build("bert")
    with torch.no_grad():
        model.bert.encoder.layer[1].attention.self.query.weight[0, 0] = float("nan")
    x = inputs("bert")
    x["labels"] = torch.tensor([0, 1, 2])
    refused = r"parameter 'bert.encoder.layer.1.attention.self.query.weight' of BertForSequenceClassification is not " \
              r"finite: 1 NaN of 1024 values \(the first at index \[0, 0\]\)"
    with pytest.raises(hp.DataError, match=refused):
        hp.head_importance(model, [x])
    with pytest.raises(hp.DataError, match=refused):
        hp.fisher_information(model, [x])

    class Words:  # a tokenizer-free evaluator input: token ids as text
        pad_token_id = 0

        def __call__(self, texts, text_pair=None, truncation=True, max_length=None):
            return {"input_ids": [[1] + [3 + len(w) % 60 for w in t.split()] for t in texts]}

    task = Classification(Words(), (["a bb ccc", "dd e"], ["0", "1"]), config=model.config)
    with pytest.raises(hp.DataError, match=refused):
        task.evaluate(model)
