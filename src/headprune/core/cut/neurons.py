"""Neuron surgery: remove FFN neurons, so the feed-forward blocks are smaller and faster.

A neuron is one intermediate feature of an FFN (:mod:`.ffn`): its row of every up/gate projection
(column for GPT-2's Conv1D) and its column of the down projection (row for Conv1D). A neuron with mask 0
(:func:`.masking.masked_neurons`) contributes exactly nothing, so the pruned model computes what the masked
one does -- as long as nothing between the up and down projections mixes features, which the trial of
:mod:`.verify` checks before :func:`headprune.prune_neurons` (:mod:`.prune`) cuts here. The original
indices of the kept neurons are recorded in the config (``headprune_kept_neurons``, beside the kept
heads) and replayed by :func:`headprune.load_pruned`. An FFN may lose every neuron: its down projection
then adds only its bias, as under an all-zero mask (GPT-2's Conv1D cannot run zero features: there one
neuron stays, with a zero column of the down projection).

The contract is the heads' (:mod:`.surgery`): checked before any change, refused inside an active mask,
atomic (a :class:`~.snapshot.Snapshot` restores the model when one FFN's cut fails half way).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ...errors import PlanError
from ..masks.masking import NEURONS, find_unit, unit_indices
from ..model.ffn import FFN, find_ffns
from ..model.kept import kept_heads, kept_neurons, original_heads, original_neurons
from ..model.records import KEPT_KEY, KEPT_NEURONS_KEY, ORIGINAL_KEY, ORIGINAL_NEURONS_KEY, config_record
from ..model.sites import is_conv1d
from .snapshot import Snapshot
from .surgery import refuse_masked

DroppedNeurons = dict[str, list[int]]  # {ffn: indices among the neurons it has now} -- to remove


def check_neuron_drops(model: nn.Module, dropped: Mapping[str, Iterable[int]]) -> DroppedNeurons:
    """``dropped`` ({ffn: indices among its current neurons}) checked against ``model``: sorted, without
    repeats, FFNs that drop nothing left out. Raises before anything changes."""
    refuse_masked(model, "prune_neurons")
    if not isinstance(dropped, Mapping):
        raise PlanError(f"dropped must be a mapping ffn name -> neuron indices, got {type(dropped).__name__}")
    ffns = {f.name: f for f in find_ffns(model)}
    drops = {}
    for name, idx in dropped.items():
        ffn = find_unit(NEURONS, ffns, name, "dropped")
        drops[name] = sorted(set(unit_indices(NEURONS, "dropped", name, idx, ffn.width)))
    return {name: drop for name, drop in drops.items() if drop}


def cut_neurons(model: nn.Module, dropped: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
    """Remove ``dropped`` from ``model`` in place, unverified (:func:`headprune.prune_neurons` verifies first);
    returns the kept neurons (original indices). Checked before anything changes; atomic."""
    drops = check_neuron_drops(model, dropped)
    ffns = {f.name: f for f in find_ffns(model)}
    before = kept_neurons(model)
    original = original_neurons(model)
    snapshot = Snapshot(model, [m for name in drops for m in (*ffns[name].ups, ffns[name].down)])
    try:
        with torch.no_grad():
            for name, drop in drops.items():
                keep = _cut_ffn(ffns[name], drop)
                before[name] = [before[name][i] for i in keep]
        if not config_record(model.config, KEPT_KEY):  # a pruned model is one that carries kept heads
            setattr(model.config, ORIGINAL_KEY, original_heads(model))
            setattr(model.config, KEPT_KEY, kept_heads(model))
        setattr(model.config, ORIGINAL_NEURONS_KEY, original)
        setattr(model.config, KEPT_NEURONS_KEY, before)
    except BaseException:
        snapshot.restore()
        raise
    return before


def neurons_to_drop(model: nn.Module, kept: Mapping[str, Iterable[int]],
                    original: Mapping[str, int] | None = None) -> DroppedNeurons:
    """The neurons to drop so that an FFN-unpruned ``model`` keeps ``kept`` ({ffn: original indices kept});
    ``original`` ({ffn: width}) refuses a model of another shape. Raises :class:`PlanError`."""
    if config_record(model.config, KEPT_NEURONS_KEY):
        raise PlanError("keep_neurons needs a model whose neurons are unpruned; this one carries kept neurons")
    if not isinstance(kept, Mapping):
        raise PlanError(f"kept neurons must be a mapping ffn name -> indices, got {type(kept).__name__}")
    current = {f.name: f.width for f in find_ffns(model)}
    if original is not None and dict(original) != current:
        raise PlanError(f"kept neurons are for a different model: widths (recorded {dict(original)}, model {current})")
    drops = {}
    for name, keep in kept.items():
        if name not in current:
            raise PlanError(f"kept neurons: unknown ffn {name!r}; allowed: {', '.join(current)}")
        keep = set(unit_indices(NEURONS, "kept neurons", name, keep, current[name], PlanError))
        drops[name] = [i for i in range(current[name]) if i not in keep]
    return drops


def _cut_ffn(ffn: FFN, drop: list[int]) -> list[int]:
    """Keep every neuron of ``ffn`` but ``drop``; returns the kept indices (among the ones it had)."""
    gone = set(drop)
    keep = [i for i in range(ffn.width) if i not in gone]
    emptied = not keep and any(is_conv1d(m) for m in (*ffn.ups, ffn.down))  # Conv1D cannot run 0 features:
    if emptied:
        keep = [min(drop)]  # one neuron stays with a zero down column: it adds exactly nothing
    index = torch.tensor(keep, dtype=torch.long, device=ffn.down.weight.device)
    for up in ffn.ups:
        _slice(up, index, out_side=True)
    _slice(ffn.down, index, out_side=False)
    if emptied:
        ffn.down.weight = nn.Parameter(torch.zeros_like(ffn.down.weight), requires_grad=ffn.down.weight.requires_grad)
    return keep


def _slice(module: nn.Module, index: torch.Tensor, *, out_side: bool) -> None:
    """Keep ``index`` of ``module``'s output features (``out_side``) or input features."""
    conv = is_conv1d(module)
    dim = (1 if conv else 0) if out_side else (0 if conv else 1)  # Conv1D weight [in, out]; Linear [out, in]
    module.weight = nn.Parameter(module.weight.index_select(dim, index).contiguous(),
                                 requires_grad=module.weight.requires_grad)
    if out_side and getattr(module, "bias", None) is not None:
        module.bias = nn.Parameter(module.bias.index_select(0, index).contiguous(),
                                   requires_grad=module.bias.requires_grad)
    if conv:
        module.nf = module.weight.shape[1]
    elif out_side:
        module.out_features = index.numel()
    else:
        module.in_features = index.numel()
