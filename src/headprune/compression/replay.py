"""The pruning ``Plan`` as data: what a compression removed and folded, stored as ``plan.json`` and replayed.

Selection makes it, compensation refines it, surgery applies it: the heads dropped per site (indices among the
heads the model had), the FFN neurons dropped, the tuned head scales folded into the output projections (the
head plan's ``tune``) and the bias shifts of the ``bias`` stand-in, with the sizes before and after.
:func:`apply_plan` applies it to the model it was made on -- scales folded, biases shifted, heads then neurons
cut, in the order :func:`headprune.compression.compress` applies them -- so ``headprune apply MODEL plan.json``
rebuilds the compressed model bit for bit. Compensations that rewrite weights (linear stand-ins, the
least-squares refit, distillation, a registered refit) are not in the plan: it records their names under
``not_replayable`` and :func:`apply_plan` refuses it, naming them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..core.biases import shift_biases
from ..core.folding import fold_scales
from ..core.prune import prune_heads, prune_neurons
from ..errors import ConfigError, PlanError

FORMAT = "headprune-plan/1"


@dataclass
class Plan:
    """What compression removes and folds in, JSON-ready (plain lists and floats)."""

    dropped_heads: dict[str, list[int]]  # {site: heads removed, indices among the heads it had}
    dropped_neurons: dict[str, list[int]] = field(default_factory=dict)  # {ffn: neurons removed}
    scales: dict[str, list[float]] | None = None  # {site: [H] tuned mask values}, folded before the cut
    biases: dict[str, list[float]] | None = None  # {site or ffn: [d_out] bias shift}, added before the cut
    sizes: dict = field(default_factory=dict)  # before / after: heads, neurons, params, flops, KV bytes per token
    not_replayable: list[str] = field(default_factory=list)  # kept stages whose weight updates the plan lacks

    def to_dict(self) -> dict:
        return {"format": FORMAT, **asdict(self)}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """A plan written by :meth:`save`; anything else is refused in one line naming the file."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"plan {str(path)!r}: {err}; allowed: a plan.json written by headprune compress") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"plan {str(path)!r}: format {data.get('format') if isinstance(data, dict) else None!r}; "
                              f"allowed: {FORMAT!r} (a plan.json written by headprune compress)")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def floats(tensors: dict[str, torch.Tensor] | None) -> dict[str, list[float]] | None:
    """{name: tensor} as {name: [float]} (exact: a Python float holds a float32 or float64 value)."""
    return None if tensors is None else {k: [float(x) for x in v.detach().cpu().flatten()] for k, v in tensors.items()}


def apply_plan(model: nn.Module, plan: Plan, *, verify: bool = True) -> nn.Module:
    """Apply ``plan`` to ``model`` in place (the model it was made on): fold the scales, shift the biases, cut the
    heads, then the neurons. ``verify=False`` skips the check that surgery is exact for the model's class."""
    if plan.not_replayable:
        raise PlanError(f"plan: the stages {', '.join(plan.not_replayable)} rewrote weights the plan does not hold; "
                        "allowed: a plan without them (the compressed model directory itself holds their result)")
    if plan.scales:
        fold_scales(model, {k: torch.tensor(v, dtype=torch.float64) for k, v in plan.scales.items()})
    if plan.biases:
        shift_biases(model, {k: torch.tensor(v, dtype=torch.float64) for k, v in plan.biases.items()})
    prune_heads(model, {k: v for k, v in plan.dropped_heads.items() if v}, verify=verify)
    if any(plan.dropped_neurons.values()):
        prune_neurons(model, {k: v for k, v in plan.dropped_neurons.items() if v}, verify=verify)
    model.eval()
    return model
