"""The families survey (``benchmarks/families.py``): on its quick subset the verdicts hold when checked
independently (an exact family prunes to its masked output; a refused one raises and is left as it was),
the committed results agree with a fresh run, and the manual's table (docs/families.md) is what the committed results say."""

from __future__ import annotations

import copy
import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest
import torch

import headprune as hp

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("families", ROOT / "benchmarks" / "families.py")
families = importlib.util.module_from_spec(_spec)
sys.modules["families"] = families
_spec.loader.exec_module(families)

COMMITTED = json.loads(families.RESULTS.read_text())
COMMITTED_ROWS = {r["model_type"]: r for r in COMMITTED["families"]}


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("families") / "families.json"
    data = families.main(["--quick", "--output", str(out), "--markdown", str(out.with_suffix(".md"))])
    return {r["model_type"]: r for r in data["families"]}


def test_quick_subset_gets_a_verdict_each(quick):
    assert set(quick) == set(families.QUICK)
    assert all(r["verdict"] in families.VERDICTS for r in quick.values())
    verdicts = {r["verdict"] for r in quick.values()}
    assert {"exact", "refused"} <= verdicts  # the subset covers both sides of the safety net
    for r in quick.values():
        assert (r["verdict"] == "exact") == (not r["reason"]), r
        if r["verdict"] == "exact":
            assert {"batched mask", "pruned == masked", "save/load"} <= set(r["checks"])


def _inputs(model) -> dict:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(4, model.config.vocab_size, (3, 9), generator=g)
    x = {"input_ids": ids}
    if model.config.is_encoder_decoder:
        x["decoder_input_ids"] = torch.randint(4, model.config.vocab_size, (3, 6), generator=g)
    return x


def _output(model, x) -> torch.Tensor:
    with torch.no_grad():
        out = model(**x, use_cache=False)
    return (out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state).float()


def _random_plan(sites, seed: int = 0) -> dict[str, list[int]]:
    """Some heads of every site, the first site emptied entirely."""
    rng = random.Random(seed)
    plan = {s.name: sorted(rng.sample(range(s.num_heads), rng.randint(1, s.num_heads - 1))) for s in sites}
    plan[sites[0].name] = list(range(sites[0].num_heads))
    return plan


@pytest.mark.parametrize("model_type", families.QUICK)
def test_quick_verdict_holds_independently(quick, model_type):
    verdict = quick[model_type]["verdict"]
    _, _, model = families.build(model_type)
    x = _inputs(model)
    if verdict == "exact":
        sites = hp.find_sites(model)
        plan = _random_plan(sites)
        with hp.masked(model, hp.mask_from_heads(sites, plan)):
            want = _output(model, x)
        pruned = copy.deepcopy(model)
        hp.prune_heads(pruned, plan)
        got = _output(pruned, x)
        assert sum(p.numel() for p in pruned.parameters()) < sum(p.numel() for p in model.parameters())
        assert got.shape == want.shape
        assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max())
    elif verdict == "refused":
        before = {k: v.clone() for k, v in model.state_dict().items()}
        config = model.config.to_dict()
        try:
            plan = {hp.find_sites(model)[0].name: [0]}
        except hp.UnsupportedModelError:  # refused by name: find_sites itself refuses
            plan = {"decoder.0.self": [0]}
        with pytest.raises(hp.UnsupportedModelError):
            hp.prune_heads(model, plan)
        after = model.state_dict()
        assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
        assert model.config.to_dict() == config
    else:
        pytest.fail(f"{model_type}: the quick subset should be exact or refused, got {verdict}")


def test_committed_results_agree_with_a_fresh_run(quick):
    for model_type, fresh in quick.items():
        committed = COMMITTED_ROWS[model_type]
        assert (committed["verdict"], committed["checks"], committed["class"]) == (
            fresh["verdict"], fresh["checks"], fresh["class"]), model_type


def test_committed_results_cover_every_model_type():
    """On the version the table was made with, it covers every model type; on any other, the types the table
    has not seen are surveyed now (a newer transformers adds families) and none of them may be broken."""
    import transformers

    assert all(r["verdict"] in families.VERDICTS for r in COMMITTED["families"])
    installed = set(families.tiny_configs.model_types())
    if COMMITTED["transformers"] == transformers.__version__:
        assert set(COMMITTED_ROWS) == installed
        return
    unseen = sorted(installed - set(COMMITTED_ROWS))
    rows = [families.survey(t) for t in unseen]
    broken = [(r["model_type"], r["reason"]) for r in rows if r["verdict"] == "broken"]
    assert not broken, f"transformers {transformers.__version__}: families the table has not seen break headprune"


def test_readme_table_is_what_the_results_say():
    assert families.readme_block(ROOT / "docs" / "families.md") == families.readme_section(COMMITTED)
