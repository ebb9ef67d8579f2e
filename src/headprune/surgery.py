"""The irreversible stage: physically remove heads, so the model is smaller and faster.

For every site, surgery keeps the query/key/value output rows and the output-projection input
columns of the kept heads, updates the attention module's head-count metadata, and records the plan
in ``model.config``. A site that loses every head is replaced by a forward that does no attention
work at all and returns the output projection's bias (exactly what masking all its heads gives).

Grouped-query attention: a key/value head goes when all its query heads go. Kept query heads stay
contiguous per key/value head; if every key/value head keeps the same number ``g`` of query heads
the site stays plain GQA with groups of ``g``. Otherwise groups of ``gcd(counts)`` are used and the
few key/value heads that serve several groups are repeated at run time (:class:`RepeatHeads`),
never copied in the weights.

T5 computes one relative-position bias ``[1, heads, q, k]`` in its first layer and passes it on to
every later layer. Surgery keeps that bias table whole and makes each pruned layer take the rows of
its own kept heads (the bug of transformers v4's T5 pruning, #19625, cannot happen).

Indices given to :func:`prune_heads` are positions among the heads a site has *now*, ``0..n-1``.
On a model pruned before, :func:`kept_heads` maps them to the original head numbers.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from .errors import PlanError
from .masking import is_masked
from .modules import BiasOnly, RepeatHeads
from .sites import Projection, Site, find_sites, is_conv1d, out_features

PLAN_KEY = "headprune_plan"  # config attribute: {site: original indices of the kept heads}
HEADS_KEY = "headprune_heads"  # config attribute: {site: number of heads before any pruning}

Plan = dict[str, list[int]]


def original_heads(model: nn.Module) -> dict[str, int]:
    """Number of heads each site had before any pruning (removed sites included)."""
    recorded = getattr(model.config, HEADS_KEY, None)
    if recorded:
        return dict(recorded)
    return {s.name: s.num_heads for s in find_sites(model)}


def kept_heads(model: nn.Module) -> Plan:
    """For every site, the original indices of the heads it has now, in the order it holds them."""
    plan = getattr(model.config, PLAN_KEY, None) or {}
    return {name: list(plan.get(name, range(n))) for name, n in original_heads(model).items()}


def prune_heads(model: nn.Module, heads: Mapping[str, Iterable[int]]) -> Plan:
    """Remove ``heads`` ({site name: indices among the site's current heads}) from ``model`` in place.

    Everything is validated before anything changes. Returns the model's whole plan afterwards
    ({site: original indices of the kept heads}), also stored in ``model.config.headprune_plan``.
    """
    if is_masked(model):
        raise PlanError("model is masked; call headprune.unmask_heads(model) before prune_heads")
    if not isinstance(heads, Mapping):
        raise PlanError(f"heads must be a mapping site name -> head indices, got {type(heads).__name__}")
    sites = {s.name: s for s in find_sites(model)}
    before = kept_heads(model)
    drops: dict[str, list[int]] = {}
    for name, idx in heads.items():
        if name not in sites:
            gone = " (it has no heads left)" if name in before else ""
            raise PlanError(f"heads: unknown site {name!r}{gone}; allowed: {', '.join(sites) or '(none)'}")
        drops[name] = _check_indices(name, idx, sites[name].num_heads)
    plan = dict(getattr(model.config, PLAN_KEY, None) or {})
    for name, drop in drops.items():
        if not drop:
            continue
        site = sites[name]
        keep = [h for h in range(site.num_heads) if h not in set(drop)]
        plan[name] = [before[name][h] for h in keep]
        if keep:
            _slice_site(model, site, keep, plan[name])
        else:
            _remove_site(model, site)
    if not getattr(model.config, HEADS_KEY, None):
        setattr(model.config, HEADS_KEY, {n: len(k) for n, k in before.items()})
    setattr(model.config, PLAN_KEY, plan)
    return kept_heads(model)


def apply_plan(model: nn.Module, plan: Mapping[str, Iterable[int]], heads: Mapping[str, int] | None = None) -> Plan:
    """Replay a plan ({site: original indices of kept heads}) on an unpruned model of the same shape."""
    if getattr(model.config, PLAN_KEY, None):
        raise PlanError("apply_plan needs an unpruned model; this one already carries a headprune plan")
    current = {s.name: s.num_heads for s in find_sites(model)}
    if heads is not None and dict(heads) != current:
        diff = {n: (heads.get(n), current.get(n)) for n in set(heads) | set(current) if heads.get(n) != current.get(n)}
        raise PlanError(f"plan is for a different model: heads per site (plan, model) differ at {diff}")
    drops = {}
    for name, keep in plan.items():
        if name not in current:
            raise PlanError(f"plan: unknown site {name!r}; allowed: {', '.join(current)}")
        keep = _check_indices(name, keep, current[name])
        drops[name] = [h for h in range(current[name]) if h not in set(keep)]
    return prune_heads(model, drops)


def _check_indices(name: str, idx: Iterable[int], n: int) -> list[int]:
    if isinstance(idx, (str, bytes)) or not isinstance(idx, Iterable):
        raise PlanError(f"heads[{name!r}] must be a list of head indices, got {idx!r}")
    out = []
    for h in (idx.tolist() if isinstance(idx, torch.Tensor) else idx):
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < n:
            raise PlanError(f"heads[{name!r}]: head index {h!r} out of range; allowed: integers 0..{n - 1}")
        out.append(h)
    return sorted(set(out))


# ---------------------------------------------------------------- slicing kept heads

def _rows(heads: list[int], head_dim: int) -> torch.Tensor:
    return torch.tensor([h * head_dim + i for h in heads for i in range(head_dim)], dtype=torch.long)


def _select_out(module: nn.Module, rows: torch.Tensor) -> None:
    """Keep output features ``rows`` of a Linear / Conv1D, in place."""
    dim = 1 if is_conv1d(module) else 0
    _set(module, "weight", module.weight.index_select(dim, rows.to(module.weight.device)))
    if getattr(module, "bias", None) is not None:
        _set(module, "bias", module.bias.index_select(0, rows.to(module.bias.device)))
    if is_conv1d(module):
        module.nf = len(rows)
    else:
        module.out_features = len(rows)


def _select_in(module: nn.Module, cols: torch.Tensor) -> None:
    """Keep input features ``cols`` of a Linear / Conv1D, in place (the bias is untouched)."""
    dim = 0 if is_conv1d(module) else 1
    _set(module, "weight", module.weight.index_select(dim, cols.to(module.weight.device)))
    if not is_conv1d(module):
        module.in_features = len(cols)


def _set(module: nn.Module, name: str, value: torch.Tensor) -> None:
    old = getattr(module, name)
    setattr(module, name, nn.Parameter(value.detach().contiguous(), requires_grad=old.requires_grad))


def _kv_of_heads(site: Site) -> list[int]:
    """For each current query head, the base key/value head it reads."""
    groups = site.num_heads * site.head_dim // site.k.width  # query heads per key/value head seen
    seen = [h // groups for h in range(site.num_heads)]
    if isinstance(site.k.module, RepeatHeads):
        index = site.k.module.index.tolist()
        return [index[j] for j in seen]
    return seen


def _slice_site(model: nn.Module, site: Site, keep: list[int], kept_original: list[int]) -> None:
    hd, attn = site.head_dim, site.attention
    q_rows = _rows(keep, hd)
    kv_of = _kv_of_heads(site)
    kept_kv = sorted({kv_of[h] for h in keep})
    counts = [sum(1 for h in keep if kv_of[h] == j) for j in kept_kv]
    group = math.gcd(*counts)
    kv_rows = _rows(kept_kv, hd)
    if site.meta.get("fused") == "interleaved":  # [q_h | k_h | v_h] per head
        _select_out(site.q.module, _rows(keep, 3 * hd))
    elif site.meta.get("fused") == "blocks":
        _slice_fused(site, q_rows, kv_rows)
    else:
        _select_out(site.q.module, q_rows)
        for proj in (site.k, site.v):
            _slice_kv(attn, proj, kv_rows, kept_kv, counts, group, hd)
    for extra in site.meta.get("extras", []):
        _select_out(extra, q_rows)
    _select_in(site.o, q_rows)
    n = len(keep)
    for attr in ("num_heads", "num_attention_heads", "n_heads"):
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, n)
    for attr in ("all_head_size", "inner_dim"):
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, n * hd)
    if isinstance(getattr(attn, "num_key_value_groups", None), int):
        attn.num_key_value_groups = group
    if site.meta.get("fused") == "blocks":
        attn.split_size = n * hd
    if _is_t5(attn):
        _t5_take_heads(model, attn, kept_original)


def _slice_kv(attn, proj: Projection, kv_rows, kept_kv, counts, group, hd) -> None:
    module = proj.module
    base = module.base if isinstance(module, RepeatHeads) else module
    _select_out(base, kv_rows)
    if all(c == group for c in counts):
        new: nn.Module = base
    else:
        index = torch.tensor([j for j, c in enumerate(counts) for _ in range(c // group)], device=base.weight.device)
        new = RepeatHeads(base, index, hd)
    if new is not module:
        _replace_child(attn, module, new)


def _slice_fused(site: Site, q_rows: torch.Tensor, kv_rows: torch.Tensor) -> None:
    """GPT-2: c_attn packs [q | k | v] (or [k | v] with a separate q_attn)."""
    width = site.k.width
    if site.q.module is site.k.module:
        _select_out(site.k.module, torch.cat([q_rows, width + kv_rows, 2 * width + kv_rows]))
    else:
        _select_out(site.q.module, q_rows)
        _select_out(site.k.module, torch.cat([kv_rows, width + kv_rows]))


def _replace_child(parent: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for name, child in parent.named_children():
        if child is old:
            setattr(parent, name, new)
            return
    raise PlanError(f"internal: {type(old).__name__} is not a child of {type(parent).__name__}")


# ---------------------------------------------------------------- removing a whole site

def _remove_site(model: nn.Module, site: Site) -> None:
    attn = site.attention
    bias = getattr(site.o, "bias", None)
    out = out_features(site.o)
    if site.meta.get("bert_style"):
        parent = model.get_submodule(site.path.rsplit(".", 1)[0])
        parent.output.dense = BiasOnly(bias, out)  # the residual + LayerNorm after it stay
        style = "bert"
    else:
        attn.headprune_out = BiasOnly(bias, out)
        style = "t5" if _is_t5(attn) else "standard"
    for proj in {id(m): m for m in (site.q.module, site.k.module, site.v.module, *site.meta.get("extras", []))}.values():
        _delete_child(attn, proj)
    if not site.meta.get("bert_style"):
        _delete_child(attn, site.o)
    attn._hp_style, attn._hp_cross, attn._hp_head_dim = style, site.kind == "cross", site.head_dim
    _swap_class(attn, _RemovedAttention)
    if style == "t5":
        _t5_take_heads(model, attn, [])


def _delete_child(parent: nn.Module, child: nn.Module) -> None:
    for name, c in list(parent.named_children()):
        if c is child:
            delattr(parent, name)


def _swap_class(module: nn.Module, mixin: type) -> None:
    if isinstance(module, mixin):
        return
    base = getattr(type(module), "_hp_base", type(module))  # the model's own class, never a swapped one
    key = (mixin, base)
    if key not in _SWAPPED:
        _SWAPPED[key] = type(f"{mixin.__name__.strip('_')}{base.__name__}", (mixin, base),
                             {"_hp_base": base, "_hp_signature": inspect.signature(base.forward)})
    module.__class__ = _SWAPPED[key]


_SWAPPED: dict[tuple[type, type], type] = {}


def _arguments(module: nn.Module, args: tuple, kwargs: dict) -> dict:
    """The base class's forward arguments by name (extra **kwargs flattened in)."""
    signature = type(module)._hp_signature  # once per swapped class (an lru_cache makes dynamo warn)
    arguments = dict(signature.bind(module, *args, **kwargs).arguments)
    for name, param in signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name, {}))
    return arguments


class _RemovedAttention(nn.Module):
    """Forward of a site with no heads: no projections, no attention; cache bookkeeping only."""

    def forward(self, *args, **kwargs):
        a = _arguments(self, args, kwargs)
        hidden = a["hidden_states"]  # [B, T, d]
        source = a.get("key_value_states", a.get("encoder_hidden_states"))
        cache = a.get("past_key_values")
        bias = _t5_bias_to_pass(self, a.get("position_bias"), hidden, cache) if self._hp_style == "t5" else None
        _keep_cache_in_step(self, cache, hidden, source)  # after the bias: it reads the past length
        if self._hp_style == "bert":
            return hidden.new_zeros(*hidden.shape[:-1], 0), None  # output.dense is BiasOnly
        out = self.headprune_out(hidden[..., :0])
        return (out, bias, None) if self._hp_style == "t5" else (out, None)


def _keep_cache_in_step(module, cache, hidden: torch.Tensor, source: torch.Tensor | None) -> None:
    """Store a [B, 1, T, 1] placeholder so the cache's sequence length (positions) stays right.

    transformers counts an empty cache entry as length 0, so the placeholder cannot be zero-sized;
    one float per token and example is the whole cost of a removed site in a cache.
    """
    if cache is None:
        return
    from transformers.cache_utils import EncoderDecoderCache

    layer = module.layer_idx
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

def _is_t5(attn: nn.Module) -> bool:
    return hasattr(attn, "relative_attention_num_buckets") and hasattr(attn, "compute_bias")


def _t5_take_heads(model: nn.Module, attn: nn.Module, kept_original: list[int]) -> None:
    attn._hp_kept = list(kept_original)
    attn._hp_total = int(model.config.num_heads)
    if not isinstance(attn, _RemovedAttention):
        _swap_class(attn, _T5PrunedAttention)


def _t5_bias_to_pass(attn, position_bias, hidden, cache):
    """The whole-head bias this layer passes on: the one it got, or the one its table computes."""
    if position_bias is not None or not attn.has_relative_attention_bias:
        return position_bias
    q_len = hidden.shape[1]
    past = cache.get_seq_length(attn.layer_idx) if cache is not None else 0
    return attn.compute_bias(q_len, q_len + past, device=hidden.device, past_seen_tokens=past)  # [1, H0, q, k]


class _T5PrunedAttention(nn.Module):
    """T5 attention with some heads removed: takes its own rows of the whole-head position bias."""

    def forward(self, *args, **kwargs):
        a = _arguments(self, args, kwargs)
        full = _t5_bias_to_pass(self, a.get("position_bias"), a["hidden_states"], a.get("past_key_values"))
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
