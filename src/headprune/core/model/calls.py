"""How an attention class is called and what it returns, read off one call of an unpruned copy.

A site that loses every head is replaced by a forward that does no attention work
(:class:`~headprune.core.model.runtime.RemovedAttention`). It must accept the arguments the family's
attention takes and return what its callers unpack, which differs between families: the hidden
states are ``hidden_states``, ``input`` or ``query_tensor``; the result is a tensor, ``(out,)``,
``(out, weights)``, ``(out, weights, cache)`` or ``(out, weights, bias)``. The safety net
(:mod:`.verify`) runs the shrunk copy of each family once with hooks and records a
:class:`CallTemplate` per attention class. A model whose sites lose every head carries the templates it
needs: each removed site holds its own (``_hp_call``), and ``config.json`` holds them as plain data
(:data:`.records.CALLS_KEY`, :func:`template_record`), so a model loaded in a fresh process runs
without any verification. The removed-site forward fills the template in: the output
projection's result where the original returned it, ``None`` for what the original computed (the
verifier's checks prove nothing downstream needed it), and the same object where the original
returned one of its arguments or its own parameters.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

OUT, NONE, ARGUMENT, ATTRIBUTE = "out", "none", "argument", "attribute"


@dataclass(frozen=True)
class CallTemplate:
    hidden: str  # name of the forward argument holding the hidden states [B, T, d]
    outputs: tuple[tuple[str, str], ...] | None  # None: returns a tensor; else per element (kind, name)


TEMPLATES: dict[type, CallTemplate] = {}  # attention class (the model's own) -> template, as the trial read it


def template_record(template: CallTemplate) -> dict:
    """``template`` as JSON-able data (for ``config.json``)."""
    return {"hidden": template.hidden,
            "outputs": None if template.outputs is None else [list(e) for e in template.outputs]}


def template_from_record(record) -> CallTemplate | None:
    """The template :func:`template_record` wrote; None for anything else (an older or edited file)."""
    if not (isinstance(record, dict) and isinstance(record.get("hidden"), str)):
        return None
    outputs = record.get("outputs")
    if outputs is None:
        return CallTemplate(record["hidden"], None)
    kinds = (OUT, NONE, ARGUMENT, ATTRIBUTE)
    if not (isinstance(outputs, list) and all(
            isinstance(e, list | tuple) and len(e) == 2 and e[0] in kinds and isinstance(e[1], str) for e in outputs)):
        return None
    return CallTemplate(record["hidden"], tuple((str(k), str(n)) for k, n in outputs))


def hidden_argument(arguments: dict) -> str | None:
    """The forward argument holding the hidden states [B, T, d]: ``hidden_states``, else the first floating
    tensor of two or more dimensions (XLM's ``input``, ProphetNet's ``hidden_states`` ...)."""
    tensors = [n for n, v in arguments.items() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() >= 2]
    if not tensors:
        return None
    return "hidden_states" if "hidden_states" in tensors else tensors[0]


def bound_arguments(cls: type, module: nn.Module, args: tuple, kwargs: dict) -> dict:
    """``cls.forward``'s arguments by name (extra ``**kwargs`` flattened in), without ``self``."""
    signature = inspect.signature(cls.forward)
    arguments = dict(signature.bind(module, *args, **kwargs).arguments)
    arguments.pop(next(iter(signature.parameters)), None)  # self
    for name, param in signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name, {}))
    return arguments


def read_template(module: nn.Module, args: tuple, kwargs: dict, output, projected: list[torch.Tensor],
                  bert_style: bool) -> CallTemplate | None:
    """The template of one call: ``projected`` are the output projection's results during the call
    (for BERT-style sites the projection runs outside the module: its input is the first 3-D tensor)."""
    cls = getattr(type(module), "_hp_base", type(module))
    arguments = bound_arguments(cls, module, args, kwargs)
    hidden = hidden_argument(arguments)
    if hidden is None:
        return None
    if isinstance(output, torch.Tensor):
        return CallTemplate(hidden, None)
    if not isinstance(output, tuple):
        return None
    own = dict(module.named_parameters(recurse=False)) | dict(module.named_buffers(recurse=False))
    shapes = {tuple(p.shape) for p in projected}
    elements, found = [], False
    for element in output:
        if element is None:
            elements.append((NONE, ""))
        elif not found and isinstance(element, torch.Tensor) and (
                any(element is p for p in projected) or tuple(element.shape) in shapes
                or (bert_style and element.dim() == 3)):
            elements.append((OUT, ""))
            found = True
        elif (name := next((n for n, v in arguments.items() if v is element), None)) is not None:
            elements.append((ARGUMENT, name))
        elif (name := next((n for n, v in own.items() if v is element), None)) is not None:
            elements.append((ATTRIBUTE, name))
        else:
            elements.append((NONE, ""))  # computed by the attention (weights ...): a removed site has none
    return CallTemplate(hidden, tuple(elements)) if found else None


def fill(template: CallTemplate, out: torch.Tensor, arguments: dict, module: nn.Module):
    """What a removed site returns: ``out`` (the output projection's result) in the template's shape."""
    if template.outputs is None:
        return out
    values = []
    for kind, name in template.outputs:
        if kind == OUT:
            values.append(out)
        elif kind == ARGUMENT:
            values.append(arguments.get(name))
        elif kind == ATTRIBUTE:
            values.append(getattr(module, name, None))
        else:
            values.append(None)
    return tuple(values)
