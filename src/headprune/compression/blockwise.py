"""Stand-ins solved one transformer block at a time: ``PruneSettings(low_memory=True)``'s second moments.

The linear stand-ins (:mod:`headprune.core.cut.standins`) read ``E[x x^T]`` of every output / down projection that
loses units: ``C^2`` float64 numbers each. A Llama-3.2-1B's down projections read 8192 features: 0.5 GB
each, 8.6 GB over its 16 layers, against 4.9 GB of float32 weights. With ``low_memory`` the scoring pass
gathers none; after selection :func:`blockwise_standins` records the first block's inputs over the calibration
batches (:func:`.layerwise.layer_stack`: one forward per batch, which also checks that running the blocks one at
a time computes what the whole model computes), then, block after block, runs the block on its inputs with
hooks summing its projections' input means and second moments (:class:`~headprune.scoring.fluctuation.StatsCollector`,
the sums of the one-pass statistics), folds the block's stand-ins into it, drops its moments, and hands the
outputs the block gave *before* the fold -- the unpruned model's -- to the next block. Every block sees the
inputs it sees in the one pass, so the moments and the stand-ins are those of the normal path. Memory: one
block's moments and one block's hidden states over the calibration batches (sequential: also its attention sites'
output-projection inputs, which the pass handing the block on replays); time: about one forward.

Where the blocks cannot be run one at a time (an encoder-decoder; layers that are not one stack run in order),
the moments are gathered one projection at a time by whole-model forwards cut short after it, the projections
taken in *reverse* order of execution: folding a stand-in changes only what runs after its projection, which is
done by then. Exact too, at about ``n_projections / 2`` forwards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..core.cut.neurons import cut_neurons
from ..core.cut.snapshot import Snapshot
from ..core.cut.surgery import cut_heads, site_roots
from ..core.model.chunked import forward_few_logits
from ..core.model.devices import input_device, to_device
from ..core.model.ffn import find_ffns
from ..core.model.inputs import model_inputs
from ..core.model.sites import find_sites, is_conv1d, structure_fixed
from ..errors import ConfigError
from ..progress import progress_bar
from ..scoring.fluctuation import StatsCollector
from ..scoring.gradients import scoring_mode
from .layerwise import Stop, layer_stack
from .reselect import reselect


def blockwise_standins(model: nn.Module, batches: Sequence[Mapping[str, torch.Tensor]], standin: Any,
                       drop_heads: Mapping[str, Sequence[int]], drop_neurons: Mapping[str, Sequence[int]],
                       settings: Any, progress: bool = False, *,
                       sequential: bool = False) -> tuple[str, dict | None, tuple[dict, dict]]:
    """Fold ``standin`` (a compensation of stage ``standin``: ``apply(pruned, model, stats, heads, neurons,
    settings)``) into ``model`` in place for the units to drop ({site: heads}, {ffn: neurons}), from moments
    gathered one block at a time over ``batches`` (see the module doc). ``sequential``: each block's moments on
    the inputs the blocks before it give *after* their fold and cut (their removed columns are zeroed here, what the
    cut computes), so every fit sees the pruned model's inputs (``linear-seq``); a stand-in with ``reselect`` then
    re-chooses which units of each site / FFN go first (:mod:`.reselect`, ``obs-seq``). Returns (the stage's note,
    the bias shifts it added or None where the stand-in changes more than biases, ({site: heads}, {ffn: neurons})
    dropped: ``drop_heads`` / ``drop_neurons`` unless re-chosen)."""
    targets = _targets(model, drop_heads, drop_neurons)  # name -> output / down projection losing units
    if not targets:
        return "skipped (nothing removed)", {}, (dict(drop_heads), dict(drop_neurons))
    batches = [to_device(b, input_device(model)) for b in batches]
    # folds and zeroed columns change weights only (the cut comes after): sites and FFNs are searched once
    with scoring_mode(model), torch.no_grad(), structure_fixed(model):
        stack = layer_stack(model, batches, [(m, None) for m in targets.values()])
        if stack is not None:
            groups = _by_layer(stack, targets)
        elif sequential:
            raise ConfigError(f"compensate={standin.name!r}: {type(model).__name__}'s blocks cannot be replayed one at "
                              "a time, so stand-ins cannot be fitted on the pruned model's inputs; allowed: "
                              "compensate='linear'")
        else:
            groups = [[name] for name in reversed(_execution_order(model, batches[0], targets))]
        done = _Folded()
        chosen: tuple[dict, dict] = ({k: list(v) for k, v in drop_heads.items()},
                                     {k: list(v) for k, v in drop_neurons.items()})
        sites = {site.name: site for site in find_sites(model)}
        for at, names in enumerate(progress_bar(groups, desc="stand-ins", unit="block", show=progress)):
            replay = _AttentionReplay([sites[n] for n in names if n in sites] if sequential else [])
            stats = _moments(model, batches, stack, targets, names, advance=not sequential, seen=replay.hooks())
            heads = {k: list(v) for k, v in drop_heads.items() if k in names}
            neurons = {k: list(v) for k, v in drop_neurons.items() if k in names}
            if sequential and getattr(standin, "reselect", False):  # which units go, on the pruned model's inputs
                heads, neurons = reselect(model, stats, heads, neurons, standin.damping)
                chosen[0].update(heads)
                chosen[1].update(neurons)
            done.add(standin.apply(model, model, stats, heads, neurons, settings))
            del stats
            if sequential and stack is not None and at + 1 < len(groups):  # the block as the cut leaves it gives
                _zero_removed(model, heads, neurons)                         # the next block its inputs
                with replay.replaying(len(batches)) as replayed, \
                        _narrowed(model, {k: v for k, v in heads.items() if k not in replayed}, neurons):
                    stack.advance(replay.at)
    return done.note, done.shifts, chosen


def _moments(model: nn.Module, batches: list, stack, targets: Mapping[str, nn.Module], names: list[str],
             advance: bool = True, seen: Sequence = ()):
    """The :class:`~headprune.scoring.fluctuation.ChannelStats` (second moments included) of the projections
    ``names``: from their layer of ``stack``, which then moves past it (its outputs, before any fold, go on), or
    from whole-model forwards cut short after the first of them (``stack`` None). ``seen``: hooks ((module, "pre" |
    "post", fn)) on the layer's run when the stack stays (``advance`` False)."""
    collector = StatsCollector(model, gram=True, names=set(names))
    with collector:
        if stack is not None:
            while stack.index < stack.layer_of(targets[names[0]]):
                stack.advance()
            if advance:
                stack.advance(lambda b: collector.batch(batches[b]))
            else:  # the layer runs on its inputs for the moments, up to the last projection read; the stack stays
                left: set[str] = set()
                hooks = [*seen, *((targets[n], "pre", _stop_when_read(left, n)) for n in names)]  # after the collector's
                for b in range(len(batches)):
                    collector.batch(batches[b])
                    left.update(names)
                    stack.run(b, hooks)
        else:
            _run_upto(model, batches, targets[names[0]], collector)
    return collector.finish()  # the collector's float64 sums go with it


def _stop_when_read(left: set[str], name: str):
    """A pre-hook of projection ``name``: it has read its input; once every projection in ``left`` has, the rest
    of the layer is not needed (raise :class:`~.layerwise.Stop`)."""
    def pre(_module, _args):
        left.discard(name)
        if not left:
            raise Stop
    return pre


def _zero_removed(model: nn.Module, drop_heads: Mapping, drop_neurons: Mapping) -> None:
    """Zero the input columns of the removed heads' output projections and removed neurons' down projections:
    what cutting them computes (the cut itself comes later, in the pipeline)."""
    with torch.no_grad():
        for site in find_sites(model):
            for h in drop_heads.get(site.name, ()):
                _zero_columns(site.o, list(range(int(h) * site.head_dim, (int(h) + 1) * site.head_dim)))
        if any(list(v) for v in drop_neurons.values()):
            for ffn in find_ffns(model, skip_moe=True):
                if list(drop_neurons.get(ffn.name, ())):
                    _zero_columns(ffn.down, [int(i) for i in drop_neurons[ffn.name]])


class _AttentionReplay:
    """What the moment pass saw of one block's attention sites, so that the pass handing the block's outputs on need
    not run them again: per batch, each site's output-projection input (the fold changes the output projection
    only: queries, keys and values, and so that input, stay as they were) and the rest of what the attention module
    returned. Kept for a site only where its module returned its output projection's very output on every batch;
    replayed, the site returns ``o(that input)`` through the folded, zeroed output projection: what running it
    again computes, to the bit."""

    def __init__(self, sites: list):
        self.sites = sites
        self.inputs: dict[str, list] = {s.name: [] for s in sites}
        self.rest: dict[str, list] = {s.name: [] for s in sites}
        self.ok = {s.name: True for s in sites}
        self.outputs: dict[str, torch.Tensor] = {}
        self.batch = 0

    def hooks(self) -> list:
        out: list = []
        for s in self.sites:
            out.append((s.o, "pre", lambda _m, a, n=s.name: self.inputs[n].append(a[0])))
            out.append((s.o, "post", lambda _m, _a, y, n=s.name: self.outputs.__setitem__(n, y)))
            out.append((s.attention, "post", lambda _m, _a, y, n=s.name: self._returned(n, y)))
        return out

    def _returned(self, name: str, y) -> None:
        first = y[0] if isinstance(y, tuple) else y
        if first is not self.outputs.pop(name, None):
            self.ok[name] = False
        self.rest[name].append(tuple(y[1:]) if isinstance(y, tuple) else None)

    def at(self, b: int) -> None:
        self.batch = b

    @contextmanager
    def replaying(self, n_batches: int):
        """Inside, the sites seen whole on all ``n_batches`` return what they returned, through their output
        projection as it is now; yields their names."""
        live = [s for s in self.sites if self.ok[s.name] and len(self.inputs[s.name]) == len(self.rest[s.name])
                == n_batches]
        own = {s.name: s.attention.__dict__.get("forward") for s in live}  # a forward set on the instance (a
        for s in live:                                                    # dispatch hook's wrapper) comes back
            s.attention.forward = self._forward(s)
        try:
            yield {s.name for s in live}
        finally:
            for s in live:
                if own[s.name] is None:
                    del s.attention.forward
                else:
                    s.attention.forward = own[s.name]

    def _forward(self, site):
        def forward(*_args, **_kwargs):
            y = site.o(self.inputs[site.name][self.batch])
            rest = self.rest[site.name][self.batch]
            return y if rest is None else (y, *rest)
        return forward


@contextmanager
def _narrowed(model: nn.Module, drop_heads: Mapping, drop_neurons: Mapping):
    """The removed heads and neurons cut out of the projections that write and read them (queries, keys, values,
    output; the FFN's up and down projections; the pipeline's own surgery, unverified) while the block hands its
    outputs on -- at 50% about half of that work -- and all put back after: the pipeline cuts every block at once,
    later. The block then computes what the pruned model computes, its output and down projections summing over the
    kept features only (the zeroed block's sums, over every feature, round otherwise). A site losing all its heads
    stays whole, zeroed (removing a site changes its call)."""
    sites = {s.name: s for s in find_sites(model)}
    heads = {k: list(v) for k, v in drop_heads.items() if list(v) and len(list(v)) < sites[k].num_heads}
    neurons = {k: list(v) for k, v in drop_neurons.items() if list(v)}
    ffns = {f.name: f for f in find_ffns(model, skip_moe=True)} if neurons else {}
    roots = [m for k in heads for m in site_roots(model, sites[k])]
    roots += [m for k in neurons for m in (*ffns[k].ups, ffns[k].down)]
    snapshot = Snapshot(model, roots)
    try:
        if heads:
            cut_heads(model, heads)
        if neurons:
            cut_neurons(model, neurons)
        yield
    finally:
        snapshot.restore()  # the hooks go with it: the hook dictionaries are refilled as they were


def _zero_columns(module: nn.Module, columns: list[int]) -> None:
    if is_conv1d(module):  # [C, d_out]
        module.weight[columns, :] = 0
    else:
        module.weight[:, columns] = 0


class _Folded:
    """The notes and bias shifts of the stand-ins folded so far."""

    def __init__(self):
        self.note: str = ""
        self.shifts: dict | None = {}

    def add(self, done) -> None:
        note, shifts = done if isinstance(done, tuple) else (done, None)
        self.note = note
        self.shifts = None if shifts is None or self.shifts is None else {**self.shifts, **shifts}


def _targets(model: nn.Module, drop_heads: Mapping, drop_neurons: Mapping) -> dict[str, nn.Module]:
    """{name: projection} of the sites and FFNs that lose units."""
    out = {s.name: s.o for s in find_sites(model) if list(drop_heads.get(s.name, ()))}
    if any(list(v) for v in drop_neurons.values()):
        out |= {f.name: f.down for f in find_ffns(model, skip_moe=True) if list(drop_neurons.get(f.name, ()))}
    return out


def _by_layer(stack, targets: Mapping[str, nn.Module]) -> list[list[str]]:
    """The target names grouped by the layer that holds them, in layer order."""
    layers: dict[int, list[str]] = {}
    for name, module in targets.items():
        layers.setdefault(stack.layer_of(module), []).append(name)
    return [layers[i] for i in sorted(layers)]


def _execution_order(model: nn.Module, batch: Mapping[str, torch.Tensor], targets: Mapping[str, nn.Module]) -> list[str]:
    """The target names in the order one forward first runs them; refused where one runs more than once (a
    stand-in folded into it would then change inputs it has already been given)."""
    calls: list[str] = []
    handles = [m.register_forward_pre_hook(lambda _m, _a, name=name: calls.append(name)) for name, m in targets.items()]
    try:
        forward_few_logits(model, model_inputs(model, batch, cache=False))  # logits unread
    finally:
        for h in handles:
            h.remove()
    if sorted(calls) != sorted(targets):
        twice = sorted({n for n in calls if calls.count(n) != 1} | (set(targets) - set(calls)))
        raise ConfigError(f"low_memory=True: {type(model).__name__} runs {twice[:3]} not exactly once per forward, so "
                          "their moments cannot be gathered one at a time; allowed: low_memory=False")
    return calls


def _run_upto(model: nn.Module, batches: Sequence[Mapping[str, torch.Tensor]], module: nn.Module,
              collector: StatsCollector) -> None:
    """Whole-model forwards of ``batches``, each cut short once ``module`` has read its input (after the
    collector's hook, registered first, has summed it)."""
    def stop(_module, _args):
        raise Stop

    handle = module.register_forward_pre_hook(stop)
    try:
        for batch in batches:
            collector.batch(batch)
            try:
                model(**model_inputs(model, batch, cache=False))
            except Stop:
                pass
    finally:
        handle.remove()
