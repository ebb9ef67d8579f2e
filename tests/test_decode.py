"""bench: KV cache per token / per sequence and decode throughput (generate with a cache)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from typer.testing import CliRunner

import headprune as hp
from headprune.bench.decode import decode_benchmark
from headprune.cli import app
from headprune.errors import ConfigError
from tiny import build


def _cache_after_generate(model, prompt, new):
    """Bytes of the cache an independent greedy generate leaves (keys and values of every layer)."""
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, use_cache=True,
                             pad_token_id=0, return_dict_in_generate=True)
    return sum(t.numel() * t.element_size() for layer in out.past_key_values.layers for t in (layer.keys, layer.values))


def test_decode_benchmark_measures_the_cache_of_the_original_and_the_pruned_model():
    original = build("llama")
    pruned = copy.deepcopy(original)
    hp.prune_heads(pruned, {"decoder.0.self": [0, 1, 2], "decoder.1.self": [1, 4]})  # a group gone; uniform
    result = decode_benchmark({"original": original, "pruned": pruned}, prompt_len=6, new_tokens=4, repeats=2,
                              warmup=0)
    assert json.loads(json.dumps(result))["settings"]["new_tokens"] == 4
    for name, model in (("original", original), ("pruned", pruned)):
        r = result["models"][name]
        g = torch.Generator().manual_seed(0)
        prompt = {"input_ids": torch.randint(3, 64, (1, 6), generator=g)}
        want = _cache_after_generate(model, prompt, 4)
        assert r["cache_bytes_measured"] == want
        assert r["kv_cache_bytes_per_token"] * (6 + 4 - 1) == want  # the last token is never fed back
        assert r["tokens_per_s"] > 0 and r["tokens_per_s_q25"] <= r["tokens_per_s"] <= r["tokens_per_s_q75"]
    up = result["speedups"][0]
    assert up["model"] == "pruned" and up["kv_cache_ratio"] == pytest.approx(3 / 4)  # (1 + 2) of (2 + 2) kv heads


def test_decode_refuses_an_encoder_and_too_long_prompts():
    with pytest.raises(ConfigError, match="does not generate"):
        decode_benchmark({"bert": build("bert")}, prompt_len=4, new_tokens=2)
    with pytest.raises(ConfigError, match="positions"):
        decode_benchmark({"llama": build("llama")}, prompt_len=60, new_tokens=10)


def test_cli_bench_reports_kv_cache_and_decode(tmp_path):
    hp.save_pruned(build("llama"), tmp_path / "llama")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bench", str(tmp_path / "llama"), "--batch-sizes", "1", "--seq-len", "8",
                                      "--repeats", "2", "--warmup", "0", "--min-repeat-s", "0", "--no-memory",
                                      "--prune-fraction", "0.5", "--decode", "--decode-prompt", "6", "--decode-new",
                                      "3", "-o", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "bench.json").read_text())
    models = data["models"]
    # uniform --gqa: half the query heads of every group go, the key/value heads stay: the cache is unchanged
    assert models["llama-pruned0.5"]["kv_cache_bytes_per_token"] == models["llama"]["kv_cache_bytes_per_token"] > 0
    assert models["llama"]["kv_cache_bytes_per_sequence"] == 8 * models["llama"]["kv_cache_bytes_per_token"]
    assert set(data["extra"]["decode"]["models"]) == {"llama", "llama-pruned0.5"}
    assert "tokens/s" in result.output and "KV cache B/token" in result.output
    bad = CliRunner().invoke(app, ["bench", str(tmp_path / "llama"), "--decode-new", "0", "-o", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "--decode-new 0" in bad.output and not (tmp_path / "x").exists()
