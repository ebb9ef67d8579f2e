"""Layer-by-layer replay for the reconstruction (headprune.compression.layerwise): it gives the same fit as
running the whole model per projection, and it is refused wherever the replay would not compute what
the whole model computes."""

from __future__ import annotations

import copy

import pytest
import torch

import headprune as hp
from headprune.compression.layerwise import layer_stack
from headprune.compression.reconstruct import reconstruct
from headprune.core.prune import prune_neurons
from headprune.errors import ConfigError
from tiny import build, inputs, labels


def _setup(family):
    teacher = build(family)
    student = copy.deepcopy(teacher)
    hp.prune_heads(student, {hp.find_sites(student)[0].name: [1]}, verify=False)
    prune_neurons(student, {f.name: [0, 3, 8] for f in hp.find_ffns(student)})
    batches = [{**x, "labels": labels(family, x, seed=s)} for s in range(3) for x in [inputs(family, batch=4, seed=s)]]
    return teacher, student, batches


def _same_fit(teacher, student, batches, **kwargs):
    a, b = copy.deepcopy(student), copy.deepcopy(student)
    rows_a = reconstruct(a, teacher, batches, layerwise=True, **kwargs)
    rows_b = reconstruct(b, teacher, batches, layerwise=False, **kwargs)  # the whole model per projection
    assert [r["target"] for r in rows_a] == [r["target"] for r in rows_b]
    moved = 0.0
    for p, q, s in zip(a.parameters(), b.parameters(), student.parameters(), strict=True):
        p, q, s = p.detach(), q.detach(), s.detach()
        assert (p - q).abs().max() <= 1e-6 * max(float(q.abs().max()), 1e-12)
        moved = max(moved, float((q - s).abs().max()))
    assert moved > 1e-4  # the refit did change the weights: the comparison is not between two no-ops


@pytest.mark.parametrize("family", ["bert", "distilbert", "gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("target", ["residual", "output"])
def test_layer_by_layer_replay_gives_the_whole_model_fit(family, target):
    teacher, student, batches = _setup(family)
    _same_fit(teacher, student, batches, target=target)


def test_encoder_decoders_use_the_whole_model():
    teacher, student, batches = _setup("bart")
    with pytest.raises(ConfigError, match="layerwise=True: BartForConditionalGeneration cannot be replayed"):
        reconstruct(copy.deepcopy(student), teacher, batches, layerwise=True)
    a, b = copy.deepcopy(student), copy.deepcopy(student)
    reconstruct(a, teacher, batches)  # the default falls back
    reconstruct(b, teacher, batches, layerwise=False)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_something_between_layers_or_a_layer_run_twice_is_refused():
    teacher, student, batches = _setup("llama")
    layers = student.model.layers
    units = [(f.down, None) for f in hp.find_ffns(student)]
    assert layer_stack(student, batches, units) is not None
    handle = layers[1].register_forward_pre_hook(lambda m, args, kwargs: ((args[0] * 2, *args[1:]), kwargs)
                                                 if args else (args, {**kwargs, "hidden_states": 2 *
                                                                      kwargs["hidden_states"]}), with_kwargs=True)
    try:
        assert layer_stack(student, batches, units) is None  # layer 1 does not read layer 0's output
        _same_fit_default_is_whole_model(teacher, student, batches)
    finally:
        handle.remove()
    twice = copy.deepcopy(student)
    twice.model.layers = torch.nn.ModuleList([twice.model.layers[0], twice.model.layers[0]])  # one layer, run twice
    assert layer_stack(twice, batches, [(hp.find_ffns(twice)[0].down, None)]) is None


def _same_fit_default_is_whole_model(teacher, student, batches):
    a, b = copy.deepcopy(student), copy.deepcopy(student)
    reconstruct(a, teacher, batches)
    reconstruct(b, teacher, batches, layerwise=False)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_a_replay_past_the_memory_budget_runs_the_whole_model():
    teacher, student, batches = _setup("gpt2")
    with pytest.raises(ConfigError, match="more than cache_mb"):
        reconstruct(copy.deepcopy(student), teacher, batches, layerwise=True, cache_mb=1e-6)
    a, b = copy.deepcopy(student), copy.deepcopy(student)
    reconstruct(a, teacher, batches, cache_mb=1e-6)  # falls back (and recomputes the targets)
    reconstruct(b, teacher, batches, layerwise=False)
    assert all((p - q).abs().max() <= 1e-6 * max(float(q.abs().max()), 1e-12)
               for p, q in zip(a.parameters(), b.parameters(), strict=True) if q.numel())


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_replaying_every_layer_gives_the_models_own_logits_on_every_batch(family):
    """Batch 0 shows every layer the same arguments, so later batches are recorded up to layer 0 only: the replay
    of each batch through every layer, then the model's final norm and head, is the model's own forward."""
    model = build(family)
    batches = [inputs(family, batch=3, seed=s) for s in range(3)]
    stack = layer_stack(model, batches, [(f.down, None) for f in hp.find_ffns(model)])
    assert stack is not None
    assert all(stack.calls[b][0] is stack.calls[b][-1] for b in (1, 2))  # the shortcut was taken
    for _ in range(len(stack.layers)):
        stack.advance()
    for b, batch in enumerate(batches):
        with torch.no_grad():
            want = model(**batch).logits
            got = model.lm_head(model.model.norm(stack.hidden[b]))
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, hidden_states, scale):
        return torch.tanh(self.linear(hidden_states)) * scale


class _PerLayer(torch.nn.Module):
    """A stack whose layers are each given their own argument, made from the batch (as per-layer masks are)."""

    def __init__(self):
        super().__init__()
        self.config = type("Config", (), {"is_encoder_decoder": False})()
        self.layers = torch.nn.ModuleList(_Scaled() for _ in range(3))

    def forward(self, input_ids):
        h = input_ids.float()
        for i, layer in enumerate(self.layers):
            h = layer(h, scale=(i + 1) * input_ids.float().mean(1, keepdim=True))
        return h


def test_layers_given_their_own_arguments_are_recorded_whole_on_every_batch():
    torch.manual_seed(0)
    model = _PerLayer()
    batches = [{"input_ids": torch.randint(1, 9, (2, 4), generator=torch.Generator().manual_seed(s))} for s in range(3)]
    stack = layer_stack(model, batches, [(layer.linear, None) for layer in model.layers])
    assert stack is not None
    assert all(stack.calls[b][0] is not stack.calls[b][1] for b in range(3))
    for _ in range(len(stack.layers)):
        stack.advance()
    for b, batch in enumerate(batches):
        with torch.no_grad():
            assert torch.allclose(stack.hidden[b], model(**batch), rtol=1e-6, atol=0)


def test_recording_stops_before_the_output_head_and_refuses_a_head_run_inside_the_stack():
    """The recording forward of batch 0 ends where the output head would start (the logits are not needed); a model
    that ran its head after its first layer (a logit lens) would be recorded with its later layers missing, so
    the replay is refused instead."""
    model = build("llama")
    batches = [inputs("llama", batch=3, seed=s) for s in range(2)]
    units = [(f.down, None) for f in hp.find_ffns(model)]
    calls = []
    counted = model.lm_head.register_forward_hook(lambda m, a, out: calls.append(1))  # after it ran
    try:
        stack = layer_stack(model, batches, units)
    finally:
        counted.remove()
    assert stack is not None and calls == []
    lens = model.model.layers[0].register_forward_hook(lambda m, a, out: model.lm_head(out[0] if isinstance(out, tuple)
                                                                                       else out) and None)
    try:
        assert layer_stack(model, batches, units) is None
    finally:
        lens.remove()
