"""What a pruned model runs that transformers does not ship: the modules and forwards surgery installs.

- :class:`RepeatHeads`: the key/value projection of a grouped-query site pruned unevenly.
- :class:`BiasOnly`: an output projection whose heads are all gone (its bias remains).
- :class:`RemovedAttention`: the forward of a site with no heads left (cache bookkeeping only).
- :class:`T5PrunedAttention`: T5 attention that takes its own heads' rows of the shared position bias.

Forwards are swapped in by changing the module's class to a subclass of the model's own class
(:func:`swap_class`), so ``isinstance`` checks, state dicts and module paths stay the model's.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from .calls import TEMPLATES, fill, hidden_argument


class RepeatHeads(nn.Module):
    """Key/value projection of a grouped-query site whose kept query heads are unevenly spread.

    ``base`` computes only the kept key/value heads; ``index`` [out_heads] names, for each head the
    attention sees, which base head it is. Surgery keeps groups as large as it can (the gcd of the
    kept query heads per key/value head), so a head is repeated only where GQA cannot express the
    plan. Weights are never copied: the parameter count is that of the kept heads.
    """

    def __init__(self, base: nn.Linear, index: torch.Tensor, head_dim: int):
        super().__init__()
        self.base = base
        self.head_dim = head_dim
        self.register_buffer("index", index.to(torch.long), persistent=False)  # [out_heads]

    @property
    def num_base_heads(self) -> int:
        return self.base.out_features // self.head_dim

    @property
    def out_features(self) -> int:
        return self.index.numel() * self.head_dim

    @property
    def weight(self) -> torch.Tensor:  # lets dtype/device probes treat it like a Linear
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., in] -> [..., out_heads * head_dim]
        y = self.base(x).unflatten(-1, (self.num_base_heads, self.head_dim))  # [..., base_heads, hd]
        return y.index_select(-2, self.index).flatten(-2)


class BiasOnly(nn.Module):
    """What an output projection leaves when every head it reads is removed: its bias (or zeros)."""

    def __init__(self, bias: torch.Tensor | None, out_features: int):
        super().__init__()
        self.out_features = out_features
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=bias.requires_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., 0] -> [..., out]
        shape = (*x.shape[:-1], self.out_features)
        if self.bias is None:
            return x.new_zeros(shape)
        bias = self.bias.to(x.dtype)
        # under no_grad a view of a parameter still reports requires_grad (without a grad_fn), which trips
        # autograd-graph tools (FlopCounterMode, ModuleTracker): detach unless gradients are wanted
        return (bias if torch.is_grad_enabled() else bias.detach()).expand(shape)

    def extra_repr(self) -> str:
        return f"out_features={self.out_features}, bias={self.bias is not None}"


def swap_class(module: nn.Module, mixin: type) -> None:
    """Give ``module`` the forward of ``mixin`` by making its class ``(mixin, its own class)``."""
    if isinstance(module, mixin):
        return
    base = getattr(type(module), "_hp_base", type(module))  # the model's own class, never a swapped one
    key = (mixin, base)
    if key not in SWAPPED_CLASSES:
        SWAPPED_CLASSES[key] = type(f"{mixin.__name__.strip('_')}{base.__name__}", (mixin, base),
                             {"_hp_base": base, "_hp_signature": inspect.signature(base.forward)})
    module.__class__ = SWAPPED_CLASSES[key]


# The documented class cache: one swapped class per (mixin, base), so every pruned module of a class shares one
# type (pickling, isinstance and torch.compile see one class); written once per key, never cleared.
SWAPPED_CLASSES: dict[tuple[type, type], type] = {}


def _arguments(module: nn.Module, args: tuple, kwargs: dict) -> dict:
    """The base class's forward arguments by name (extra **kwargs flattened in)."""
    signature = type(module)._hp_signature  # once per swapped class (an lru_cache makes dynamo warn)
    arguments = dict(signature.bind(module, *args, **kwargs).arguments)
    for name, param in signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name, {}))
    return arguments


CACHE_ARGUMENTS = ("past_key_values", "past_key_value", "layer_past", "cache")  # names attention forwards give the cache
SOURCE_ARGUMENTS = ("key_value_states", "encoder_hidden_states", "kv")  # ... and the attended sequence (cross)
LAYER_ATTRIBUTES = ("layer_idx", "layer_id")  # names attention modules give their index in the cache


def cache_argument(arguments: dict):
    """The key/value cache among an attention forward's arguments, whatever the family calls it."""
    for name in CACHE_ARGUMENTS:
        if arguments.get(name) is not None:
            return arguments[name]
    return None


def layer_index(module: nn.Module) -> int:
    """The attention module's layer index in the cache, whatever the family calls it."""
    for name in LAYER_ATTRIBUTES:
        value = getattr(module, name, None)
        if isinstance(value, int):
            return value
    raise TypeError(f"{type(module).__name__} has none of {LAYER_ATTRIBUTES}: its cache layer is unknown")


class RemovedAttention(nn.Module):
    """Forward of a site with no heads: no projections, no attention; cache bookkeeping only.

    Arguments and results follow the family's :class:`~.calls.CallTemplate`: the module's own
    (``_hp_call``: computed from the model or read from its config.json), else the one the safety net
    recorded in this process; with none, the hidden states are found by :func:`~.calls.hidden_argument`
    and ``(out, None)`` is returned, as most families do."""

    def forward(self, *args, **kwargs):
        a = _arguments(self, args, kwargs)
        template = None
        if self._hp_style != "t5":
            template = getattr(self, "_hp_call", None) or TEMPLATES.get(type(self)._hp_base)
        hidden = a[template.hidden if template is not None else hidden_argument(a)]  # [B, T, d]
        source = next((a[n] for n in SOURCE_ARGUMENTS if a.get(n) is not None), None)
        cache = cache_argument(a)
        bias = t5_bias_to_pass(self, a.get("position_bias"), hidden, cache) if self._hp_style == "t5" else None
        _keep_cache_in_step(self, cache, hidden, source)  # after the bias: it reads the past length
        if self._hp_style == "bert":
            out = hidden.new_zeros(*hidden.shape[:-1], 0)  # output.dense is BiasOnly
        else:
            out = self.headprune_out(hidden[..., :0])
        if template is not None:
            return fill(template, out, a, self)
        return (out, bias, None) if self._hp_style == "t5" else (out, None)


def removed_attention_classes(model: nn.Module) -> dict[str, type]:
    """{class name: the model's own attention class} of the sites of ``model`` with no heads left."""
    return {type(m)._hp_base.__name__: type(m)._hp_base for m in model.modules() if isinstance(m, RemovedAttention)}


def give_calls(model: nn.Module, templates: dict) -> set[str]:
    """Hand each removed site of ``model`` its :class:`~.calls.CallTemplate` from ``templates`` ({attention
    class name: template}); returns the class names still without one."""
    missing = set()
    for module in model.modules():
        if isinstance(module, RemovedAttention) and getattr(module, "_hp_call", None) is None:
            template = templates.get(type(module)._hp_base.__name__)
            if template is None:
                missing.add(type(module)._hp_base.__name__)
            else:
                module._hp_call = template
    return missing


def _keep_cache_in_step(module, cache, hidden: torch.Tensor, source: torch.Tensor | None) -> None:
    """Store a [B, 1, T, 1] placeholder so the cache's sequence length (positions) stays right.

    transformers counts an empty cache entry as length 0, so the placeholder cannot be zero-sized;
    one float per token and example is the whole cost of a removed site in a cache.
    """
    if cache is None:
        return
    from transformers.cache_utils import EncoderDecoderCache

    layer = layer_index(module)
    cross = module._hp_cross or source is not None
    target = cache
    if isinstance(cache, EncoderDecoderCache):
        if cross and cache.is_updated.get(layer):
            return
        target = cache.cross_attention_cache if cross else cache.self_attention_cache
    states = source if (cross and source is not None) else hidden
    placeholder = hidden.new_zeros(hidden.shape[0], 1, states.shape[-2], 1)  # [B, 1, T, 1]
    target.update(placeholder, placeholder, layer)
    if cross and isinstance(cache, EncoderDecoderCache):
        cache.is_updated[layer] = True



# ---------------------------------------------------------------- T5's shared position bias

def shares_t5_bias(attn: nn.Module) -> bool:
    """T5-style attention: one relative-position bias for all heads, computed by the first layer and
    passed to the others as ``position_bias`` (UMT5's per-layer tables are plain per-head tensors)."""
    base = getattr(type(attn), "_hp_base", type(attn))
    return (hasattr(attn, "relative_attention_num_buckets") and hasattr(attn, "compute_bias")
            and "position_bias" in inspect.signature(base.forward).parameters)


def t5_bias_to_pass(attn, position_bias, hidden, cache):
    """The whole-head bias this layer passes on: the one it got, or the one its table computes."""
    if position_bias is not None or not attn.has_relative_attention_bias:
        return position_bias
    q_len = hidden.shape[1]
    past = cache.get_seq_length(layer_index(attn)) if cache is not None else 0
    return attn.compute_bias(q_len, q_len + past, device=hidden.device, past_seen_tokens=past)  # [1, H0, q, k]


class T5PrunedAttention(nn.Module):
    """T5 attention with some heads removed: takes its own rows of the whole-head position bias."""

    def forward(self, *args, **kwargs):
        a = _arguments(self, args, kwargs)
        full = t5_bias_to_pass(self, a.get("position_bias"), a["hidden_states"], cache_argument(a))
        own = full
        if full is not None and full.shape[1] == self._hp_total and len(self._hp_kept) != self._hp_total:
            own = full.index_select(1, torch.tensor(self._hp_kept, device=full.device))  # [1, kept, q, k]
        kwargs.pop("position_bias", None)
        if len(args) > 3:
            args = (*args[:3], own, *args[4:])
        else:
            kwargs["position_bias"] = own
        out, _, weights = self._hp_base.forward(self, *args, **kwargs)
        return out, full, weights
