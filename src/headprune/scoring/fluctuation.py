"""Fluctuation scores (FLAP, An et al. 2024): label-free, from one forward pass, no gradients.

Every unit is a slice of the input of a projection: a head is ``head_dim`` features of its site's output
projection input, an FFN neuron one feature of its down projection's input (:mod:`headprune.core.masks.masking`).
Over the calibration tokens (real ones only: padding, and an encoder-decoder's unscored decoder positions, are
left out), feature ``j`` of a projection ``W`` (``[d_out, C]``) has mean ``mu_j`` and variance ``var_j``.
Replacing the feature by its mean changes the projection's output by ``W[:, j] (x_j - mu_j)``, whose
expected squared norm is ``var_j ||W[:, j]||^2``: the unit's *fluctuation* is that, summed over its features.
A unit whose input hardly moves can be replaced by a constant -- its mean folded into the projection's bias
(:mod:`headprune.core.cut.biases`) -- at little cost.

Heads and neurons differ in number and scale, and so do layers. FLAP's code (``prune_flap``, structure
``AL-AM``) standardises each layer's features of each kind (``(m - mean) / std`` over that projection's input
features, sample std), with the attention feature metric squared first, averages a head's standardised
features, and ranks the standardised scores of both kinds together under one parameter-weighted threshold, so
layers end up with different widths. :func:`standardise` does that; the budget over heads and neurons
(:mod:`headprune.selection.units`) reads them through :func:`knapsack_scores`. (An earlier version
standardised each kind over all layers at once: on SmolLM2-135M at 20% of the parameters it removed 186 of
270 heads and multiplied perplexity by 12, where FLAP's per-layer form gives x1.7.)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from ..core.model.chunked import forward_few_logits
from ..core.model.devices import accumulator_device, input_device, to_device
from ..core.model.ffn import find_ffns
from ..core.model.finite import check_finite, check_finite_weights
from ..core.model.inputs import model_inputs, real_rows
from ..core.model.sites import find_sites, is_conv1d
from ..errors import ConfigError
from ..progress import progress_bar
from .gradients import scoring_mode


@dataclass
class ChannelStats:
    """Per site / FFN (by name): the mean and the (population) variance of every input feature of its output /
    down projection over ``tokens`` real calibration tokens, float64 on the CPU."""

    mean: dict[str, torch.Tensor]  # [C]
    var: dict[str, torch.Tensor]  # [C]
    tokens: dict[str, int]
    second: dict[str, torch.Tensor] | None = None  # [C, C] E[x x^T] (``gram=True``: linear stand-ins)


@dataclass
class Fluctuation:
    """Unit scores: ``heads`` {site: [H]} and ``neurons`` {ffn: [width]} standardised per layer and kind (FLAP);
    ``raw`` the same before standardising ({name: [units]}); ``stats`` what they were computed from."""

    heads: dict[str, torch.Tensor]
    neurons: dict[str, torch.Tensor]
    raw: dict[str, torch.Tensor]
    stats: ChannelStats


class StatsCollector:
    """Channel statistics gathered by forward pre-hooks on every site's output projection (``heads``) and every
    FFN's down projection (``neurons``) while some other pass runs the model: :func:`channel_stats` runs its own
    forward, the Fisher's scoring pass (:func:`headprune.scoring.units.unit_fisher`) collects them on its way,
    so the linear stand-ins need no second pass. ``with collector:`` registers the hooks; call
    :meth:`batch` before each batch's forward; :meth:`finish` (once) returns the :class:`ChannelStats`. A hook that
    fires again in the same batch (activation checkpointing recomputes blocks in the backward) counts once."""

    def __init__(self, model: nn.Module, *, heads: bool = True, neurons: bool = True, gram: bool = False,
                 names: Collection[str] | None = None):
        sites = find_sites(model) if heads else []
        ffns = find_ffns(model) if neurons else []
        self.targets = [(s.name, s.kind, s.o) for s in sites] + [(f.name, f.name.split(".")[0], f.down) for f in ffns]
        if names is not None:  # only these sites / FFNs (one block's, for the block-by-block stand-ins)
            self.targets = [t for t in self.targets if t[0] in names]
        if not self.targets:
            raise ConfigError(f"{type(model).__name__}: nothing to score (heads={heads}, neurons={neurons})")
        self.model, self.gram = model, gram
        self.sums: dict[str, list] = {}
        self.current: dict = {}
        self.seen: set[str] = set()
        self.handles: list = []

    def __enter__(self) -> StatsCollector:
        self.handles = [module.register_forward_pre_hook(self._hook(name, kind)) for name, kind, module in self.targets]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def batch(self, batch: Mapping[str, torch.Tensor]) -> None:
        """The batch the next forward runs (its attention mask says which rows are real tokens)."""
        self.current = dict(batch)
        self.seen = set()

    def _of_this_batch(self, z: torch.Tensor) -> bool:
        """Whether an input ``[B, T, C]`` is the current batch's: the own-loss check of a scoring pass runs the
        batch's fullest row alone first (``[1, T, C]``), which must neither count nor stand for the batch's
        forward (its hooks would then skip the real one as a recomputation)."""
        mask = self.current.get("attention_mask") if self.current else None
        return not (isinstance(mask, torch.Tensor) and z.dim() == 3 and z.shape[0] != mask.shape[0])

    def _hook(self, name: str, kind: str):
        def pre(_module, args):
            if name in self.seen or not self._of_this_batch(args[0]):  # a recomputation, or another input's forward
                return
            self.seen.add(name)
            z = args[0].detach()  # [B, T, C] (or [N, C])
            rows = real_rows(self.model, self.current, kind, z.shape)
            z = z.reshape(-1, z.shape[-1])
            z = z if rows is None else z[rows.to(z.device)]
            x = z.to(accumulator_device(z.device), torch.float64)
            s = self.sums.setdefault(name, [0, 0.0, 0.0, 0.0])
            s[0] += x.shape[0]
            s[1] = s[1] + x.sum(0)
            s[2] = s[2] + (x * x).sum(0)
            if self.gram:  # one batch's products in float32 (a few thousand terms each), summed over batches in float64
                product = gram_upper(z.to(x.device, torch.float32))  # [C, C], blocks below the diagonal 0
                if isinstance(s[3], torch.Tensor):
                    s[3].add_(product)  # in place: no second [C, C] float64 copy
                else:
                    s[3] = product.to(torch.float64)
        return pre

    def finish(self) -> ChannelStats:
        sums = self.sums
        missing = [name for name, _, _ in self.targets if sums.get(name, [0])[0] == 0]
        if missing:
            raise ConfigError(f"batches: no real token reached {missing[:3]} (empty input, all padding, or a block "
                              "the batches do not run)")
        mean = {k: (s[1] / s[0]).cpu() for k, s in sums.items()}
        var = {k: (s[2].cpu() / s[0] - mean[k] ** 2).clamp_min(0) for k, s in sums.items()}
        for k in mean:
            check_finite(mean[k], f"the mean inputs of {k!r}'s projection over the calibration tokens")
            check_finite(var[k], f"the input variances of {k!r}'s projection over the calibration tokens")
        second = {k: mirror_upper(s[3]).div_(s[0]).cpu() for k, s in sums.items()} if self.gram else None  # in place
        self.sums = {}  # the moments own the sums now: finish() once
        return ChannelStats(mean=mean, var=var, tokens={k: int(s[0]) for k, s in sums.items()}, second=second)


GRAM_BLOCK = 256  # rows of x^T x per product: about 0.6 of the full product's time from 576 columns up


def gram_upper(x: torch.Tensor) -> torch.Tensor:
    """``x^T x`` ``[C, C]`` of ``x`` ``[N, C]`` on and above the diagonal blocks of :data:`GRAM_BLOCK` rows (the
    blocks below it 0; :func:`mirror_upper` fills them): the product is symmetric, so half of it is not computed."""
    c = x.shape[1]
    out = torch.zeros(c, c, dtype=x.dtype, device=x.device)
    for i in range(0, c, GRAM_BLOCK):
        out[i:i + GRAM_BLOCK, i:] = x[:, i:i + GRAM_BLOCK].T @ x[:, i:]
    return out


def mirror_upper(m: torch.Tensor) -> torch.Tensor:
    """``m`` ``[C, C]`` with its blocks below the diagonal (of :data:`GRAM_BLOCK` rows) set to the transpose of
    those above, in place: the full symmetric matrix of a sum of :func:`gram_upper` products."""
    for i in range(GRAM_BLOCK, m.shape[0], GRAM_BLOCK):
        m[i:i + GRAM_BLOCK, :i] = m[:i, i:i + GRAM_BLOCK].T
    return m


def channel_stats(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], *, heads: bool = True,
                  neurons: bool = True, gram: bool = False, progress: bool = False) -> ChannelStats:
    """Mean and variance of the input features of every site's output projection (``heads``) and every FFN's
    down projection (``neurons``) over the real tokens of ``batches``: one forward per batch, no labels read
    (an encoder-decoder's labels build its decoder inputs and say which decoder positions are real).
    ``gram``: also their second moments ``E[x x^T]`` (``C^2`` float64 numbers per projection). NaN or inf weights
    or statistics are refused (:class:`~headprune.errors.NonFiniteError`)."""
    collector = StatsCollector(model, heads=heads, neurons=neurons, gram=gram)
    check_finite_weights(model)
    with collector, scoring_mode(model), torch.no_grad():
        for batch in progress_bar(batches, desc="fluctuation", unit="batch", show=progress):
            batch = to_device(batch, input_device(model))
            collector.batch(batch)
            forward_few_logits(model, model_inputs(model, batch, cache=False))  # logits unread
    return collector.finish()


def column_norms(projection: nn.Module) -> torch.Tensor:
    """``||W[:, j]||^2`` for every input feature ``j`` of a Linear (weight ``[out, in]``) or GPT-2 Conv1D
    (``[in, out]``): ``[in]`` float64 on the CPU."""
    w = projection.weight.detach().to(torch.float64)
    return (w.pow(2).sum(1) if is_conv1d(projection) else w.pow(2).sum(0)).cpu()


def unit_fluctuation(model: nn.Module, stats: ChannelStats) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Raw fluctuation of every unit: ({site: [H]}, {ffn: [width]}), ``var_j ||W[:, j]||^2`` summed over a unit's
    features, for the sites and FFNs ``stats`` has."""
    heads, neurons = {}, {}
    for s in find_sites(model):
        if s.name in stats.var:
            heads[s.name] = (stats.var[s.name] * column_norms(s.o)).view(s.num_heads, s.head_dim).sum(1)
    for f in find_ffns(model, skip_moe=True):
        if f.name in stats.var:
            neurons[f.name] = stats.var[f.name] * column_norms(f.down)
    return heads, neurons


def standardise(features: Mapping[str, torch.Tensor], group: Mapping[str, int] | None = None) -> dict[str, torch.Tensor]:
    """Per entry (one layer's projection): ``(m - mean) / std`` over its input features ``m`` [C] (sample std;
    all zeros when they do not differ), then the mean over each unit's ``group[name]`` consecutive features
    (a head's ``head_dim``; 1 for neurons): {name: [units]}."""
    out = {}
    for name, m in features.items():
        m = torch.as_tensor(m, dtype=torch.float64).flatten()
        sd = float(m.std()) if m.numel() > 1 else 0.0
        z = (m - m.mean()) / sd if sd > 0 else torch.zeros_like(m)
        width = (group or {}).get(name, 1)
        out[name] = z.view(-1, width).mean(1)
    return out


def feature_fluctuation(model: nn.Module, stats: ChannelStats) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """FLAP's per-feature metric before standardising: ``(var_j ||W[:, j]||^2)^2`` for attention output
    projections (squared, as FLAP's code does), ``var_j ||W[:, j]||^2`` for down projections: ({name: [C]},
    {site: head_dim})."""
    features, group = {}, {}
    for s in find_sites(model):
        if s.name in stats.var:
            features[s.name] = (stats.var[s.name] * column_norms(s.o)).pow(2)
            group[s.name] = s.head_dim
    for f in find_ffns(model, skip_moe=True):
        if f.name in stats.var:
            features[f.name] = stats.var[f.name] * column_norms(f.down)
    return features, group


def fluctuation_scores(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], *, heads: bool = True,
                       neurons: bool = True, gram: bool = False, progress: bool = False) -> Fluctuation:
    """FLAP's scores of ``model``'s heads and / or FFN neurons on ``batches`` (see the module doc); ``gram``: the
    statistics keep the features' second moments too (for linear stand-ins, the same pass)."""
    if neurons and not find_ffns(model):
        raise ConfigError(f"{type(model).__name__} has no feed-forward block headprune can find; neurons cannot "
                          "be scored (allowed: units=heads)")
    stats = channel_stats(model, batches, heads=heads, neurons=neurons, gram=gram, progress=progress)
    raw_h, raw_n = unit_fluctuation(model, stats)
    z = standardise(*feature_fluctuation(model, stats))
    return Fluctuation(heads={k: z[k] for k in raw_h}, neurons={k: z[k] for k in raw_n}, raw=raw_h | raw_n,
                       stats=stats)


def knapsack_scores(standardised: Mapping[str, torch.Tensor], prices: Mapping[str, torch.Tensor],
                    floor: float) -> dict[str, torch.Tensor]:
    """Standardised scores as values of the one-budget search, which ranks score per price: ``price x (z -
    floor + 1)``, so the ranking is by ``z`` alone across kinds and prices (FLAP's one threshold on the
    standardised scores), every value positive (``floor``: the lowest ``z`` of every kind in the pool)."""
    return {k: torch.as_tensor(prices[k], dtype=torch.float64).flatten() * (v.flatten() - floor + 1.0)
            for k, v in standardised.items()}
