"""Every shipped configuration compresses a tiny random GQA Llama to the same weights, bit for bit, as the code
before the pipelines were merged (issue #48): the sha256 of each resulting state dict against
``compress_unchanged.json``, recorded from that code (``python tests/test_compress_unchanged.py`` rewrites it)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "benchmarks"))
from peers.headprune_rows import CONFIGURATIONS, settings_for  # noqa: E402

from headprune.compression import PruneSettings, compress  # noqa: E402
from llm_tiny import tiny_decoder  # noqa: E402

FIXTURE = ROOT / "compress_unchanged.json"
BUDGET = 0.3  # the share of non-embedding parameters the harness's rows remove
HEAD_PLANS = {  # the head plan: heads only, a count / flops budget, Fisher swaps and tuned scales
    "heads-fisher+tune": dict(share=0.5, price="count", compensate="tune", seq_len=8),
    "heads-fisher+rearrange-flops": dict(share=0.6, price="flops", compensate="rearrange", gqa="groups", seq_len=8),
    "heads-fisher+tune-unguarded": dict(share=0.5, price="count", compensate="tune", guard=False, seq_len=8),
    "heads-fisher+rearrange-free": dict(share=0.4, price="count", compensate="rearrange", gqa="free", seq_len=8),
    "heads-ih-free": dict(n_keep=7, scores="ih", gqa="free", seq_len=8),
}


def _batches(n: int = 4) -> list[dict]:
    out = []
    for s in range(n):
        g = torch.Generator().manual_seed(s)
        ids = torch.randint(3, 320, (3, 12), generator=g)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    return out


def state_hash(model) -> str:
    """sha256 over every tensor of the state dict: name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _settings(name: str, model) -> PruneSettings:
    if name in HEAD_PLANS:
        return PruneSettings(**HEAD_PLANS[name])
    return settings_for(name, model, BUDGET)


def compressed_hash(name: str) -> str:
    torch.manual_seed(0)
    model = tiny_decoder("llama", layers=3, seed=0)
    return state_hash(compress(model, _batches(), _settings(name, model)).model)


NAMES = [*CONFIGURATIONS, *HEAD_PLANS]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_fixture_covers_every_configuration():
    assert sorted(json.loads(FIXTURE.read_text())) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_same_weights_as_before(name):
    expected = json.loads(FIXTURE.read_text())[name]
    assert compressed_hash(name) == expected, name


if __name__ == "__main__":
    torch.set_num_threads(1)
    FIXTURE.write_text(json.dumps({n: compressed_hash(n) for n in NAMES}, indent=1, sort_keys=True) + "\n")
