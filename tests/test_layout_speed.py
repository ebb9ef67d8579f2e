"""``benchmarks/layout_speed.py``: the four models it times are what it says (a stock reload of the uniform plan with
the same shapes and logits, an uneven plan of about the same size), and its table never quotes an unreliable row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scripts import benchmark_script

ROOT = Path(__file__).resolve().parents[1]


def _module():
    return benchmark_script("layout_speed")


def test_the_models_are_what_the_benchmark_says(tmp_path):
    import headprune as hp
    mod = _module()
    models = mod.build_models(mod.QUICK, tmp_path)
    shapes = {k: {n: tuple(p.shape) for n, p in m.state_dict().items()} for k, m in models.items()}
    assert shapes["uniform"] == shapes["uniform-stock"] != shapes["stock"]
    assert not hasattr(models["uniform-stock"].config, "headprune_kept_heads")  # plain from_pretrained's model
    x = torch.randint(0, mod.QUICK["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = models["uniform"](input_ids=x).logits, models["uniform-stock"](input_ids=x).logits
    assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())
    heads = [s.num_heads for s in hp.find_sites(models["uneven"])]
    widths = [f.width for f in hp.find_ffns(models["uneven"])]
    assert len(set(heads)) > 1 and len(set(widths)) > 1
    size = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    assert abs(size["uneven"] - size["uniform"]) <= 0.02 * (size["stock"] - size["uniform"])


def test_a_quick_run_and_its_table(tmp_path):
    mod = _module()
    out = tmp_path / "layout.json"
    mod.main(["--quick", "--rounds", "2", "--threads", "1", "--batch", "2", "--seq", "16", "--prompt", "8",
              "--new", "4", "--output", str(out)])
    data = json.loads(out.read_text())
    for w in data["workloads"].values():
        assert set(w["speedup"]) == {"uniform", "uniform-stock", "uneven"}
        for name, r in w["speedup"].items():
            assert w["efficiency"][name] == pytest.approx(r["median"] / w["flop_limit"][name])
    w = data["workloads"]["prefill"]
    w["reliable"], w["reason"] = False, "load of other processes 9.00 + 1 benchmark thread(s) > 2 usable core(s)"
    data["workloads"]["decode"]["reliable"] = True
    text = mod.table(data)
    assert text.count("not measured reliably") == 3 and "| decode | uneven | x" in text


def test_the_docs_table_is_the_committed_json():
    mod = _module()
    data = json.loads((ROOT / "benchmarks" / "results" / "layout_speed.json").read_text())
    section = (ROOT / "docs" / "llms.md").read_text().split(mod.BEGIN, 1)[1].split(mod.END, 1)[0].strip()
    assert section == mod.table(data), "run: python benchmarks/layout_speed.py --write-docs docs/llms.md"
