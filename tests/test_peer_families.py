"""Every peer of the LLM harness on a tiny model of every exact decoder family (benchmarks/peer_families.py,
issue #47): a fresh run of two families agrees with the committed survey; no peer ran and disagreed with its own
plan applied by masking; what did not run says why in one line."""

from __future__ import annotations

import json

import pytest

from scripts import benchmark_script

peer_families = benchmark_script("peer_families")
COMMITTED = json.loads(peer_families.RESULTS.read_text())
ROWS = {f["model_type"]: f for f in COMMITTED["families"]}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("peer_families") / "pf.json"
    data = peer_families.main(["--families", "llama,phi3", "--output", str(out)])
    return {f["model_type"]: f for f in data["families"]}


def test_fresh_run_agrees_with_committed(fresh):
    for name, family in fresh.items():
        mine = [(r["method"], r["status"]) for r in family["rows"]]
        assert mine == [(r["method"], r["status"]) for r in ROWS[name]["rows"]], name
    llama = {r["method"]: r for r in fresh["llama"]["rows"]}
    assert all(r["status"] == "ok" for r in llama.values())  # a plain GQA Llama: every method runs
    for method, r in llama.items():
        if "max_abs_diff" in r:  # the pruned model is the peer's plan applied by masking, and not the unpruned one
            assert r["max_abs_diff"] <= 1e-4 * r["max_abs_logit"] and r["moved_from_unpruned"] > 0, method
    assert llama["headprune-fisher+linear"]["replay_equal"] is True


def test_committed_survey_has_no_failure_and_every_refusal_is_one_line():
    assert COMMITTED["methods"][-1] == peer_families.HEADPRUNE
    statuses = {r["status"] for f in COMMITTED["families"] for r in f.get("rows", [])}
    assert statuses <= {"ok", "not run"}
    for family in COMMITTED["families"]:
        assert [r["method"] for r in family["rows"]] == COMMITTED["methods"], family["model_type"]
        for r in family["rows"]:
            if r["status"] == "not run":
                assert r["reason"] and "\n" not in r["reason"], (family["model_type"], r)
            else:
                assert r["removed_share"] >= 0.1, (family["model_type"], r)
    ok = [f["model_type"] for f in COMMITTED["families"] if all(r["status"] == "ok" for r in f["rows"])]
    assert {"llama", "mistral", "qwen2", "qwen3", "gemma3_text"} <= set(ok)


def test_covers_every_exact_decoder_family_of_its_transformers():
    import transformers

    if transformers.__version__ != COMMITTED["transformers"]:
        pytest.skip(f"survey made with transformers {COMMITTED['transformers']}")
    assert set(ROWS) == set(peer_families.decoder_families())
