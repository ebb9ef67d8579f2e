"""The plan replays everything: for every configuration the peer table ships (benchmarks/peers/headprune_rows.py)
and for the refit, the head plan's tuning and distillation, on a tiny random GQA Llama, the plan compress returns,
written and read back, rebuilds on a fresh load of the same model every tensor compress made (torch.equal) and the
same logits; a model with one weight changed is refused by its fingerprint before anything changes."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

import headprune as hp
from headprune.compression import PruneSettings, compress
from headprune.compression.fingerprint import fingerprint
from headprune.compression.replay import Plan, apply_plan
from headprune.core.model.kept import kept_heads, kept_neurons
from headprune.core.model.records import KEPT_KEY
from headprune.errors import PlanError
from tiny import inputs, labels, llama

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from peers.headprune_rows import CONFIGURATIONS, as_settings  # noqa: E402

EXTRA = {  # the stages no shipped configuration keeps on this model: the refit, distillation, the head plan's tuning
    "reconstruct": {"units": "both", "price": "params", "scores": "fisher", "compensate": ["reconstruct"],
                    "guard": False},
    "distill": {"units": "both", "price": "params", "scores": "fisher", "compensate": ["linear", "reconstruct", "distill"],
                "guard": False},
    "tune": {"units": "heads", "price": "count", "scores": "fisher", "compensate": ["tune"], "guard": False},
    "fisher+linear low_memory": {**as_settings(CONFIGURATIONS["headprune-fisher+linear"]), "low_memory": True},
}
SETTINGS = {**{k: as_settings(v) for k, v in CONFIGURATIONS.items()}, **EXTRA}


def _batches(n=4):
    out = []
    for s in range(n):
        x = inputs("llama", batch=5, seed=s, pad=False)
        out.append({**x, "labels": labels("llama", x, seed=s)})
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("plan") / "model"
    hp.save_pruned(llama(), path)
    return path


def _same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    x = inputs("llama", batch=2, seed=9)
    with torch.no_grad():
        assert torch.equal(a(**x).logits, b(**x).logits)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_plan_rebuilds_compress_bit_for_bit_and_refuses_another_model(model_dir, tmp_path, name):
    model = hp.load_model(model_dir)
    share = 0.5 if SETTINGS[name]["units"] == "both" else None
    settings = PruneSettings(seq_len=8, **({"share": share} if share else {"n_keep": 8}), **SETTINGS[name])
    result = compress(model, _batches(), settings)
    assert any(result.plan.dropped_heads.values()) or any(result.plan.dropped_neurons.values())
    stages = getattr(result, "stages", {"tune": "kept"})  # the head plan: tuning unguarded here
    rewrote = any(v.startswith("kept") for k, v in stages.items() if k not in ("select", "remove"))
    assert bool(result.plan.tensors) == rewrote  # a kept stage rewrote weights: the plan holds them
    path = result.plan.save(tmp_path / "plan.json")
    plan = Plan.load(path)
    assert plan.fingerprint == fingerprint(hp.load_model(model_dir))
    replayed = apply_plan(hp.load_model(model_dir), plan)
    _same(result.model, replayed)
    # the config too; a site that keeps every head may be listed or not (several rounds list it): the same heads
    config, want = replayed.config.to_dict(), result.model.config.to_dict()
    assert kept_heads(replayed) == kept_heads(result.model) and kept_neurons(replayed) == kept_neurons(result.model)
    assert {k: v for k, v in config.items() if k != KEPT_KEY} == {k: v for k, v in want.items() if k != KEPT_KEY}
    other = hp.load_model(model_dir)
    before = copy.deepcopy(other.state_dict())
    with torch.no_grad():
        other.model.layers[1].mlp.up_proj.weight[3, 5] += 1e-3
    with pytest.raises(PlanError, match=r"fingerprint mismatch \(weights differ at model.layers.1.mlp.up_proj.weight"):
        apply_plan(other, plan)
    assert other.model.layers[1].mlp.up_proj.weight.shape == before["model.layers.1.mlp.up_proj.weight"].shape


def test_the_fingerprint_names_a_config_or_dtype_that_differs(model_dir, tmp_path):
    result = compress(hp.load_model(model_dir), _batches(), PruneSettings(seq_len=8, share=0.5, **SETTINGS["reconstruct"]))
    with pytest.raises(PlanError, match="fingerprint mismatch \\(dtypes bfloat16, the plan's float32"):
        apply_plan(hp.load_model(model_dir, dtype=torch.bfloat16), result.plan)
    other = hp.load_model(model_dir)
    other.config.rms_norm_eps = 1e-3
    with pytest.raises(PlanError, match="config differs at rms_norm_eps"):
        apply_plan(other, result.plan)


def test_a_plan_whose_tensors_are_not_its_own_is_refused(model_dir, tmp_path):
    model = hp.load_model(model_dir)
    settings = PruneSettings(seq_len=8, share=0.5, **SETTINGS["headprune-fisher+linear"])
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a = compress(model, _batches(), settings).plan.save(tmp_path / "a" / "plan.json")
    compress(model, _batches(2), settings).plan.save(tmp_path / "b" / "plan.json")
    (tmp_path / "a" / "plan.safetensors").write_bytes((tmp_path / "b" / "plan.safetensors").read_bytes())
    with pytest.raises(PlanError, match="plan.safetensors is not the file written with it"):
        Plan.load(a)


@pytest.mark.parametrize("flags", [
    ["--compensate", "linear", "--damping", "0.3"],  # headprune-fisher+linear
    ["--compensate", "obs-seq", "--damping", "0.01", "--steps", "2", "--step-standin", "linear",
     "--step-damping", "0.3"],  # headprune-fisher+linear-2steps+obs-seq
])
def test_the_cli_round_trip_on_a_gqa_llama(tmp_path, flags):
    """compress -o RUN, then apply MODEL RUN/plan.json -o OUT: load_pruned(OUT) is compress's saved model."""
    import transformers
    from typer.testing import CliRunner

    from headprune.cli import app
    from tiny import word_tokenizer

    words = "the model keeps the heads it needs and the cache stays small while the text goes on".split()
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (60,), generator=g)) for _ in range(12)]
    (tmp_path / "calib.txt").write_text("\n".join(lines[:6]) + "\n")
    (tmp_path / "eval.txt").write_text("\n".join(lines[6:]) + "\n")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(  # positions for the lm task's 128-token blocks
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=37,
        max_position_embeddings=160, vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    hp.save_pruned(model, tmp_path / "llama", tokenizer=word_tokenizer(lines, bos_eos=True))
    runner = CliRunner()
    r = runner.invoke(app, ["compress", str(tmp_path / "llama"), "--task", "lm", "--data", str(tmp_path / "eval.txt"),
                            "--calib-data", str(tmp_path / "calib.txt"), "--units", "both", "--share", "0.5",
                            "--price", "params", "--scores", "fisher", *flags, "--no-bench", "-o", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["apply", str(tmp_path / "llama"), str(tmp_path / "run" / "plan.json"), "-o",
                            str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert Plan.load(tmp_path / "run" / "plan.json").tensors  # the stand-ins' weights travel in the plan
    _same(hp.load_pruned(tmp_path / "run"), hp.load_pruned(tmp_path / "out"))
