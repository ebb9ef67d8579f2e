"""The family table (:mod:`headprune.core.model.families`): the names the finders read are pinned, and a family added
at test time through one entry -- a Llama whose projections are called ``query``, ``key``, ``value``,
``dense_out``, ``w_gate``, ``w_up``, ``w_down`` -- prunes exactly (pruned == masked logits), saves and reloads
(stock and headprune's layout), and exports to GGUF that the ``gguf`` package reads back and transformers' own
Llama runs; without the entry the same model is refused."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import transformers
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, eager_attention_forward

import headprune as hp
from headprune.core.model import families
from headprune.core.model.families import Family, FFNNames, GGUFNames
from llm_tiny import bpe_tokenizer

RENAMED_TENSORS = (("attn_norm", "input_layernorm"), ("attn_q", "self_attn.query"), ("attn_k", "self_attn.key"),
                   ("attn_v", "self_attn.value"), ("attn_output", "self_attn.dense_out"),
                   ("ffn_norm", "post_attention_layernorm"), ("ffn_gate", "mlp.w_gate"), ("ffn_up", "mlp.w_up"),
                   ("ffn_down", "mlp.w_down"))
RENAMED = Family("Renamed Llama", ("hp_renamed_llama",), qkvo=("query", "key", "value", "dense_out"),
                 ffns=(FFNNames(("w_gate", "w_up"), "w_down"),), ffn_keys=("intermediate_size",),
                 gguf=GGUFNames("llama", layer_tensors=RENAMED_TENSORS))


class RenamedConfig(transformers.LlamaConfig):
    model_type = "hp_renamed_llama"


class RenamedAttention(nn.Module):
    """Llama's attention (rotary, grouped-query, the configured attention function) with its own projection names."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx, self.head_dim = config, layer_idx, config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling, self.attention_dropout, self.is_causal = config.head_dim ** -0.5, 0.0, True
        q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
        self.query = nn.Linear(config.hidden_size, q, bias=False)
        self.key = nn.Linear(config.hidden_size, kv, bias=False)
        self.value = nn.Linear(config.hidden_size, kv, bias=False)
        self.dense_out = nn.Linear(q, config.hidden_size, bias=False)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.query(hidden_states).view(shape).transpose(1, 2)  # (B, heads, T, head_dim)
        k = self.key(hidden_states).view(shape).transpose(1, 2)  # (B, kv_heads, T, head_dim)
        v = self.value(hidden_states).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        out, weights = attend(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
        return self.dense_out(out.reshape(*hidden_states.shape[:-1], -1)), weights  # (B, T, hidden)


class RenamedMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_gate = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w_up = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w_down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.w_down(self.act(self.w_gate(x)) * self.w_up(x))


class RenamedForCausalLM(transformers.LlamaForCausalLM):
    config_class = RenamedConfig

    def __init__(self, config):
        super().__init__(config)
        for i, layer in enumerate(self.model.layers):
            layer.self_attn, layer.mlp = RenamedAttention(config, i), RenamedMLP(config)


def renamed_model(seed: int = 0) -> RenamedForCausalLM:
    torch.manual_seed(seed)
    config = RenamedConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                           rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = RenamedForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3) if p.ndim == 2 else p.uniform_(0.5, 1.5)  # norms away from 1: they must be read
    return model


@pytest.fixture
def registered(monkeypatch):
    """The entry in the table and the config type known to transformers, both for this test only."""
    monkeypatch.setattr(families, "_TABLE", list(families.families()))
    monkeypatch.setitem(CONFIG_MAPPING._extra_content, RenamedConfig.model_type, RenamedConfig)
    families.register_family(RENAMED)


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits.float()


def _close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-5) -> None:
    assert got.shape == want.shape
    assert float((got - want).abs().max()) <= rel * float(want.abs().max())


IDS = torch.tensor([[5, 17, 200, 31, 9, 64, 2, 150, 77, 3]])
DROP = {"decoder.0.self": [0, 1], "decoder.1.self": [1, 3]}  # one whole group / one head per group: 2 over 1 / 2 over 2
DROP_NEURONS = {"decoder.0.ffn": list(range(0, 128, 4)), "decoder.1.ffn": list(range(1, 128, 4))}


def test_without_its_entry_the_renamed_family_is_refused():
    model = renamed_model()
    with pytest.raises(hp.UnsupportedModelError, match="RenamedForCausalLM has no attention sites headprune can find"):
        hp.find_sites(model)
    with pytest.raises(hp.UnsupportedModelError):
        hp.prune_heads(model, {"decoder.0.self": [0]})
    from headprune.export.gguf_layout import GGUFShapeError, gguf_layout

    with pytest.raises(GGUFShapeError, match="'hp_renamed_llama': GGUF export supports gemma, gemma3_text, llama, mistral, qwen2"):
        gguf_layout(model)
    with pytest.raises(hp.ConfigError, match="taken"):  # a built-in name stays the built-in entry's
        families.register_family(Family("Llama", ("hp_renamed_llama",)))


def test_the_entry_makes_the_renamed_family_prune_exactly(registered):
    model = renamed_model()
    sites, ffns = hp.find_sites(model), hp.find_ffns(model)
    assert [(s.name, s.num_heads, s.num_kv_heads, s.head_dim) for s in sites] == [
        ("decoder.0.self", 4, 2, 16), ("decoder.1.self", 4, 2, 16)]
    assert [(f.name, f.width, f.gated) for f in ffns] == [("decoder.0.ffn", 128, True), ("decoder.1.ffn", 128, True)]
    assert sites[0].q.module is model.model.layers[0].self_attn.query and ffns[1].down is model.model.layers[1].mlp.w_down
    neuron_mask = {f.name: torch.ones(f.width).index_fill_(0, torch.tensor(DROP_NEURONS[f.name]), 0.0) for f in ffns}
    with hp.masked(model, hp.mask_from_heads(sites, DROP)), hp.masked_neurons(model, neuron_mask):
        want = _logits(model, IDS)
    pruned = copy.deepcopy(model)
    hp.prune_heads(pruned, DROP)
    hp.prune_neurons(pruned, DROP_NEURONS)
    _close(_logits(pruned, IDS), want)
    attn, mlp = pruned.model.layers[1].self_attn, pruned.model.layers[1].mlp
    assert (attn.query.out_features, attn.key.out_features, attn.dense_out.in_features) == (32, 32, 32)
    assert (mlp.w_gate.out_features, mlp.w_down.in_features) == (96, 96)
    assert not torch.allclose(_logits(model, IDS), want)  # the plan changes the output: the check has teeth


@pytest.mark.parametrize("stock", [True, False])
def test_the_pruned_renamed_family_saves_and_reloads(registered, tmp_path, stock):
    model = renamed_model()
    hp.prune_heads(model, {"decoder.0.self": [0, 2], "decoder.1.self": [0, 2]})  # 2 over 2 in every layer
    hp.prune_neurons(model, DROP_NEURONS)
    out = hp.save_pruned(model, tmp_path / "m", stock=stock)
    raw = json.loads((out / "config.json").read_text())
    assert raw["model_type"] == "hp_renamed_llama"
    assert ("headprune_kept_heads" in raw) is not stock and raw["num_attention_heads"] == (2 if stock else 4)
    loaded = hp.load_pruned(out, model_class=RenamedForCausalLM)
    assert loaded.model.layers[0].self_attn.query.out_features == 32 and loaded.model.layers[1].mlp.w_up.out_features == 96
    _close(_logits(loaded, IDS), _logits(model, IDS))


def test_the_pruned_renamed_family_exports_to_gguf(registered, tmp_path):
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    model = renamed_model()
    hp.prune_heads(model, {"decoder.0.self": [0, 1], "decoder.1.self": [2, 3]})  # one group left per layer
    hp.prune_neurons(model, DROP_NEURONS)
    from headprune.export.gguf import export_gguf

    report = export_gguf(model, tmp_path / "r.gguf", tokenizer=bpe_tokenizer())
    assert (report["arch"], report["head_count"], report["head_count_kv"], report["feed_forward_length"]) == (
        "llama", 2, 1, 96)
    assert report["check"]["transformers"]["checked"]  # transformers' own Llama runs the file: same logits
    reader = gguf.GGUFReader(tmp_path / "r.gguf")
    assert reader.fields["general.architecture"].contents() == "llama"
    tensors = {t.name: np.asarray(t.data).reshape(tuple(reversed(t.shape.tolist()))) for t in reader.tensors}
    layer = model.model.layers[1]
    for name, weight in (("blk.1.attn_v.weight", layer.self_attn.value.weight),
                         ("blk.1.attn_output.weight", layer.self_attn.dense_out.weight),
                         ("blk.1.ffn_up.weight", layer.mlp.w_up.weight), ("blk.1.ffn_down.weight", layer.mlp.w_down.weight),
                         ("blk.1.ffn_norm.weight", layer.post_attention_layernorm.weight)):
        assert np.array_equal(tensors[name], weight.detach().numpy()), name
    assert len([n for n in tensors if n.startswith("blk.1.")]) == 9  # norms, q, k, v, output, gate, up, down


def test_the_built_in_table_gives_the_names_the_finders_read():
    """The names site and FFN finding, surgery, stock saving and the GGUF export read (pinned, as before the table
    held them: a change here changes which models are found)."""
    names = families.known_names()
    assert names.qkvo == (("q_proj", "k_proj", "v_proj", "o_proj"), ("q_proj", "k_proj", "v_proj", "dense"),
                          ("q_proj", "k_proj", "v_proj", "Wo"), ("q_proj", "k_proj", "v_proj", "out_proj"),
                          ("q_lin", "k_lin", "v_lin", "out_lin"), ("q", "k", "v", "o"))
    assert names.bert_qkv == (("query", "key", "value"), ("query_proj", "key_proj", "value_proj"))
    assert names.fused == (("c_attn", "c_proj"), ("qkv_proj", "o_proj"), ("Wqkv", "Wo"), ("query_key_value", "dense"))
    assert names.fused_order == {"c_attn": "blocks", "qkv_proj": "blocks", "Wqkv": "blocks", "query_key_value": "heads"}
    assert names.cross_query == ("q_attn",)
    assert set(names.extras) == {"pos_key_proj", "pos_query_proj", "query_global", "key_global", "value_global"}
    assert names.ffns[:2] == ((("gate_proj", "up_proj"), "down_proj"), (("wi_0", "wi_1"), "wo"))  # gated first
    assert set(names.ffns[2:]) == {(("wi",), "wo"), (("c_fc",), "c_proj"), (("lin1",), "lin2"), (("fc1",), "fc2"),
                                   (("intermediate.dense",), "output.dense")}
    assert names.queries == {"q_proj", "query", "q", "q_lin", "query_proj", "wq", "Wq"}
    assert names.keys == {"k_proj", "key", "k", "k_lin", "key_proj", "wk", "Wk"}
    assert names.fused_qkv == {"qkv_proj", "query_key_value", "Wqkv", "c_attn", "qkv", "wqkv"}
    assert set(families.ffn_keys()) == {"intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff",
                                        "n_inner", "moe_intermediate_size", "shared_expert_intermediate_size"}
    assert families.stock_targets() == ("mistral", "qwen2", "qwen3", "llama")
    assert families.gguf_types() == ["gemma", "gemma3_text", "llama", "mistral", "qwen2", "qwen3"]
    assert {t: families.gguf_names(t).arch for t in families.gguf_types()} == {
        "llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
        "gemma3_text": "gemma3"}
    assert [t for t in ("bloom", "mpt", "albert", "llama", "falcon") if families.refusal(t)] == ["bloom", "mpt", "albert"]
    assert len(families.listed_names()) == 17 and {"BERT", "Llama", "T5", "Persimmon"} <= set(families.listed_names())


def test_an_entry_is_checked_when_made():
    with pytest.raises(hp.ConfigError, match="qkvo"):
        Family("Broken", qkvo=("q", "k", "v"))
    with pytest.raises(hp.ConfigError, match="order"):
        families.Fused("qkv", "o", order="rows")
    with pytest.raises(hp.ConfigError, match="ffn_gate"):
        GGUFNames("llama", layer_tensors=RENAMED_TENSORS[:6])
