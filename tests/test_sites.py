"""Site discovery: one naming scheme, pinned per family; unsupported models get a typed error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import headprune as hp
from tiny import build

EXPECTED = {
    "bert": (["encoder.0.self", "encoder.1.self"], 4, 4, 8),
    "roberta": (["encoder.0.self", "encoder.1.self"], 4, 4, 8),
    "electra": (["encoder.0.self", "encoder.1.self"], 4, 4, 8),
    "distilbert": (["encoder.0.self", "encoder.1.self"], 4, 4, 8),
    "gpt2": (["decoder.0.self", "decoder.1.self"], 4, 4, 8),
    "llama": (["decoder.0.self", "decoder.1.self"], 6, 2, 8),
    "qwen2": (["decoder.0.self", "decoder.1.self"], 6, 3, 8),
    "mistral": (["decoder.0.self", "decoder.1.self"], 4, 2, 8),
    "bart": (["encoder.0.self", "encoder.1.self", "decoder.0.self", "decoder.0.cross", "decoder.1.self",
              "decoder.1.cross"], 4, 4, 8),
    "marian": (["encoder.0.self", "encoder.1.self", "decoder.0.self", "decoder.0.cross", "decoder.1.self",
                "decoder.1.cross"], 4, 4, 8),
    "t5": (["encoder.0.self", "encoder.1.self", "decoder.0.self", "decoder.0.cross", "decoder.1.self",
            "decoder.1.cross"], 4, 4, 8),
}


@pytest.mark.parametrize("family", list(EXPECTED))
def test_site_names_and_shapes_are_pinned(family):
    names, heads, kv_heads, head_dim = EXPECTED[family]
    sites = hp.find_sites(build(family))
    assert [s.name for s in sites] == names
    for s in sites:
        assert (s.num_heads, s.num_kv_heads, s.head_dim) == (heads, kv_heads, head_dim)
        assert s.kind == ("cross" if s.name.endswith("cross") else s.name.split(".")[0])
        assert s.layer == int(s.name.split(".")[1])
        assert s.q.width == heads * head_dim and s.k.width == kv_heads * head_dim


def test_generic_model_without_an_entry_is_found():
    """Any module with q_proj/k_proj/v_proj/o_proj and a head_dim is a site."""

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = 4
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(8, 8) for _ in range(3))
            self.o_proj = nn.Linear(8, 8)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.ModuleDict({"attn": Attn()}) for _ in range(2)])

    sites = hp.find_sites(Net())
    assert [s.name for s in sites] == ["encoder.0.self", "encoder.1.self"]
    assert sites[0].num_heads == 2


def test_unsupported_model_names_class_and_families():
    with pytest.raises(hp.UnsupportedModelError, match=r"Sequential.*supported families.*BERT"):
        hp.find_sites(nn.Sequential(nn.Linear(4, 4)))
    with pytest.raises(TypeError):  # typed: also a TypeError
        hp.find_sites(nn.Sequential(nn.Linear(4, 4)))


def test_removed_site_disappears_but_stays_in_the_plan():
    model = build("bert")
    hp.prune_heads(model, {"encoder.0.self": [0, 1, 2, 3]})
    assert [s.name for s in hp.find_sites(model)] == ["encoder.1.self"]
    assert hp.kept_heads(model) == {"encoder.0.self": [], "encoder.1.self": [0, 1, 2, 3]}
    assert hp.original_heads(model) == {"encoder.0.self": 4, "encoder.1.self": 4}
    x = torch.randint(3, 60, (2, 5))
    assert model(input_ids=x).logits.shape == (2, 3)
