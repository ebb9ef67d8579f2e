"""The safety net on families it has never seen, and surgery that is atomic.

A custom attention class (registered like any user model) is exact when it follows the usual layout,
and refused -- before the model is touched -- when it owns a per-head parameter surgery does not
slice, or reshapes by a config-wide head count (which no static scan can see).
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
from torch import nn

import headprune as hp
from headprune.core.cut import surgery
from headprune.core.safety.verify import check_model
from tiny import build, inputs


class ToyConfig(T.PretrainedConfig):
    model_type = "headprune_toy"

    def __init__(self, vocab_size=50, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, variant="plain",
                 pad_token_id=0, **kwargs):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_attention_heads, self.num_hidden_layers, self.variant = num_attention_heads, num_hidden_layers, variant
        super().__init__(pad_token_id=pad_token_id, **kwargs)


class ToyAttention(nn.Module):
    def __init__(self, config: ToyConfig, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        width = self.num_heads * self.head_dim
        self.q_proj, self.k_proj = nn.Linear(config.hidden_size, width), nn.Linear(config.hidden_size, width)
        self.v_proj, self.o_proj = nn.Linear(config.hidden_size, width), nn.Linear(width, config.hidden_size)
        if config.variant == "gate":  # a per-head parameter: surgery keeps the kept heads' entries
            self.head_gate = nn.Parameter(torch.linspace(0.5, 1.5, self.num_heads))
        if config.variant == "qnorm":  # a norm over all heads' queries at once: no subset of heads can keep it
            self.q_norm = nn.LayerNorm(width)
        if config.variant == "mix":  # "talking heads": every head's scores mix into every other's
            self.mix = nn.Parameter(torch.eye(self.num_heads) + 0.3)

    def forward(self, hidden_states, attention_mask=None):
        b, t, _ = hidden_states.shape
        heads = self.config.num_attention_heads if self.config.variant == "config_heads" else self.num_heads
        queries = self.q_norm(self.q_proj(hidden_states)) if self.config.variant == "qnorm" else self.q_proj(hidden_states)
        q, k, v = (x.view(b, t, heads, -1).transpose(1, 2) for x in (queries, self.k_proj(hidden_states),
                                                                    self.v_proj(hidden_states)))
        scores = q @ k.transpose(-1, -2) / self.head_dim**0.5  # [B, H, T, T]
        if self.config.variant == "mix":
            scores = torch.einsum("gh,bhst->bgst", self.mix, scores)
        if attention_mask is not None:
            scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, -1e9)
        z = scores.softmax(-1) @ v  # [B, H, T, hd]
        if self.config.variant == "gate":
            z = z * self.head_gate[None, :, None, None]
        return self.o_proj(z.transpose(1, 2).reshape(b, t, -1)), None  # (output, weights), as transformers' do


class ToyLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attention, self.norm = ToyAttention(config, layer_idx), nn.LayerNorm(config.hidden_size)

    def forward(self, x, attention_mask=None):
        return self.norm(x + self.attention(x, attention_mask)[0])


class ToyPreTrained(T.PreTrainedModel):
    config_class = ToyConfig
    base_model_prefix = "toy"

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.2)


class ToyForSequenceClassification(ToyPreTrained):
    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([ToyLayer(config, i) for i in range(config.num_hidden_layers)])
        self.classifier = nn.Linear(config.hidden_size, 3)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        x = self.embed(input_ids)
        for layer in self.layers[:1] if self.config.variant == "idle" else self.layers:  # "idle": layer 1 never runs
            x = layer(x, attention_mask)
        logits = self.classifier(x[:, 0])
        return T.modeling_outputs.SequenceClassifierOutput(logits=logits)


T.AutoConfig.register("headprune_toy", ToyConfig, exist_ok=True)
T.AutoModelForSequenceClassification.register(ToyConfig, ToyForSequenceClassification, exist_ok=True)


def _toy(variant: str):
    torch.manual_seed(0)
    return ToyForSequenceClassification(ToyConfig(variant=variant)).eval()


def _x():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 50, (3, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _assert_pruned_equals_masked(model, x: dict, plan: dict) -> None:
    with torch.no_grad(), hp.masked(model, hp.mask_from_heads(model, plan)):
        want = model(**x).logits
    hp.prune_heads(model, plan)
    with torch.no_grad():
        got = model(**x).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("variant", ["plain", "gate", "config_heads"])
def test_an_unseen_family_with_the_usual_layout_is_exact(variant):
    """``config_heads`` reads its head count from the model's config in forward (as Phi-3 does): each
    pruned attention gets a view of the config with its own count, and the model's config is unchanged."""
    model = _toy(variant)
    verdict = check_model(model)
    assert verdict.ok, verdict.problems
    assert {"batched mask", "pruned == masked", "save/load"} <= set(verdict.exact)
    x, plan = _x(), {"encoder.0.self": [1, 2], "encoder.1.self": [0, 1, 2, 3]}
    _assert_pruned_equals_masked(model, x, plan)
    assert model.config.num_attention_heads == ToyConfig().num_attention_heads


@pytest.mark.parametrize("variant, reason", [
    ("qnorm", r"per-head or whole-width tensors surgery does not slice: q_norm.weight \(32,\)"),
    ("mix", "pruned == masked"),  # sliced as per-head, but heads mix: caught by running the shrunk copy
    ("idle", r"sites \['encoder.1.self'\] do not run on the example inputs"),  # unchecked is not exact
])
def test_an_unseen_family_that_surgery_would_break_is_refused_untouched(variant, reason):
    model = _toy(variant)
    before, config = _state(model), copy.deepcopy(model.config.to_dict())
    with torch.no_grad():
        logits = model(**_x()).logits
    with pytest.raises(hp.UnsupportedModelError, match=reason) as refused:
        hp.prune_heads(model, {"encoder.0.self": [1]})
    assert "ToyAttention" in str(refused.value) and "headprune_toy" in str(refused.value)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert model.config.to_dict() == config
    with torch.no_grad():
        assert torch.equal(model(**_x()).logits, logits)


def test_trusting_an_unverified_family_skips_the_net():
    model = _toy("qnorm")
    hp.prune_heads(model, {"encoder.0.self": [1]}, verify=False)  # the user's call: no refusal
    assert hp.kept_heads(model)["encoder.0.self"] == [0, 2, 3]


def test_prune_heads_is_atomic_when_slicing_fails_half_way(monkeypatch):
    for family in ("bert", "llama", "t5", "gpt2"):
        model = build(family)
        x = inputs(family)
        sites = hp.find_sites(model)
        hp.prune_heads(model, {sites[0].name: [0]})  # a model pruned before: its records must survive too
        before, records = _state(model), copy.deepcopy(hp.kept_heads(model))
        classes = {name: type(m) for name, m in model.named_modules()}
        with torch.no_grad():
            want = model(**x).logits
        real, calls = surgery._slice_site, []

        def failing(*args, calls=calls, real=real, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("injected failure")
            return real(*args, **kwargs)

        monkeypatch.setattr(surgery, "_slice_site", failing)
        plan = {s.name: [0] for s in sites[:3]}  # site 0 sliced, site 1 fails, site 2 never reached
        with pytest.raises(RuntimeError, match="injected failure"):
            hp.prune_heads(model, plan)
        monkeypatch.setattr(surgery, "_slice_site", real)
        after = model.state_dict()
        assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before), family
        assert hp.kept_heads(model) == records
        assert {name: type(m) for name, m in model.named_modules()} == classes
        with torch.no_grad():
            assert torch.equal(model(**x).logits, want), family
        hp.prune_heads(model, plan)  # and the restored model can still be pruned
        assert [len(v) for v in hp.kept_heads(model).values()][:3] == [s.num_heads - 2 for s in sites[:1]] + [
            s.num_heads - 1 for s in sites[1:3]]


def test_a_removed_site_failure_restores_the_whole_site(monkeypatch):
    model = build("bert")
    x = inputs("bert")
    before = _state(model)
    with torch.no_grad():
        want = model(**x).logits
    real = surgery._remove_site

    def failing(model_, site):
        real(model_, site)
        raise RuntimeError("injected after removal")

    monkeypatch.setattr(surgery, "_remove_site", failing)
    with pytest.raises(RuntimeError, match="injected after removal"):
        hp.prune_heads(model, {"encoder.1.self": [0, 1, 2, 3]})
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        assert torch.equal(model(**x).logits, want)
    assert len(hp.find_sites(model)) == 2


def _stablelm(kv_heads: int):
    torch.manual_seed(0)
    config = T.StableLmConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                              intermediate_size=37, max_position_embeddings=64, qk_layernorm=True, vocab_size=64,
                              pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return T.StableLmForCausalLM(config).eval()


def test_per_head_norms_are_sliced_with_their_heads():
    """StableLM's qk_layernorm holds one LayerNorm per head: the kept heads keep their own norms."""
    model = _stablelm(kv_heads=4)
    norms = model.model.layers[0].self_attn.q_layernorm.norms
    weights = [norm.weight.detach().clone() + i for i, norm in enumerate(norms)]  # tell the norms apart
    with torch.no_grad():
        for norm, w in zip(norms, weights, strict=True):
            norm.weight.copy_(w)
    x = {"input_ids": torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))}
    plan = {"decoder.0.self": [0, 2], "decoder.1.self": [1]}
    _assert_pruned_equals_masked(model, x, plan)
    kept = model.model.layers[0].self_attn.q_layernorm.norms
    assert len(kept) == 2 and all(torch.equal(k.weight, weights[h]) for k, h in zip(kept, (1, 3), strict=True))


def test_per_kv_head_norms_follow_an_uneven_grouped_query_plan():
    """Query heads kept unevenly across key/value heads: a key/value head seen twice brings its own norm."""
    torch.manual_seed(0)
    model = T.StableLmForCausalLM(T.StableLmConfig(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=37,
        max_position_embeddings=64, qk_layernorm=True, vocab_size=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for i, norm in enumerate(layer.self_attn.k_layernorm.norms):
                norm.weight.add_(i)  # tell the key/value heads' norms apart
    x = {"input_ids": torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))}
    _assert_pruned_equals_masked(model, x, {"decoder.0.self": [0], "decoder.1.self": [1, 4, 5]})
    assert [(s.num_heads, s.num_kv_heads) for s in hp.find_sites(model)] == [(5, 2), (3, 2)]


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_per_head_tensors_sinks_and_norm_weights_are_sliced(kv_heads):
    """gpt-oss's attention sinks [heads] and Cohere's q/k norm weights [heads, head_dim]."""
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
                  max_position_embeddings=64, vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    models = [T.CohereForCausalLM(T.CohereConfig(intermediate_size=37, use_qk_norm=True, **common)),
              T.GptOssForCausalLM(T.GptOssConfig(head_dim=8, intermediate_size=32, num_local_experts=4,
                                                 num_experts_per_tok=2, sliding_window=4,
                                                 layer_types=["sliding_attention", "full_attention"], **common))]
    x = {"input_ids": torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))}
    for model in models:
        model.eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() <= 2 and p.shape[0] == 4 and p.shape[-1] in (4, 8):
                    p.copy_(torch.randn_like(p))  # per-head values that differ from head to head
        _assert_pruned_equals_masked(model, x, {"decoder.0.self": [1, 2], "decoder.1.self": [0]})
    sinks = models[1].model.layers[0].self_attn.sinks
    assert sinks.shape == (2,)


def test_loading_a_pruned_model_of_a_family_that_is_not_exact_is_refused(tmp_path):
    model = _toy("mix")
    hp.prune_heads(model, {"encoder.0.self": [1]}, verify=False)  # pruned on trust
    hp.save_pruned(model, tmp_path / "m")
    with pytest.raises(hp.UnsupportedModelError, match="cannot run exactly"):
        hp.load_pruned(tmp_path / "m", model_class=ToyForSequenceClassification)
    loaded = hp.load_pruned(tmp_path / "m", model_class=ToyForSequenceClassification, verify=False)
    assert hp.kept_heads(loaded)["encoder.0.self"] == [0, 2, 3]
