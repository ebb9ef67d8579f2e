"""One core (issue 23): heads and neurons through one mask and one surgery contract, and a fast start.

Neuron surgery now keeps the heads' promises: refused inside an active mask, atomic when a cut fails half
way, and verified on a shrunk copy first -- so an FFN that mixes its intermediate features (a norm over
them) is refused before it is touched, while a plain FFN prunes exactly. ``headprune --version`` and
``--help`` import neither torch nor transformers.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as T
from torch import nn

import headprune as hp
from headprune.core.cut import neurons
from headprune.core.masks.masking import masked_neurons, neuron_mask_from
from headprune.core.model.records import KEPT_NEURONS_KEY
from headprune.errors import PlanError, UnsupportedModelError
from tiny import build, inputs

SRC = Path(__file__).resolve().parents[1] / "src"


class FfnToyConfig(T.PretrainedConfig):
    model_type = "headprune_ffn_toy"

    def __init__(self, vocab_size=50, hidden_size=16, num_attention_heads=2, intermediate_size=12,
                 num_hidden_layers=2, variant="plain", pad_token_id=0, **kwargs):
        self.vocab_size, self.hidden_size, self.intermediate_size = vocab_size, hidden_size, intermediate_size
        self.num_attention_heads, self.num_hidden_layers, self.variant = num_attention_heads, num_hidden_layers, variant
        super().__init__(pad_token_id=pad_token_id, **kwargs)


class FfnToyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        width = self.num_heads * self.head_dim
        self.q_proj, self.k_proj = nn.Linear(config.hidden_size, width), nn.Linear(config.hidden_size, width)
        self.v_proj, self.o_proj = nn.Linear(config.hidden_size, width), nn.Linear(width, config.hidden_size)

    def forward(self, x, attention_mask=None):
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, self.num_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-1, -2) / self.head_dim**0.5  # [B, H, T, T]
        if attention_mask is not None:
            scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, -1e9)
        z = scores.softmax(-1) @ v  # [B, H, T, hd]
        return self.o_proj(z.transpose(1, 2).reshape(b, t, -1)), None


class FfnToyMLP(nn.Module):
    """fc1 -> gelu -> (variant) -> fc2; "norm": a LayerNorm over the intermediate features, "l2": each
    position's intermediate vector scaled to unit length (no parameters: only the values can tell)."""

    def __init__(self, config):
        super().__init__()
        self.variant = config.variant
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)
        if config.variant == "norm":
            self.inner_norm = nn.LayerNorm(config.intermediate_size)

    def forward(self, x):
        h = nn.functional.gelu(self.fc1(x))  # [B, T, width]
        if self.variant == "norm":
            h = self.inner_norm(h)
        elif self.variant == "l2":
            h = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-6)
        return self.fc2(h)


class FfnToyLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention, self.mlp = FfnToyAttention(config), FfnToyMLP(config)
        self.norm1, self.norm2 = nn.LayerNorm(config.hidden_size), nn.LayerNorm(config.hidden_size)

    def forward(self, x, attention_mask=None):
        x = self.norm1(x + self.attention(x, attention_mask)[0])
        return self.norm2(x + self.mlp(x))


class FfnToyForSequenceClassification(T.PreTrainedModel):
    config_class = FfnToyConfig
    base_model_prefix = "ffn_toy"

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([FfnToyLayer(config) for _ in range(config.num_hidden_layers)])
        self.classifier = nn.Linear(config.hidden_size, 3)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.3)

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, attention_mask)
        return T.modeling_outputs.SequenceClassifierOutput(logits=self.classifier(x[:, 0]))


T.AutoConfig.register("headprune_ffn_toy", FfnToyConfig, exist_ok=True)
T.AutoModelForSequenceClassification.register(FfnToyConfig, FfnToyForSequenceClassification, exist_ok=True)


def _toy(variant: str = "plain"):
    torch.manual_seed(0)
    return FfnToyForSequenceClassification(FfnToyConfig(variant=variant)).eval()


def _x() -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 50, (3, 6), generator=g)
    mask = torch.ones_like(ids)
    mask[-1, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_state(before: dict, model) -> bool:
    after = model.state_dict()
    return before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


PLAN = {"encoder.0.ffn": [0, 3, 5], "encoder.1.ffn": [1, 2, 7, 11]}


def test_the_toy_ffns_are_found():
    assert [(f.name, f.width) for f in hp.find_ffns(_toy())] == [("encoder.0.ffn", 12), ("encoder.1.ffn", 12)]


def test_prune_neurons_inside_an_active_neuron_mask_is_refused():
    model, x = _toy(), _x()
    before = _state(model)
    with masked_neurons(model, neuron_mask_from(model, PLAN)):
        with torch.no_grad():
            want = model(**x).logits
        with pytest.raises(PlanError, match="neuron mask"):
            hp.prune_neurons(model, PLAN)
        assert _same_state(before, model)
        with torch.no_grad():  # the mask still runs: nothing was cut under it
            assert torch.equal(model(**x).logits, want)
    with hp.masked(model, hp.mask_from_heads(model, {"encoder.0.self": [0]})), pytest.raises(PlanError, match="masked"):
        hp.prune_neurons(model, PLAN)  # a head mask counts too: one contract for every mask
    assert _same_state(before, model) and not hasattr(model.config, KEPT_NEURONS_KEY)


def test_prune_heads_inside_an_active_neuron_mask_is_refused():
    model = _toy()
    with masked_neurons(model, neuron_mask_from(model, PLAN)), pytest.raises(PlanError, match="neuron mask"):
        hp.prune_heads(model, {"encoder.0.self": [0]})
    assert [s.num_heads for s in hp.find_sites(model)] == [2, 2]


@pytest.mark.parametrize("family", ["plain", "gpt2", "llama"])
def test_a_neuron_cut_failing_half_way_restores_the_model_bit_for_bit(monkeypatch, family):
    model = _toy() if family == "plain" else build(family)
    x = _x() if family == "plain" else inputs(family)
    ffns = hp.find_ffns(model)
    hp.prune_neurons(model, {ffns[0].name: [0]})  # a model pruned before: its records must survive too
    before, records = _state(model), copy.deepcopy(hp.kept_neurons(model))
    widths = [f.width for f in hp.find_ffns(model)]
    with torch.no_grad():
        want = model(**x).logits
    real, calls = neurons._cut_ffn, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(neurons, "_cut_ffn", failing)
    plan = {f.name: [1, 2] for f in ffns}  # FFN 0 cut, FFN 1 fails
    with pytest.raises(RuntimeError, match="injected failure"):
        hp.prune_neurons(model, plan)
    monkeypatch.setattr(neurons, "_cut_ffn", real)
    assert len(calls) == 2
    assert _same_state(before, model), family
    assert hp.kept_neurons(model) == records and [f.width for f in hp.find_ffns(model)] == widths
    with torch.no_grad():
        assert torch.equal(model(**x).logits, want), family
    hp.prune_neurons(model, plan)  # and the restored model can still be pruned
    assert [f.width for f in hp.find_ffns(model)] == [w - 2 for w in widths]


def test_a_restored_cut_keeps_hooks_registered_before_it_removable(monkeypatch):
    """The snapshot refills a module's hook dictionaries rather than replacing them: a handle taken before the
    failed cut still removes its hook afterwards (a replaced dictionary would keep the hook running forever)."""
    model, x = build("llama"), inputs("llama")
    ffn = hp.find_ffns(model)[1]
    calls: list[int] = []
    handle = ffn.down.register_forward_pre_hook(lambda _m, _a: calls.append(1))
    real = neurons._cut_ffn

    def failing(f, drop):
        real(f, drop)
        raise RuntimeError("injected failure")

    monkeypatch.setattr(neurons, "_cut_ffn", failing)
    with pytest.raises(RuntimeError, match="injected failure"):
        hp.prune_neurons(model, {ffn.name: [0, 1]}, verify=False)
    with torch.no_grad():
        model(**x)
    assert calls == [1]  # the hook runs on the restored module
    handle.remove()
    with torch.no_grad():
        model(**x)
    assert calls == [1]  # and its handle removed it


@pytest.mark.parametrize("variant", ["norm", "l2"])
def test_an_ffn_that_mixes_its_intermediate_features_is_refused_before_any_change(variant):
    model = _toy(variant)
    before = _state(model)
    with pytest.raises(UnsupportedModelError, match="neurons pruned == masked") as refused:
        hp.prune_neurons(model, PLAN)
    assert "Nothing was changed" in str(refused.value)
    assert _same_state(before, model)
    assert [f.width for f in hp.find_ffns(model)] == [12, 12]
    assert not hasattr(model.config, KEPT_NEURONS_KEY) and not hasattr(model.config, "headprune_kept_heads")
    hp.prune_heads(model, {"encoder.0.self": [1]})  # its heads are another matter: they prune exactly


def test_a_plain_ffn_is_verified_and_pruned_exactly():
    model, x = _toy(), _x()
    with torch.no_grad(), masked_neurons(model, neuron_mask_from(model, PLAN)):
        want = model(**x).logits
    kept = hp.prune_neurons(model, PLAN, verify=True)
    with torch.no_grad():
        got = model(**x).logits
    assert kept == {"encoder.0.ffn": [1, 2, 4, 6, 7, 8, 9, 10, 11], "encoder.1.ffn": [0, 3, 4, 5, 6, 8, 9, 10]}
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    with torch.no_grad():
        unmasked = _toy()(**x).logits
    assert (unmasked - want).abs().max() > 1e-2 * want.abs().max()  # the plan matters: the check can fail


def test_site_repr_names_its_attributes():
    site = hp.find_sites(build("llama"))[0]
    shown = dict(re.findall(r"(\w+)=('[^']*'|\d+)", repr(site)))
    assert set(shown) >= {"name", "kind", "layer", "num_heads", "num_kv_heads", "head_dim", "path"}, repr(site)
    assert all(shown[k] == repr(getattr(site, k)) for k in shown), repr(site)
    assert shown["num_kv_heads"] != shown["num_heads"]  # tiny llama is GQA: the two fields are told apart


def _imported_modules(*args: str) -> tuple[set[str], str]:
    """Top-level names of the modules ``python -X importtime -m headprune *args`` imports, and its stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "headprune", *args], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    assert "headprune" in names, proc.stderr[-2000:]  # the reader sees imports at all
    return names, proc.stdout


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_import_neither_torch_nor_transformers(flag):
    names, out = _imported_modules(flag)
    assert not names & {"torch", "transformers"}, sorted(names & {"torch", "transformers"})
    if flag == "--version":
        assert out.strip() == f"headprune {hp.__version__}"
    else:
        assert "compress" in out and "bench" in out  # every command is still listed
