"""``CompressResult``: what :func:`headprune.compression.compress` returns for heads, neurons or both -- the
smaller model, the units kept and dropped per site / FFN, the tuned head scales, the :class:`~.replay.Plan` (which
holds every tensor a stage rewrote), the stage log with the guard's loss of each state, and the sizes before and
after (:func:`sizes`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields

from torch import nn

from ..core.model.cost import flop_breakdown
from ..core.model.ffn import find_ffns
from ..core.model.kvcache import kv_cache_bytes
from ..core.model.sites import find_sites
from .replay import Plan


@dataclass
class CompressResult:
    """The compressed ``model`` and what was done to it (JSON-ready through :meth:`to_dict`)."""

    model: nn.Module
    settings: dict
    dropped_heads: dict[str, list[int]]  # {site: heads removed, indices among the heads it had}
    dropped_neurons: dict[str, list[int]]  # {ffn: neurons removed, indices among the neurons it had}
    kept_heads: dict[str, list[int]]  # {site: original indices of the heads it keeps} (saved with the model)
    kept_neurons: dict[str, list[int]]  # {ffn: original indices of the neurons it keeps}
    sizes: dict[str, dict]  # before / after: heads, neurons, params, flops, attention_flops, KV bytes per token
    stages: dict[str, str]  # the stage log: stage -> "kept" | "kept (...)" | "rejected (...)" | "skipped"
    losses: dict[str, float] = field(default_factory=dict)  # the guard's mean loss of each state measured, by key
    guard_data: str = ""  # what ``losses`` were measured on: "calibration" | "validation" ("": nothing measured)
    scales: dict[str, list[float]] | None = None  # tuned mask values folded into the weights (kept heads only)
    selection: dict = field(default_factory=dict)  # the selection's record (the budget, per round with steps)
    loss_estimate: dict[str, float] = field(default_factory=dict)  # the Fisher estimate after select / rearrange
    tuning: list[dict] = field(default_factory=list)  # per site: the tuned scales' reconstruction errors
    reconstruction: list[dict] = field(default_factory=list)  # per projection: the refit's errors
    distillation: dict = field(default_factory=dict)  # steps, seconds, lr, first and last training loss
    split: dict[str, int] = field(default_factory=dict)  # calibration / validation / fit batches and examples
    seconds: dict[str, float] = field(default_factory=dict)
    plan: Plan | None = None  # what was removed and rewritten (plan.json + plan.safetensors; headprune apply)

    @property
    def rejected(self) -> list[str]:
        """The stages the guard turned down, in order."""
        return [s for s, note in self.stages.items() if note.startswith("rejected")]

    def to_dict(self) -> dict:
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name not in ("model", "plan")}
        return out | {"rejected": self.rejected, "model_class": type(self.model).__name__}

    def summary(self) -> str:
        """One line: what was kept, and which stages were kept or turned down."""
        b, a = self.sizes["before"], self.sizes["after"]
        neurons = f", {a['neurons']}/{b['neurons']} neurons" if self.dropped_neurons else ""
        stages = ", ".join(f"{k} {v}" for k, v in self.stages.items())
        return (f"kept {a['heads']}/{b['heads']} heads{neurons}, {a['flops'] / b['flops']:.1%} of FLOPs, "
                f"{a['params'] / b['params']:.1%} of parameters; stages: {stages}")


def sizes(model: nn.Module, settings) -> dict:
    """Heads, FFN neurons, parameters, FLOPs (all, and of attention) at ``settings``' lengths, KV-cache bytes per
    token: what a compression record holds before and after."""
    flops = flop_breakdown(model, settings.seq_len, tgt_len=settings.tgt_len)
    return {"heads": sum(s.num_heads for s in find_sites(model)),
            "neurons": sum(f.width for f in find_ffns(model, skip_moe=True)),
            "params": sum(p.numel() for p in model.parameters()), "flops": flops["total"],
            "attention_flops": flops["projections"] + flops["attention"],
            "seq_len": settings.seq_len, "tgt_len": settings.tgt_len,
            "kv_cache_bytes_per_token": kv_cache_bytes(model)["per_token"]}
