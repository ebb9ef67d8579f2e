"""FFN neurons: found in every family, masked == hand-zeroed weights, pruned == masked, save -> load ==
same logits, heads and neurons together, and per-example neuron gradients equal to single-example ones."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T

import headprune as hp
from headprune.core.masks.masking import masked_neurons, neuron_mask_from
from headprune.core.model.ffn import find_ffns
from headprune.core.model.kept import kept_neurons
from headprune.core.model.sites import is_conv1d
from headprune.core.prune import prune_neurons
from headprune.errors import SiteError, UnsupportedModelError
from headprune.scoring.units import unit_gradients
from tiny import FAMILIES, build, inputs, labels

EXPECTED = {"bert": ("intermediate.dense", "output.dense"), "distilbert": ("lin1", "lin2"),
            "gpt2": ("c_fc", "c_proj"), "llama": ("gate_proj", "down_proj"), "bart": ("fc1", "fc2"),
            "t5": ("wi", "wo")}


def _logits(model, x):
    with torch.no_grad():
        return model(**x).logits


def _close(got, want, rtol=1e-5):
    return (got - want).abs().max().item() <= rtol * max(want.abs().max().item(), 1e-12)


def _drops(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, f in enumerate(find_ffns(model)):
        n = f.width if i == 0 else int(torch.randint(1, f.width, (1,), generator=g))  # first FFN loses all
        out[f.name] = sorted(torch.randperm(f.width, generator=g)[:n].tolist())
    return out


def _gated_t5():
    torch.manual_seed(0)
    return T.T5ForConditionalGeneration(T.T5Config(
        d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu", vocab_size=64,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=2, relative_attention_num_buckets=8)).eval()


def _model(family):
    return _gated_t5() if family == "t5gated" else build(family)


FAMS = [*FAMILIES, "t5gated"]


@pytest.mark.parametrize("family", list(EXPECTED))
def test_each_family_names_its_ffn_projections(family):
    model = build(family)
    ffns = find_ffns(model)
    up, down = EXPECTED[family]
    named = dict(model.named_modules())
    assert len(ffns) == (4 if family in ("bart", "t5") else 2)
    for f in ffns:
        assert f.ups[0] is named[f"{f.path}.{up}"]
        assert f.down is named[f"{f.path}.{down}"]


@pytest.mark.parametrize("family", FAMS)
def test_mask_equals_hand_zeroed_and_surgery_equals_mask(family):
    model = _model(family)
    x = inputs("t5" if family == "t5gated" else family)
    drops = _drops(model)
    with masked_neurons(model, neuron_mask_from(model, drops)):
        masked = _logits(model, x)
    zeroed = copy.deepcopy(model)  # the reference: the dropped neurons' columns of the down projection zeroed
    for f in find_ffns(zeroed):
        with torch.no_grad():
            w = f.down.weight
            if is_conv1d(f.down):
                w[drops[f.name], :] = 0.0
            else:
                w[:, drops[f.name]] = 0.0
    assert _close(masked, _logits(zeroed, x))
    assert not _close(masked, _logits(model, x), 1e-3)  # the mask changed something
    pruned = copy.deepcopy(model)
    kept = prune_neurons(pruned, drops)
    assert _close(_logits(pruned, x), masked)
    widths = {g.name: g.width for g in find_ffns(model)}
    for f in find_ffns(pruned):  # GPT-2's Conv1D keeps one zeroed neuron where all are dropped
        emptied = family == "gpt2" and len(drops[f.name]) == widths[f.name]
        assert f.width == len(kept[f.name]) == widths[f.name] - len(drops[f.name]) + emptied


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "bart", "t5", "t5gated", "distilbert"])
def test_heads_and_neurons_pruned_save_load_round_trip(family, tmp_path):
    model = _model(family)
    x = inputs("t5" if family == "t5gated" else family)
    heads = {s.name: [0] for s in hp.find_sites(model)[:2]}
    drops = _drops(model, seed=3)
    with hp.masked(model, hp.mask_from_heads(model, heads)), masked_neurons(model, neuron_mask_from(model, drops)):
        want = _logits(model, x)
    hp.prune_heads(model, heads, verify=False)
    kept = prune_neurons(model, drops)
    assert _close(_logits(model, x), want)
    loaded = hp.load_pruned(hp.save_pruned(model, tmp_path / "m"))
    assert _close(_logits(loaded, x), want, 1e-6)
    assert kept_neurons(loaded) == kept


def test_neurons_only_pruned_model_saves_as_pruned_and_reloads(tmp_path):
    model = build("bert")
    x = inputs("bert")
    prune_neurons(model, {"encoder.1.ffn": [0, 5, 7]})
    path = hp.save_pruned(model, tmp_path / "m")
    with pytest.raises((ValueError, OSError)):
        T.BertForSequenceClassification.from_pretrained(path)  # refused loudly by plain transformers
    loaded = hp.load_pruned(path)
    assert find_ffns(loaded)[1].width == 34 and _close(_logits(loaded, x), _logits(model, x), 1e-6)


def test_bad_names_and_indices_are_refused_before_anything_changes():
    model = build("bert")
    with pytest.raises(SiteError, match="encoder.9.ffn"):
        prune_neurons(model, {"encoder.9.ffn": [0]})
    with pytest.raises(ValueError, match="out of range"):
        prune_neurons(model, {"encoder.0.ffn": [0, 37]})
    assert [f.width for f in find_ffns(model)] == [37, 37]


def test_mixture_of_experts_is_refused():
    torch.manual_seed(0)
    moe = T.MixtralForCausalLM(T.MixtralConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                               num_key_value_heads=2, intermediate_size=16, vocab_size=64,
                                               num_local_experts=2, num_experts_per_tok=1))
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        find_ffns(moe)


@pytest.mark.parametrize("family", ["bert", "llama", "t5"])
def test_per_example_neuron_and_head_gradients_match_single_examples(family):
    """One backward for a batch gives each example's own dL_b/dm, checked against the batch of one."""
    model = build(family)
    x = inputs(family, batch=3, pad=False)
    batch = {**x, "labels": labels(family, x)}
    heads, neurons, valid = unit_gradients(model, batch)
    assert valid.all()
    for b in range(3):
        one = {k: v[b:b + 1] for k, v in batch.items()}
        h1, n1, _ = unit_gradients(model, one)
        for name in n1:
            assert _close(neurons[name][b], n1[name][0], 1e-4)
        for name in h1:
            assert _close(heads[name][b], h1[name][0], 1e-4)
    # the reference for the neuron gradient: a finite difference of the model's own loss
    model.double()
    f = find_ffns(model)[0]
    one = {k: v[:1] for k, v in batch.items()}
    _, n1, _ = unit_gradients(model, one)
    i = int(n1[f.name][0].abs().argmax())
    eps = 1e-2  # large enough that float32 norms inside some families (Llama RMSNorm) do not swamp it

    def loss(scale):
        m = torch.ones(f.width, dtype=torch.float64)
        m[i] = scale
        with masked_neurons(model, {f.name: m}), torch.no_grad():
            logits = model(**{k: v for k, v in one.items() if k != "labels"}).logits.double()
        y = one["labels"]
        if family == "llama":  # next-token loss, computed here in float64 (the model's own is float32)
            logits, y = logits[:, :-1], y[:, 1:]
        return float(torch.nn.functional.cross_entropy(logits.flatten(0, -2), y.flatten(), ignore_index=-100))

    fd = (loss(1 + eps) - loss(1 - eps)) / (2 * eps)
    assert abs(fd - float(n1[f.name][0, i])) <= 2e-2 * abs(fd)


@pytest.mark.parametrize("family", ["gpt2", "bert"])
def test_ffn_names_survive_a_layer_losing_every_head(family, tmp_path):
    model = build(family)
    names = [f.name for f in find_ffns(model)]
    site = hp.find_sites(model)[1]
    hp.prune_heads(model, {site.name: list(range(site.num_heads))}, verify=False)
    assert [f.name for f in find_ffns(model)] == names
    prune_neurons(model, {names[1]: [0, 1]})
    loaded = hp.load_pruned(hp.save_pruned(model, tmp_path / "m"))
    assert [f.name for f in find_ffns(loaded)] == names and kept_neurons(loaded) == kept_neurons(model)


def test_heads_only_work_on_a_mixture_of_experts_model_skips_its_ffns():
    from headprune.compression import PruneSettings, compress

    torch.manual_seed(0)
    moe = T.MixtralForCausalLM(T.MixtralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, intermediate_size=16, vocab_size=64,
                                               num_local_experts=2, num_experts_per_tok=1)).eval()
    assert find_ffns(moe, skip_moe=True) == []
    x = inputs("llama", batch=4)
    batches = [{**x, "labels": labels("llama", x)}, {**x, "labels": labels("llama", x, seed=5)}]
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        compress(moe, batches, PruneSettings(share=0.5, units="both", seq_len=8), verify=False)
    result = compress(moe, batches, PruneSettings(share=0.5, units="heads", seq_len=8, compensate="reconstruct"),
                      verify=False)
    assert result.sizes["after"]["heads"] < result.sizes["before"]["heads"] and result.sizes["after"]["neurons"] == 0
