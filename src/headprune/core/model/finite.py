"""NaN and inf refused where they appear: in a model's weights, in the losses it computes, in the scores made of
them. One check of each, shared by every entry point that takes a model and data (scoring, compression,
evaluation), so the library and the CLI refuse the same models with the same one-line
:class:`~headprune.errors.NonFiniteError`.

A NaN weight does not always reach the outputs (the embedding row of a token the batches never hold, a head the
data does not exercise): such a model computes finite scores, which would be reported in silence. So the weights
are checked once per entry point, before anything runs -- one pass over the parameters, a small cost next to one
forward -- and the losses and scores as they are computed.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ...errors import NonFiniteError
from .inputs import unwrap

WEIGHTS_HINT = "allowed: a model whose weights are all finite (NaN/inf weights come from a diverged training run " \
               "or a broken conversion)"
OUTPUTS_HINT = "allowed: finite values (NaN/inf here come from outputs too large for their dtype, or from NaN/inf " \
               "in the batch's inputs or labels)"


def check_finite_weights(model: nn.Module) -> None:
    """Refuse ``model`` if a floating-point parameter holds NaN or inf, naming the first one (in the model's
    order). One pass over the parameters, one synchronisation per device; parameters on the ``meta`` device
    (offloaded) are not read."""
    params = [(name, p) for name, p in unwrap(model).named_parameters()
              if p.is_floating_point() and p.device.type != "meta" and p.numel()]
    by_device: dict[torch.device, list[int]] = {}
    for i, (_, p) in enumerate(params):
        by_device.setdefault(p.device, []).append(i)
    bad: list[int] = []
    for idx in by_device.values():
        finite = torch.stack([_all_finite(params[i][1].detach()) for i in idx]).cpu()
        bad += [i for i, ok in zip(idx, finite.tolist(), strict=True) if not ok]
    if bad:
        name, p = params[min(bad)]
        more = f" ({len(bad) - 1} more parameters too)" if len(bad) > 1 else ""
        raise NonFiniteError(f"parameter {name!r} of {type(unwrap(model)).__name__} is not finite: "
                             f"{describe(p.detach())}{more}; {WEIGHTS_HINT}")


def _all_finite(t: torch.Tensor) -> torch.Tensor:
    """Whether the non-empty ``t`` holds only finite values, as a [] bool on its device. Its extremes: NaN
    propagates through ``aminmax`` (documented), inf is one of them; a read of ``t`` and nothing written, about
    15x faster on a CPU than ``isfinite(t).all()``, which writes a mask as large as ``t``."""
    try:
        lo, hi = torch.aminmax(t)
    except (RuntimeError, NotImplementedError):  # a dtype aminmax does not take (float8)
        return torch.isfinite(t).all()
    return torch.isfinite(lo) & torch.isfinite(hi)


def check_finite(values: torch.Tensor, what: str, hint: str = OUTPUTS_HINT) -> None:
    """Refuse ``values`` (a model's outputs or losses, named by ``what``, a plural) if they hold NaN or inf."""
    if not bool(torch.isfinite(values).all()):
        raise NonFiniteError(f"{what} are not finite: {describe(values.detach())}; {hint}")


def check_finite_scores(scores: Mapping[str, torch.Tensor], what: str = "scores") -> None:
    """Refuse scores ``{site or ffn: [units]}`` with NaN or inf, naming the first site that has them: no unit
    can be ranked on them."""
    bad = [name for name, s in scores.items() if not bool(torch.isfinite(torch.as_tensor(s)).all())]
    if bad:
        more = f" ({len(bad) - 1} more sites too)" if len(bad) > 1 else ""
        raise NonFiniteError(f"{what} of {bad[0]!r} are not finite: {describe(torch.as_tensor(scores[bad[0]]))}{more}; "
                             f"no unit can be ranked on them; {OUTPUTS_HINT}")


def nonfinite_losses(losses: list[torch.Tensor], first: int = 0, step: int = 1) -> str | None:
    """The message refusing the first of ``losses`` (one [B] tensor per batch, kept on the device so that the loop
    over the batches needs no synchronisation; batch ``i`` is number ``first + i * step`` of the caller's) that
    holds NaN or inf, or None when all are finite. One transfer, at the end."""
    if not losses:
        return None
    finite = torch.stack([torch.isfinite(t).all().to(losses[0].device) for t in losses]).cpu()
    bad = (~finite).nonzero()
    if not len(bad):
        return None
    i = int(bad[0])
    return f"the losses of batch {first + i * step} (one per example) are not finite: {describe(losses[i])}; " \
        f"{OUTPUTS_HINT}"


def describe(values: torch.Tensor) -> str:
    """``1 NaN and 2 inf of 20480 values (the first at index [0, 5])`` for a tensor that has some."""
    bad = ~torch.isfinite(values)
    nan = int(torch.isnan(values).sum())
    inf = int(bad.sum()) - nan
    counts = " and ".join(f"{k} {kind}" for k, kind in ((nan, "NaN"), (inf, "inf")) if k)
    where = bad.nonzero()[0].tolist() if values.dim() else None
    return f"{counts} of {values.numel()} values" + (f" (the first at index {where})" if where else "")
