"""``headprune.core.model.sites.structure_fixed``: inside it, sites and FFNs are searched once and handed out as copies;
outside it (and after it), every call searches the model as it is now."""

from __future__ import annotations

import headprune as hp
from headprune.core.model.sites import structure_fixed
from tiny import build


def test_inside_one_search_outside_the_model_as_it_is():
    model = build("llama")
    with structure_fixed(model):
        first, again = hp.find_sites(model), hp.find_sites(model)
        ffns = hp.find_ffns(model)
        assert all(a is b for a, b in zip(first, again, strict=True)) and first is not again
        first.pop()  # a caller's list is its own
        assert len(hp.find_sites(model)) == len(again)
        assert all(a is b for a, b in zip(ffns, hp.find_ffns(model), strict=True))
        with structure_fixed(model):  # nested: the outer findings stay
            assert hp.find_sites(model)[0] is again[0]
        assert hp.find_sites(model)[0] is again[0]
    fresh = hp.find_sites(model)
    assert fresh[0] is not again[0]
    heads = fresh[0].num_heads
    hp.prune_heads(model, {fresh[0].name: [0]})
    assert hp.find_sites(model)[0].num_heads == heads - 1  # searched again, after the cut


def test_another_model_is_searched_as_usual():
    a, b = build("llama"), build("llama")
    with structure_fixed(a):
        assert hp.find_sites(b)[0] is not hp.find_sites(b)[0]
        assert hp.find_sites(a)[0] is hp.find_sites(a)[0]
