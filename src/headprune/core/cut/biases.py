"""Bias shifts of output projections: what stands in for removed units (FLAP's bias compensation).

A unit feeds its output projection ``y = W x + b`` through columns of ``W`` (a head: ``head_dim`` columns
of its site's output projection; a neuron: one column of its FFN's down projection). Holding a removed
unit's inputs at constants ``c`` instead of zero is the same as removing it and adding ``W[:, removed] c``
to ``b``: exactly, for every input. :func:`shift_biases` adds such shifts before surgery cuts the columns
(surgery keeps an output projection's bias, and a site that loses every head keeps it as its output,
:class:`~.runtime.BiasOnly`), so the pruned model computes what the unpruned one computes with the removed
units' inputs held at ``c``.

A projection without a bias (Llama's ``o_proj`` and ``down_proj``) gets one. The sites and FFNs whose
projection gained it are recorded in the config (:data:`~.records.ADDED_BIASES_KEY`), so that loading
builds those biases (:func:`add_zero_biases`, before the kept heads are replayed) and the saved ones fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import nn

from ...errors import PlanError, UnsupportedModelError
from ..model.ffn import find_ffns, out_features
from ..model.records import ADDED_BIASES_KEY
from ..model.sites import Site, find_sites, is_conv1d


def output_projections(model: nn.Module) -> dict[str, nn.Module]:
    """{site or FFN name: the projection its units feed} (a site's output projection, an FFN's down one)."""
    found = {s.name: s.o for s in find_sites(model)}
    try:
        found.update({f.name: f.down for f in find_ffns(model, skip_moe=True)})
    except UnsupportedModelError:  # FFNs that cannot be named per layer (MobileBERT): their biases are not shifted
        pass
    return found


def added_biases(model: nn.Module) -> list[str]:
    """The sites and FFNs whose output projection headprune gave a bias (recorded in the config)."""
    return list(getattr(model.config, ADDED_BIASES_KEY, None) or [])


def mean_shifts(model: nn.Module, means: Mapping[str, torch.Tensor], drop_heads: Mapping[str, Iterable[int]],
                drop_neurons: Mapping[str, Iterable[int]]) -> dict[str, torch.Tensor]:
    """{site or FFN name: W[:, removed] @ means[removed]} ([d_out], float64): the bias shifts that hold the units
    to drop ({site: head indices}, {ffn: neuron indices}, current indices) at ``means`` ({name: [C]}, the mean
    input of every feature of the projection, :func:`headprune.scoring.fluctuation.channel_stats`)."""
    sites = {s.name: s for s in find_sites(model)}
    ffns = {f.name: f for f in find_ffns(model, skip_moe=True)} if any(drop_neurons.values()) else {}
    shifts = {}
    for groups, drops in ((sites, drop_heads), (ffns, drop_neurons)):
        for name, drop in drops.items():
            drop = sorted(int(i) for i in drop)
            if not drop:
                continue
            if name not in groups or name not in means:
                raise PlanError(f"no {'site' if groups is sites else 'FFN'} {name!r} with input means; allowed: "
                                f"{', '.join(n for n in groups if n in means)}")
            unit = groups[name]
            width = unit.head_dim if isinstance(unit, Site) else 1
            cols = torch.tensor([i * width + j for i in drop for j in range(width)], dtype=torch.long)
            module = unit.o if isinstance(unit, Site) else unit.down
            weight = module.weight.detach()
            width_in = weight.shape[0] if is_conv1d(module) else weight.shape[1]
            mean = torch.as_tensor(means[name], dtype=torch.float64).cpu()
            if mean.shape != (width_in,):
                raise PlanError(f"input means of {name!r} have shape {tuple(mean.shape)}; expected ({width_in},)")
            index = cols.to(weight.device)
            w = weight.index_select(0, index) if is_conv1d(module) else weight.index_select(1, index).T  # [k, d_out]
            shifts[name] = mean[cols] @ w.to("cpu", torch.float64)
    return shifts


def shift_biases(model: nn.Module, shifts: Mapping[str, torch.Tensor]) -> None:
    """Add ``shifts`` ({site or FFN name: [d_out]}) to the biases of their output projections, in place; a
    projection without a bias gets one (recorded). Checked before anything changes."""
    projections = output_projections(model)
    for name, shift in shifts.items():
        if name not in projections:
            raise PlanError(f"bias shift for unknown site or FFN {name!r}; allowed: {', '.join(projections)}")
        if tuple(torch.as_tensor(shift).shape) != (out_features(projections[name]),):
            raise PlanError(f"bias shift of {name!r} has shape {tuple(torch.as_tensor(shift).shape)}; expected "
                            f"({out_features(projections[name])},)")
    added = added_biases(model)
    with torch.no_grad():
        for name, shift in shifts.items():
            module = projections[name]
            if _give_bias(module):
                added.append(name)
            module.bias.add_(torch.as_tensor(shift).to(module.bias.device, module.bias.dtype))
    if added:
        setattr(model.config, ADDED_BIASES_KEY, sorted(set(added)))


def add_zero_biases(model: nn.Module, names: Iterable[str]) -> None:
    """Give the output projections of ``names`` a zero bias where they have none (a model being rebuilt to load
    weights saved after :func:`shift_biases`)."""
    names = list(names)
    if not names:
        return
    projections = output_projections(model)
    unknown = [n for n in names if n not in projections]
    if unknown:
        raise PlanError(f"{ADDED_BIASES_KEY}: unknown sites or FFNs {unknown[:3]}; allowed: {', '.join(projections)}")
    for name in names:
        _give_bias(projections[name])
    setattr(model.config, ADDED_BIASES_KEY, sorted(set(added_biases(model)) | set(names)))


def _give_bias(module: nn.Module) -> bool:
    """Give ``module`` a zero bias if it has none (True then)."""
    if getattr(module, "bias", None) is not None:
        return False
    weight = module.weight
    if "bias" in module.__dict__:  # a plain attribute set to None (not a registered parameter)
        del module.__dict__["bias"]
    module.bias = nn.Parameter(torch.zeros(out_features(module), dtype=weight.dtype, device=weight.device),
                               requires_grad=weight.requires_grad)
    return True
