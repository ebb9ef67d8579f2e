"""The irreversible stage: physically remove heads, so the model is smaller and faster.

For every site, surgery keeps the query/key/value output rows and the output-projection input
columns of the kept heads, updates the attention module's head-count metadata, and records which
heads each site keeps in ``model.config``. A site that loses every head is replaced by a forward that does no attention
work at all and returns the output projection's bias (exactly what masking all its heads gives).

Grouped-query attention: a key/value head goes when all its query heads go. Kept query heads stay
contiguous per key/value head; if every key/value head keeps the same number ``g`` of query heads
the site stays plain GQA with groups of ``g``. Otherwise groups of ``gcd(counts)`` are used and the
few key/value heads that serve several groups are repeated at run time (:class:`RepeatHeads`),
never copied in the weights.

T5 computes one relative-position bias ``[1, heads, q, k]`` in its first layer and passes it on to
every later layer. Surgery keeps that bias table whole and makes each pruned layer take the rows of
its own kept heads (the bug of transformers v4's T5 pruning, #19625, cannot happen).

Surgery takes :data:`~.records.DroppedHeads` ``{site: [indices among the heads the site has now]}`` (on a
model pruned before, index ``i`` is the site's ``i``-th remaining head) and records
:data:`~.records.KeptHeads` in the config. The contract, shared with neuron surgery (:mod:`.neurons`):
validated before any change (:func:`check_head_drops`), refused inside an active mask, atomic (a
:class:`~.snapshot.Snapshot` restores the model when a cut fails half way). This layer does not verify:
:func:`headprune.prune_heads` (:mod:`.prune`) runs the trial (:mod:`.verify`) first, then cuts here.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ...errors import PlanError
from ..masks.masking import HEADS, masked_kinds, unit_indices
from ..model.families import HEAD_COUNT_ATTRS, HEADS_WIDTH_ATTRS, KV_HEAD_ATTRS, SPLIT_WIDTH_ATTRS
from ..model.kept import kept_heads, original_heads
from ..model.layouts import FusedLayout
from ..model.records import KEPT_KEY, LEGACY_KEYS, ORIGINAL_KEY, DroppedHeads, KeptHeads, config_record
from ..model.runtime import (
    BiasOnly,
    RemovedAttention,
    RepeatHeads,
    T5PrunedAttention,
    shares_t5_bias,
    swap_class,
)
from ..model.sites import (
    Projection,
    Site,
    find_sites,
    head_lists,
    head_tensors,
    is_conv1d,
    kv_of_heads,
    out_features,
)
from .snapshot import Snapshot

__all__ = ["check_head_drops", "cut_heads", "heads_to_drop", "refuse_masked", "DroppedHeads", "KeptHeads",
           "kept_heads", "original_heads", "KEPT_KEY", "ORIGINAL_KEY", "LEGACY_KEYS", "config_record"]


def refuse_masked(model: nn.Module, action: str) -> None:
    """Surgery inside an active mask is refused (the mask's hooks hold the old widths)."""
    kinds = masked_kinds(model)
    if "heads" in kinds:
        raise PlanError(f"model is masked; call headprune.unmask_heads(model) before {action}")
    if kinds:
        raise PlanError(f"model has a neuron mask applied (inside masked_neurons(...)); leave that block before "
                        f"{action}")


def check_head_drops(model: nn.Module, dropped: Mapping[str, Iterable[int]]) -> DroppedHeads:
    """``dropped`` ({site: indices among its current heads}) checked against ``model``: sorted, without
    repeats, sites that drop nothing left out. Raises :class:`PlanError` before anything changes."""
    refuse_masked(model, "prune_heads")
    if not isinstance(dropped, Mapping):
        raise PlanError(f"dropped must be a mapping site name -> head indices, got {type(dropped).__name__}")
    sites = {s.name: s for s in find_sites(model)}
    before = kept_heads(model)
    stale = {n: (len(before.get(n, [])), s.num_heads) for n, s in sites.items() if len(before.get(n, [])) != s.num_heads}
    if stale:
        raise PlanError(f"model.config records kept heads that do not match the model (site: recorded, present): "
                        f"{stale}; is its config object shared with another model that was pruned? Give each "
                        "model its own config (copy.deepcopy(config)) before pruning")
    drops: DroppedHeads = {}
    for name, idx in dropped.items():
        if name not in sites:
            gone = " (it has no heads left)" if name in before else ""
            raise PlanError(f"dropped: unknown site {name!r}{gone}; allowed: {', '.join(sites) or '(none)'}")
        drops[name] = sorted(set(unit_indices(HEADS, "dropped", name, idx, sites[name].num_heads, PlanError)))
    return {name: drop for name, drop in drops.items() if drop}


def cut_heads(model: nn.Module, dropped: Mapping[str, Iterable[int]]) -> KeptHeads:
    """Remove ``dropped`` from ``model`` in place, unverified (:func:`headprune.prune_heads` verifies first).
    Checked before anything changes; atomic: if slicing fails half way, the model is restored to what it
    was. Returns the model's :data:`KeptHeads` afterwards, also stored in ``model.config``."""
    drops = check_head_drops(model, dropped)
    if not drops:
        return kept_heads(model)
    sites = {s.name: s for s in find_sites(model)}
    before = kept_heads(model)
    kept = config_record(model.config, KEPT_KEY) or {}
    snapshot = Snapshot(model, [m for name in drops for m in site_roots(model, sites[name])])
    try:
        for name, drop in drops.items():
            site = sites[name]
            gone = set(drop)
            keep = [h for h in range(site.num_heads) if h not in gone]
            kept[name] = [before[name][h] for h in keep]
            if keep:
                _slice_site(model, site, keep, kept[name])
            else:
                _remove_site(model, site)
        if not config_record(model.config, ORIGINAL_KEY):
            setattr(model.config, ORIGINAL_KEY, {n: len(k) for n, k in before.items()})
        setattr(model.config, KEPT_KEY, kept)
        for legacy in LEGACY_KEYS.values():  # one record per model, under the current names
            if hasattr(model.config, legacy):
                delattr(model.config, legacy)
    except BaseException:
        snapshot.restore()
        raise
    return kept_heads(model)


def site_roots(model: nn.Module, site: Site) -> list[nn.Module]:
    """The modules surgery of ``site`` may change (with their children)."""
    roots = [site.attention, site.o]
    if site.meta.get("bert_style"):
        roots.append(model.get_submodule(site.path.rsplit(".", 1)[0]))
    return roots


def heads_to_drop(model: nn.Module, kept: Mapping[str, Iterable[int]],
                  original: Mapping[str, int] | None = None) -> DroppedHeads:
    """The :data:`DroppedHeads` that leave an unpruned ``model`` with :data:`KeptHeads` ``kept`` ({site:
    original indices of kept heads}); ``original`` ({site: heads before pruning}, as saved beside the kept
    heads) refuses a model of another shape. Raises :class:`PlanError` before anything changes."""
    if config_record(model.config, KEPT_KEY):
        raise PlanError("replay_kept_heads needs an unpruned model; this one already carries kept heads")
    current = {s.name: s.num_heads for s in find_sites(model)}
    if original is not None and dict(original) != current:
        diff = {n: (original.get(n), current.get(n)) for n in set(original) | set(current)
                if original.get(n) != current.get(n)}
        raise PlanError(f"kept heads are for a different model: heads per site (recorded, model) differ at {diff}")
    if not isinstance(kept, Mapping):
        raise PlanError(f"kept must be a mapping site name -> head indices, got {type(kept).__name__}")
    drops = {}
    for name, keep in kept.items():
        if name not in current:
            raise PlanError(f"kept: unknown site {name!r}; allowed: {', '.join(current)}")
        keep = set(unit_indices(HEADS, "kept", name, keep, current[name], PlanError))
        drops[name] = [h for h in range(current[name]) if h not in keep]
    return drops


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


def _slice_site(model: nn.Module, site: Site, keep: list[int], kept_original: list[int]) -> None:
    hd, attn = site.head_dim, site.attention
    q_rows = _rows(keep, hd)
    kv_of = kv_of_heads(site)
    kept_kv = sorted({kv_of[h] for h in keep})
    per_kv = Counter(kv_of[h] for h in keep)
    counts = [per_kv[j] for j in kept_kv]
    group = math.gcd(*counts)
    kv_rows = _rows(kept_kv, hd)
    seen_kv = [kept_kv[j] for j, c in enumerate(counts) for _ in range(c // group)]  # what the attention sees
    layout = site.meta.get("fused")
    if layout is not None:
        _slice_fused(site, layout, keep, seen_kv, group)
    else:
        _select_out(site.q.module, q_rows)
        for proj in (site.k, site.v):
            _slice_kv(attn, proj, kv_rows, kept_kv, counts, group, hd)
    for extra in site.meta.get("extras", []):
        _select_out(extra, q_rows)
    _select_in(site.o, q_rows)
    _slice_head_lists(site, keep, seen_kv)
    _slice_head_tensors(site, keep, seen_kv)
    n = len(keep)
    for attr in HEAD_COUNT_ATTRS:  # the family table's names for sizes (:mod:`.families`)
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, n)
    for attr in HEADS_WIDTH_ATTRS:
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, n * hd)
    for attr in SPLIT_WIDTH_ATTRS:  # the heads' width: some families split or reshape by it (XGLM, GPT-2)
        if getattr(attn, attr, None) == site.num_heads * hd:
            setattr(attn, attr, n * hd)
    if isinstance(getattr(attn, "num_key_value_groups", None), int):
        attn.num_key_value_groups = group
    for attr in KV_HEAD_ATTRS:  # key/value heads the attention now sees
        if isinstance(getattr(attn, attr, None), int):
            setattr(attn, attr, n // group)
    if getattr(attn, "kv_dim", None) == site.num_kv_heads * hd:
        attn.kv_dim = n // group * hd
    _own_head_counts(attn, n, n // group)
    if shares_t5_bias(attn):
        _t5_take_heads(model, attn, kept_original)


def _slice_head_lists(site: Site, keep: list[int], seen_kv: list[int]) -> None:
    """Keep the per-head modules (e.g. StableLM's per-head norms) of the kept heads; a key/value head the
    attention sees twice (uneven GQA, :class:`RepeatHeads`) gets a copy of its module."""
    for parent, attr, side in head_lists(site):
        old = getattr(parent, attr)
        order = keep if side == "query" else seen_kv
        new, seen = nn.ModuleList(), set()
        for h in order:  # a head's first place holds its module; a repeat (uneven GQA) gets a copy
            new.append(copy.deepcopy(old[h]) if h in seen else old[h])
            seen.add(h)
        setattr(parent, attr, new)
        if getattr(parent, "num_heads", None) == len(old):
            parent.num_heads = len(new)


def _slice_head_tensors(site: Site, keep: list[int], seen_kv: list[int]) -> None:
    """Keep the kept heads' entries of per-head tensors (sinks, per-head norm weights), in the order the
    attention sees its heads (a key/value head seen twice under uneven GQA is repeated)."""
    for module, name, dim, side in head_tensors(site):
        old = getattr(module, name)
        idx = torch.tensor(keep if side == "query" else seen_kv, dtype=torch.long, device=old.device)
        if name in module._parameters:
            _set(module, name, old.index_select(dim, idx))
        else:
            module._buffers[name] = old.index_select(dim, idx).contiguous()


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


def _slice_fused(site: Site, layout: FusedLayout, keep: list[int], seen_kv: list[int], group: int) -> None:
    """Keep the kept heads' blocks of a fused projection, in the layout it had (:class:`FusedLayout`): the
    query heads ``keep``, and the key/value heads as the attention reads them, ``seen_kv`` (one per group
    of ``group`` query heads; a key/value head serving two groups under uneven GQA has its rows twice)."""
    module, hd = site.k.module, site.head_dim
    position = {b: i for i, b in enumerate(layout.blocks(site.num_heads, site.num_kv_heads))}
    blocks = [position[b] for b in layout.blocks(keep, seen_kv, group)]
    _select_out(module, torch.tensor([b * hd + i for b in blocks for i in range(hd)], dtype=torch.long))
    if "q" not in layout.parts:
        _select_out(site.q.module, _rows(keep, hd))


def _own_head_counts(attn: nn.Module, heads: int, kv_heads: int) -> None:
    """An attention module that reads its head counts from the model's config (Phi-3 splits its fused
    ``qkv_proj`` by ``config.num_attention_heads``) gets a view of that config with its own counts."""
    config = getattr(attn, "config", None)
    if config is None or not isinstance(getattr(config, "num_attention_heads", None), int):
        return
    base = config.base if isinstance(config, HeadCountConfig) else config
    own = {"num_attention_heads": heads}
    if isinstance(getattr(base, "num_key_value_heads", None), int):
        own["num_key_value_heads"] = kv_heads
    attn.config = HeadCountConfig(base, own)


class HeadCountConfig:
    """A model config as one pruned attention module reads it: its own head counts, every other field
    (the attention implementation included, also when it changes later) read from ``base``."""

    def __init__(self, base, own: dict[str, int]):
        self.__dict__.update(base=base, own=dict(own))

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("base", "own"):
            raise AttributeError(name)
        own = self.__dict__["own"]
        return own[name] if name in own else getattr(self.__dict__["base"], name)

    def __setattr__(self, name: str, value) -> None:
        if name in self.__dict__["own"]:
            self.__dict__["own"][name] = value
        else:
            setattr(self.__dict__["base"], name, value)


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
        owner, _, attr = str(site.meta["bert_style"]).rpartition(".")  # "output.dense" (BERT) or "output" (LED)
        setattr(parent.get_submodule(owner) if owner else parent, attr, BiasOnly(bias, out))  # residual + norm stay
        style = "bert"
    else:
        attn.headprune_out = BiasOnly(bias, out)
        style = "t5" if shares_t5_bias(attn) else "standard"
    for proj in {id(m): m for m in (site.q.module, site.k.module, site.v.module, *site.meta.get("extras", []))}.values():
        _delete_child(attn, proj)
    if not site.meta.get("bert_style"):
        _delete_child(attn, site.o)
    attn._hp_style, attn._hp_cross, attn._hp_head_dim = style, site.kind == "cross", site.head_dim
    swap_class(attn, RemovedAttention)
    if style == "t5":
        _t5_take_heads(model, attn, [])


def _delete_child(parent: nn.Module, child: nn.Module) -> None:
    for name, c in list(parent.named_children()):
        if c is child:
            delattr(parent, name)


# ---------------------------------------------------------------- T5's shared position bias

def _t5_take_heads(model: nn.Module, attn: nn.Module, kept_original: list[int]) -> None:
    attn._hp_kept = list(kept_original)
    attn._hp_total = int(model.config.num_heads)
    if not isinstance(attn, RemovedAttention):
        swap_class(attn, T5PrunedAttention)


