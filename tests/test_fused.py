"""Fused q/k/v projections (one matrix, sliced by head: :class:`headprune.core.model.layouts.FusedLayout`) and
attention that no site holds.

References are independent of surgery: the masked model's logits (a hand-made mask of the same heads) and,
for the layouts, a hand-built fused weight whose rows name their (part, head).
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as T
from torch import nn

import headprune as hp
from headprune.core.model.layouts import FusedLayout

VOCAB = 64
TOKENS = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _built(cls, config):
    torch.manual_seed(0)
    return cls(config).float().eval()


def _ids(batch: int = 2, length: int = 7) -> dict[str, torch.Tensor]:
    ids = torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _logits(model, x) -> torch.Tensor:
    with torch.no_grad():
        return model(**x).logits.float()


FAMILIES = {
    # uneven grouped-query drop: a key/value head keeps 1 of its 3 query heads, the other all 3
    "phi3 gqa": (lambda: _built(T.Phi3ForCausalLM, T.Phi3Config(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=37,
        max_position_embeddings=64, **TOKENS)), (6, 2), [0, 1]),
    "falcon new decoder architecture": (lambda: _built(T.FalconForCausalLM, T.FalconConfig(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_kv_heads=2, new_decoder_architecture=True,
        alibi=False, bias=True, **TOKENS)), (6, 2), [1, 2]),
    "gpt_bigcode without multi-query": (lambda: _built(T.GPTBigCodeForCausalLM, T.GPTBigCodeConfig(
        n_embd=32, n_layer=2, n_head=4, multi_query=False, n_positions=64, **TOKENS)), (4, 4), [1, 3]),
    "persimmon qk layernorm, head_dim == heads": (lambda: _built(T.PersimmonForCausalLM, T.PersimmonConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=8, intermediate_size=37, max_position_embeddings=64,
        **TOKENS)), (8, 8), [0, 5, 6]),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fused_families_prune_exactly_and_reload(family, tmp_path):
    build, (heads, kv_heads), drop = FAMILIES[family]
    model = build()
    sites = hp.find_sites(model)
    assert [(s.num_heads, s.num_kv_heads) for s in sites] == [(heads, kv_heads)] * 2
    plan = {sites[0].name: drop, sites[1].name: list(range(heads))}  # the second site loses every head
    x = _ids()
    with hp.masked(model, hp.mask_from_heads(sites, plan)):
        want = _logits(model, x)
    pruned = copy.deepcopy(model)
    hp.prune_heads(pruned, plan)  # verified first: refused unless pruned == masked on a shrunk copy
    got = _logits(pruned, x)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    assert [s.num_heads for s in hp.find_sites(pruned)] == [heads - len(drop)]
    hp.save_pruned(pruned, tmp_path / "pruned")
    again = _logits(hp.load_pruned(tmp_path / "pruned"), x)
    assert (again - want).abs().max() <= 1e-4 * want.abs().max()
    assert model.config.num_attention_heads == heads  # each pruned attention reads its own counts


@pytest.mark.parametrize("order, heads, kv, keep, seen_kv, want", [
    ("blocks", 4, 1, [1, 3], [0], [("q", 1), ("q", 3), ("k", 0), ("v", 0)]),
    ("heads", 3, 3, [0, 2], [0, 2], [("q", 0), ("k", 0), ("v", 0), ("q", 2), ("k", 2), ("v", 2)]),
    ("groups", 4, 2, [0, 2, 3], [0, 1, 1], [("q", 0), ("k", 0), ("v", 0), ("q", 2), ("k", 1), ("v", 1),
                                             ("q", 3), ("k", 1), ("v", 1)]),
])
def test_a_layout_keeps_the_blocks_of_the_kept_heads(order, heads, kv, keep, seen_kv, want):
    layout = FusedLayout(order)
    full = layout.blocks(heads, kv)
    assert len(full) == heads + 2 * kv and len(set(full)) == len(full)
    assert layout.blocks(keep, seen_kv, group=1) == want


class _Hidden(nn.Module):
    """Attention under names headprune does not know: ``Wq``/``Wk``/``Wv`` and ``proj_out``."""

    def __init__(self, d: int = 16, heads: int = 4):
        super().__init__()
        self.Wq, self.Wk, self.Wv, self.proj_out = (nn.Linear(d, d) for _ in range(4))
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (m(x).view(b, t, self.heads, -1).transpose(1, 2) for m in (self.Wq, self.Wk, self.Wv))
        return self.proj_out((q @ k.transpose(-1, -2)).softmax(-1).matmul(v).transpose(1, 2).reshape(b, t, d))


def test_attention_no_site_holds_is_refused_by_path():
    model = _built(T.BartForConditionalGeneration, T.BartConfig(
        d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=8, decoder_ffn_dim=8, max_position_embeddings=32, **TOKENS))
    assert len(hp.find_sites(model)) == 3
    model.model.encoder.layers[0].extra_attn = _Hidden()
    with pytest.raises(hp.UnsupportedModelError, match=r"model\.encoder\.layers\.0\.extra_attn"):
        hp.find_sites(model)


def test_falcon_with_alibi_is_refused_by_name_untouched():
    model = _built(T.FalconForCausalLM, T.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                       alibi=True, **TOKENS))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(hp.UnsupportedModelError, match="alibi=True.*ALiBi biases are built for all heads"):
        hp.prune_heads(model, {"decoder.0.self": [1]})
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
