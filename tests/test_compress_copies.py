"""compress's working copy shares with the model passed every tensor no stage writes into (issue #47 item 4):
the model passed stays as it was, bit for bit, and the result holds none of its tensors; the plan's reference cut
(a copy sharing every tensor) leaves the model as it was too."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "benchmarks"))
from headprune.compression import compress  # noqa: E402
from headprune.core.cut.snapshot import shared_copy, tensors  # noqa: E402
from headprune.core.prune import prune_heads, prune_neurons  # noqa: E402
from llm_tiny import tiny_decoder  # noqa: E402
from test_compress_unchanged import _batches, _settings, state_hash  # noqa: E402


def _storages(model) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors(model)}


@pytest.mark.parametrize("name", ["headprune-fisher+linear", "headprune-fisher+linear-seq",
                                  "headprune-fisher+reconstruct", "headprune-fisher+obs-seq-2steps",
                                  "heads-fisher+tune-unguarded"])  # its tuned scales folded into the output projections
def test_the_model_passed_is_unchanged_and_shares_nothing_with_the_result(name):
    torch.manual_seed(0)
    model = tiny_decoder("llama", layers=3, seed=0)
    before = state_hash(model)
    result = compress(model, _batches(), _settings(name, model))
    assert state_hash(model) == before  # sha256 of every byte, computed before compress ran
    assert state_hash(result.model) != before
    assert not _storages(model) & _storages(result.model)


def test_a_shared_copy_holds_the_tensors_and_its_cut_leaves_the_model_alone():
    model = tiny_decoder("llama", layers=2, seed=0)
    before = state_hash(model)
    copy = shared_copy(model)
    assert [id(t) for t in tensors(copy)] == [id(t) for t in tensors(model)]
    prune_heads(copy, {"decoder.0.self": [0, 1]}, verify=False)
    prune_neurons(copy, {"decoder.1.ffn": [0, 3, 5]}, verify=False)
    assert state_hash(model) == before
    assert state_hash(copy) != before
    cut = {id(t) for t in tensors(copy)} - {id(t) for t in tensors(model)}
    assert cut and len(cut) < len(tensors(copy))  # only the cut tensors are new
