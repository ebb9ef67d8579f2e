"""Every tensor headprune makes follows the model's device: checked on a second (fake) device on CPU-only
machines, and on CUDA where there is one; bfloat16 models score like float32 ones."""

from __future__ import annotations

import copy

import pytest
import torch

import headprune as hp
from headprune.compression.tuning import tune_scales
from headprune.evaluation import Classification
from headprune.evaluation.data import ClassificationData
from headprune.experiments.ablation import SweepSettings, one_head_ablation
from second_device import DeviceMismatch, SecondDevice, on_second_device
from tiny import build, inputs, labels, word_tokenizer

WORDS = "the a good bad film plot actor slow fun dull great awful".split()
DEVICES = ["second"] + (["cuda"] if torch.cuda.is_available() else [])


def _placed(model, device: str):
    """A copy of ``model`` on ``device`` and the context to run it in (the second device needs its mode)."""
    model = copy.deepcopy(model)
    if device == "second":
        return on_second_device(model), SecondDevice()
    return model.to(device), _Nothing()


class _Nothing:
    mismatches: list = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _batches(family: str):
    out = []
    for seed in (1, 2):
        x = inputs(family, batch=3, seed=seed)
        x["labels"] = labels(family, x, seed=seed)
        out.append(x)
    return out


def _close(got: dict, want: dict, rel: float = 1e-5):
    assert got.keys() == want.keys()
    for name in want:
        g, w = got[name].detach().cpu().double(), want[name].detach().cpu().double()
        assert g.shape == w.shape, name
        if w.numel() == 0:  # e.g. an FFN the plan emptied
            continue
        assert (g - w).abs().max().item() <= rel * max(w.abs().max().item(), 1e-12), (name, g, w)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["bert", "llama", "bart"])
def test_scores_on_the_model_device_equal_the_cpu_scores(family, device):
    model, batches = build(family), _batches(family)
    want_i = hp.head_importance(model, batches, normalize=None)
    want_f = hp.fisher_information(model, batches)
    placed, mode = _placed(model, device)
    with mode:
        got_i = hp.head_importance(placed, batches, normalize=None)  # CPU batches: moved to the model once
        got_f = hp.fisher_information(placed, batches)
    assert mode.mismatches == []
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in got_i.values())
    assert all(t.device.type == "cpu" and t.dtype == torch.float64 for t in got_f.blocks.values())
    _close(got_i, want_i)
    _close(got_f.blocks, want_f.blocks)
    assert got_f.n == want_f.n == 6


def _plant_in_mask_hook(monkeypatch):
    """``x * torch.ones(width)``: harmless on the CPU, a device error on a GPU."""
    from headprune.core.masks import masking

    original = masking._ScaleUnits.__call__

    def planted(self, module, args):
        out = original(self, module, args)
        return (out[0] * torch.ones(out[0].shape[-1]), *out[1:])

    monkeypatch.setattr(masking._ScaleUnits, "__call__", planted)


def _forget_to_move_the_batch(monkeypatch):
    import headprune.scoring.gradients as gradients

    monkeypatch.setattr(gradients, "to_device", lambda batch, device: dict(batch))


@pytest.mark.parametrize("plant", [_plant_in_mask_hook, _forget_to_move_the_batch])
def test_a_cpu_tensor_planted_in_the_scoring_path_is_caught(monkeypatch, plant):
    """The check can fail: the same scoring call as above, with a CPU tensor planted in its path."""
    model, batches = build("bert"), _batches("bert")
    plant(monkeypatch)
    cpu_result = hp.head_importance(model, batches)  # on the CPU the plant goes unnoticed
    assert set(cpu_result) == {"encoder.0.self", "encoder.1.self"}
    placed, mode = _placed(model, "second")
    with pytest.raises(DeviceMismatch), mode:
        hp.head_importance(placed, batches)
    assert mode.mismatches and "CPU tensors" in mode.mismatches[0]


def test_a_planted_cpu_tensor_in_evaluation_is_caught(monkeypatch):
    """An evaluator that forgets to move its inputs is caught too (here: a plain ``torch.ones(n)``)."""
    import headprune.evaluation.classification as classification

    model = build("bert")
    tok = word_tokenizer(WORDS)
    ev = Classification(tok, ClassificationData(texts=["good film", "bad plot the", "fun"], labels=[0, 1, 2],
                                                source="mem", text_pairs=None), config=model.config, batch_size=2)
    placed, mode = _placed(model, "second")
    monkeypatch.setattr(classification, "to_device", lambda batch, device: {**batch, "attention_mask":
                                                                           torch.ones(batch["input_ids"].shape, dtype=torch.long)})
    with pytest.raises(DeviceMismatch), mode:
        ev.evaluate(placed)


@pytest.mark.parametrize("device", DEVICES)
def test_evaluation_sweeps_and_tuning_on_the_model_device(device):
    model = build("bert")
    tok = word_tokenizer(WORDS)
    data = ClassificationData(texts=["good film", "bad plot the", "fun", "dull slow story the a", "great actor"],
                              labels=[0, 1, 2, 1, 0], source="mem", text_pairs=None)
    ev = Classification(tok, data, config=model.config, batch_size=2)
    want_eval = ev.evaluate(model)
    settings = SweepSettings()
    want_sweep = one_head_ablation(model, ev, settings=settings, progress=False)
    drop = {"encoder.0.self": [1], "encoder.1.self": [0, 3]}
    want_tune = tune_scales(model, list(ev.batches()), drop)
    placed, mode = _placed(model, device)
    with mode:
        got_eval = ev.evaluate(placed)
        got_sweep = one_head_ablation(placed, ev, settings=settings, progress=False)
        got_tune = tune_scales(placed, list(ev.batches()), drop)
        with hp.masked(placed, hp.mask_from_heads(placed, drop)):
            masked_eval = ev.evaluate(placed)
    assert mode.mismatches == []
    assert got_eval.score == want_eval.score
    assert abs(got_eval.per_example["loss"] - want_eval.per_example["loss"]).max() <= 1e-5
    assert [r["score"] for r in got_sweep.rows] == pytest.approx([r["score"] for r in want_sweep.rows], abs=1e-12)
    _close(got_tune.scales, want_tune.scales, rel=1e-4)
    with hp.masked(model, hp.mask_from_heads(model, drop)):
        assert masked_eval.per_example["loss"] == pytest.approx(ev.evaluate(model).per_example["loss"], abs=1e-5)


def test_lm_evaluation_on_the_model_device():
    from headprune.evaluation.lm import LanguageModelling

    model = build("llama")
    tok = word_tokenizer(WORDS)
    ev = LanguageModelling(tok, [" ".join(WORDS * 4)], block_size=8, batch_size=2)
    want = ev.evaluate(model)
    placed, mode = _placed(model, "second")
    with mode:
        got = ev.evaluate(placed)
    assert mode.mismatches == [] and got.score == pytest.approx(want.score, rel=1e-5)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_bfloat16_scores_are_close_to_float32(family):
    """A bfloat16 model's per-example gradients carry bf16 rounding; the float64 sums of I_h stay close
    (relative to the size of the score vector) to those of the same model in float32."""
    model, batches = build(family), _batches(family) * 3
    want = hp.head_importance(model, batches, normalize=None)
    got = hp.head_importance(copy.deepcopy(model).to(torch.bfloat16), batches, normalize=None)
    for name in want:
        w, g = want[name].double(), got[name].double()
        assert got[name].dtype == torch.float32 and torch.isfinite(g).all()
        assert (g - w).norm() <= 0.05 * w.norm(), (name, g, w)


def test_device_and_dtype_flags_are_checked_and_used(tmp_path):
    from typer.testing import CliRunner

    from headprune.cli import app
    from headprune.core.model.devices import best_device, resolve_device, resolve_dtype

    assert resolve_device(None).type == best_device() and resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("bfloat16") is torch.bfloat16 and resolve_dtype(None) is None
    model = build("bert")
    hp.save_pruned(model, tmp_path / "m", tokenizer=word_tokenizer(WORDS))
    (tmp_path / "d.tsv").write_text("sentence\tlabel\ngood film\t0\nbad plot\t1\nthe fun actor\t2\n")
    base = ["importance", str(tmp_path / "m"), "--task", "classification", "--data", str(tmp_path / "d.tsv")]
    runner = CliRunner()
    for args, message in ([["--device", "tpu"], "--device 'tpu'; allowed: cpu, cuda, cuda:N, mps"],
                          [["--dtype", "float64"], "--dtype 'float64'; allowed: float32, bfloat16, float16"]):
        result = runner.invoke(app, [*base, *args, "-o", str(tmp_path / "never")])
        assert result.exit_code == 2 and message in result.output and not (tmp_path / "never").exists()
    if not torch.cuda.is_available():
        result = runner.invoke(app, [*base, "--device", "cuda:1", "-o", str(tmp_path / "never")])
        assert result.exit_code == 2 and "no CUDA device here" in result.output
    result = runner.invoke(app, [*base, "--dtype", "bfloat16", "--normalize", "none", "-o", str(tmp_path / "bf16")])
    assert result.exit_code == 0, result.output
    loaded = hp.load_model(tmp_path / "m", dtype=torch.bfloat16, device="cpu")
    assert next(loaded.parameters()).dtype == torch.bfloat16


def test_load_with_device_map_a_pruned_and_a_plain_model(tmp_path):
    pytest.importorskip("accelerate")
    model = build("llama")
    hp.save_pruned(model, tmp_path / "plain")
    pruned = copy.deepcopy(model)
    hp.prune_heads(pruned, {"decoder.0.self": [1, 4]})
    hp.save_pruned(pruned, tmp_path / "pruned")
    x = inputs("llama")
    for path, want in ((tmp_path / "plain", model), (tmp_path / "pruned", pruned)):
        loaded = hp.load_model(path, device_map={"": "cpu"})
        with torch.no_grad():
            assert torch.allclose(loaded(**x).logits, want(**x).logits, atol=1e-5)
    with pytest.raises(hp.ConfigError, match="one of them"):
        hp.load_model(tmp_path / "plain", device="cpu", device_map="auto")


@pytest.mark.parametrize("device", DEVICES)
def test_head_and_neuron_fisher_and_flop_count_on_the_model_device(device):
    from headprune.core.model.cost import flops_per_example
    from headprune.scoring.units import unit_fisher

    model, batches = build("llama"), _batches("llama")
    want = unit_fisher(model, batches)
    want_flops = flops_per_example(model, 8)
    placed, mode = _placed(model, device)
    with mode:
        got = unit_fisher(placed, batches)
        flops = flops_per_example(placed, 8)
    assert mode.mismatches == [] and got.n == want.n and flops == want_flops
    _close(got.blocks, want.blocks)
    _close(got.neurons, want.neurons)
    assert all(t.device.type == "cpu" for t in (*got.blocks.values(), *got.neurons.values()))


@pytest.mark.parametrize("device", DEVICES)
def test_reconstruction_and_distillation_on_the_model_device(device):
    """The refit and the distillation follow the model's device and compute what they compute on the CPU,
    from one plan (the plan is chosen once: on CUDA, rounding can flip the order of near-tied units)."""
    from headprune.compression import Distill, PruneSettings, compress
    from headprune.compression.distill import distill
    from headprune.compression.reconstruct import reconstruct

    teacher, batches = build("llama"), _batches("llama") * 2
    settings = PruneSettings(units="both", share=0.5, seq_len=8, compensate=["reconstruct", Distill(lr=1e-3)],
                             guard=False)
    plan = compress(teacher, batches, settings)
    placed_teacher, mode = _placed(teacher, device)
    with mode:  # the whole pipeline on the device: no tensor left on the CPU, the same budget met
        got = compress(placed_teacher, batches, settings)
    assert mode.mismatches == []
    assert got.sizes["after"] == plan.sizes["after"]

    def stages(student, teacher):
        reconstruct(student, teacher, batches)
        refit = {k: v.detach().clone() for k, v in student.named_parameters()}
        losses = distill(student, teacher, batches, epochs=1, lr=1e-3, seed=0)["losses"]
        return refit, losses, dict(student.named_parameters())

    student = copy.deepcopy(teacher)
    hp.prune_heads(student, plan.dropped_heads)
    hp.prune_neurons(student, plan.dropped_neurons)
    want_refit, want_losses, want = stages(copy.deepcopy(student), teacher)
    placed_student, mode = _placed(student, device)
    with mode:
        got_refit, got_losses, got_params = stages(placed_student, placed_teacher)
    assert mode.mismatches == []
    _close(got_refit, want_refit, rel=1e-4)
    # the loss before any step: a KL near zero (the refit matched the teacher), so float32 rounding of the
    # logits bounds it in absolute terms (seen on an H200: 2.4351e-05 vs 2.4394e-05 on the CPU)
    assert len(got_losses) == len(want_losses)
    assert got_losses[0] == pytest.approx(want_losses[0], rel=1e-4, abs=16 * torch.finfo(torch.float32).eps)
    if device == "second":  # the CPU's own arithmetic: the same numbers
        _close(got_params, want, rel=1e-4)
    else:  # Adam moves a weight by about lr per step whatever its gradient's size, so a gradient that
        # rounds differently on the GPU near zero can move a weight the other way: at most 2 lr per step
        bound = 2 * 1e-3 * len(want_losses)
        for name, w in want.items():
            got_w = got_params[name].detach().cpu()
            assert got_w.shape == w.shape, name
            if w.numel():  # a tensor the plan emptied (an FFN with no neurons left) has nothing to compare
                assert (got_w - w.detach()).abs().max() <= bound, name
