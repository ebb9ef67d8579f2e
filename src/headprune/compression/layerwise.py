"""Replaying a model's layer stack one layer at a time, from recorded inputs, for layer-by-layer refits.

A refit of layer ``i`` needs the inputs the model gives layer ``i`` after layers ``0..i-1`` were refitted.
Running the whole model from the start for every projection costs ``O(L^2)`` layer passes; a
:class:`LayerStack` records, once, what each layer of the stack is called with (its hidden-state
argument and everything else: attention masks, rotary embeddings, per-layer masks) and then runs one
layer at a time, handing each layer's output to the next: ``O(L)`` passes.

It is used only where it provably computes what the whole model computes. :func:`layer_stack`
returns None (and the caller runs the whole model, as before) unless, in a recorded forward of the
first batch: one ``nn.ModuleList`` holds every projection to refit, each of its layers runs exactly
once and in order, each layer's hidden-state input *is* the previous layer's hidden-state output (so
nothing between layers changes it), and every given normalisation layer outside the stack reads the
last layer's output (pre-LN models' final norm). Encoder-decoders are left to the whole-model path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from ..core.model.inputs import model_inputs


class LayerStack:
    """The layers of one ``nn.ModuleList`` and, per batch, what each layer was called with."""

    def __init__(self, layers: nn.ModuleList, calls: list[list[tuple[tuple, dict]]], hidden: list[torch.Tensor]):
        self.layers = layers
        self.calls = calls  # [batch][layer] -> (args, kwargs), the hidden-state argument taken out
        self.hidden = hidden  # [batch] the current layer's hidden-state input
        self.index = 0  # the layer whose inputs ``hidden`` are

    def layer_of(self, module: nn.Module) -> int | None:
        """The index of the layer that holds ``module`` (None: outside the stack)."""
        return _layer_of(self.layers, module)

    def run(self, b: int, hooks: Sequence[tuple[nn.Module, str, object]] = ()) -> torch.Tensor | None:
        """The current layer on batch ``b``'s recorded input, with ``hooks`` ((module, "pre" | "post", fn));
        its hidden-state output (None when a hook ended the pass by raising :class:`Stop`)."""
        args, kwargs = _with_hidden(*self.calls[b][self.index], self.hidden[b])
        handles = [m.register_forward_pre_hook(fn) if kind == "pre" else m.register_forward_hook(fn)
                   for m, kind, fn in hooks]
        try:
            with torch.no_grad():
                return _hidden(self.layers[self.index](*args, **kwargs))
        except Stop:
            return None
        finally:
            for h in handles:
                h.remove()

    def advance(self, before: Callable[[int], None] | None = None) -> None:
        """Run the current layer (as it is now) on every batch: its outputs become the next layer's inputs.
        ``before(b)``: called before batch ``b`` runs (e.g. to tell hooks which batch comes)."""
        hidden = []
        for b in range(len(self.hidden)):
            if before is not None:
                before(b)
            hidden.append(self.run(b))
        self.hidden = hidden
        self.index += 1


class Stop(Exception):
    """Raised by a hook passed to :meth:`LayerStack.run`: the rest of the layer is not needed."""


def layer_stack(model: nn.Module, batches: Sequence[Mapping[str, torch.Tensor]],
                units: list[tuple[nn.Module, nn.Module | None]], *, budget: float = float("inf")) -> LayerStack | None:
    """A :class:`LayerStack` of ``model`` recorded on ``batches``, or None where replaying it layer by layer
    would not compute what the whole model computes (see the module doc), or where one layer's hidden
    states for all batches would take more than ``budget`` bytes. ``units``: (projection, the
    normalisation layer whose input its refit reads, or None)."""
    if getattr(model.config, "is_encoder_decoder", False) or not units:
        return None
    layers = _holding_list(model, [p for p, _ in units])
    if layers is None:
        return None
    outside = {}  # norm -> the layer whose output it must read: norms past the projection's own layer
    for proj, norm in units:
        if norm is not None and _layer_of(layers, norm) != _layer_of(layers, proj):
            outside[norm] = _layer_of(layers, proj)
    calls, hidden, shared = [], [], False
    for b, batch in enumerate(batches):
        # every layer given the very same arguments in batch 0's whole forward (made once, before the layers):
        # later batches run up to layer 0 only, and its arguments serve every layer
        record = _record_first(model, batch, layers) if shared else _record_calls(model, batch, layers,
                                                                                    outside if b == 0 else {})
        if record is None:
            return None
        calls.append(record[0])
        hidden.append(record[1])
        if b == 0 and record[1].numel() * record[1].element_size() * len(batches) > budget:
            return None
        shared = shared or (b == 0 and all(_same(c, record[0][0]) for c in record[0][1:]))
    return LayerStack(layers, calls, hidden)


def _layer_of(layers: nn.ModuleList, module: nn.Module) -> int | None:
    for i, layer in enumerate(layers):
        if any(m is module for m in layer.modules()):
            return i
    return None


def _holding_list(model: nn.Module, projections: list[nn.Module]) -> nn.ModuleList | None:
    """The ``nn.ModuleList`` whose layers together hold every projection (the innermost such list)."""
    best = None
    for module in model.modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        held = {id(m) for layer in module for m in layer.modules()}
        if all(id(p) in held for p in projections):
            best = module  # modules() walks outside-in: a later hit is nested inside an earlier one
    return best


def _record_calls(model, batch, layers: nn.ModuleList, outside: Mapping[nn.Module, int]):
    """([layer] (args, kwargs) without the hidden state, layer 0's hidden input) of one forward, or None
    if the layers do not run once each, in order, each fed the previous one's output unchanged, or a
    norm of ``outside`` does not first read the output of its layer."""
    calls: list[tuple[tuple, dict] | None] = [None] * len(layers)
    inputs: list[torch.Tensor | None] = [None] * len(layers)
    outputs: list[torch.Tensor | None] = [None] * len(layers)
    order: list[int] = []
    norm_inputs: dict[int, torch.Tensor] = {}

    def before(i, args, kwargs):
        order.append(i)
        h, rest_args, rest_kwargs = _split_hidden(args, kwargs)
        calls[i], inputs[i] = (rest_args, rest_kwargs), h

    def after(i, out):
        outputs[i] = _hidden(out)

    def read(module, args):
        norm_inputs.setdefault(id(module), args[0])

    def stop(_module, _args):
        raise Stop

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda m, a, k, i=i: before(i, a, k), with_kwargs=True))
        handles.append(layer.register_forward_hook(lambda m, a, o, i=i: after(i, o)))
    handles += [n.register_forward_pre_hook(read) for n in outside]
    head = _output_head(model, layers)
    if head is not None:  # everything checked below has run by then; the logits are not needed
        handles.append(head.register_forward_pre_hook(stop))
    try:
        with torch.no_grad():
            model(**model_inputs(model, batch, cache=False))
    except Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    if order != list(range(len(layers))) or any(h is None for h in inputs) or any(o is None for o in outputs):
        return None
    if any(not torch.equal(inputs[i + 1], outputs[i]) for i in range(len(layers) - 1)):
        return None
    if any(id(n) not in norm_inputs or not torch.equal(norm_inputs[id(n)], outputs[i]) for n, i in outside.items()):
        return None
    return calls, inputs[0]


def _output_head(model: nn.Module, layers: nn.ModuleList) -> nn.Module | None:
    """The model's output head (``get_output_embeddings()``: the logits' projection, run once the stack and the final
    norm have), or None where there is none or it is also the input embedding or inside the stack. A model that ran
    it before its last layer would show an incomplete layer order: refused, not replayed."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    inputs = getattr(model, "get_input_embeddings", None)
    if not isinstance(head, nn.Module) or (callable(inputs) and inputs() is head):
        return None
    return None if any(m is head for m in layers.modules()) else head


def _record_first(model, batch, layers: nn.ModuleList):
    """What :func:`_record_calls` returns, from a forward stopped at layer 0: its (args, kwargs) for every layer
    (only where batch 0 showed every layer the same ones), and its hidden input."""
    seen: list = []

    def before(_module, args, kwargs):
        seen.append(_split_hidden(args, kwargs))
        raise Stop

    handle = layers[0].register_forward_pre_hook(before, with_kwargs=True)
    try:
        with torch.no_grad():
            model(**model_inputs(model, batch, cache=False))
    except Stop:
        pass
    finally:
        handle.remove()
    if not seen or seen[0][0] is None:
        return None
    h, rest_args, rest_kwargs = seen[0]
    return [(rest_args, rest_kwargs)] * len(layers), h


def _same(a, b) -> bool:
    """The same objects (tensors by identity, containers item by item, other values by equality)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or type(a) is not type(b):
        return False
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value that cannot be compared is not the same
        return False


def _split_hidden(args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, tuple, dict]:
    if args and isinstance(args[0], torch.Tensor):
        return args[0], (None, *args[1:]), dict(kwargs)
    if isinstance(kwargs.get("hidden_states"), torch.Tensor):
        return kwargs["hidden_states"], tuple(args), {k: v for k, v in kwargs.items() if k != "hidden_states"}
    return None, tuple(args), dict(kwargs)


def _with_hidden(args: tuple, kwargs: dict, h: torch.Tensor) -> tuple[tuple, dict]:
    if args and args[0] is None:  # it was the first positional argument
        return (h, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": h}


def _hidden(out) -> torch.Tensor:
    """A layer's hidden-state output: the tensor, or the first element of a tuple / model output."""
    if isinstance(out, torch.Tensor):
        return out
    return out[0]
