"""headprune's rows: configurations of its one public entry point,
``headprune.compression.compress(model, batches, PruneSettings(...))``, nothing else.

:data:`CONFIGURATIONS` is the one place they are listed (name -> PruneSettings fields other than the
budget, and the settings of the methods they name: ``damping``, ``step_damping``, in the flat form the committed rows
were recorded with; :func:`as_settings` builds the method objects, as the CLI builds them from its flags). Another configuration -- e.g. FLAP-style ``scores="fluctuation"``, ``compensate="bias"`` once
PruneSettings accepts them -- is one more entry here.

Budget: the harness asks for a share ``b`` of the non-embedding parameters removed; PruneSettings' ``share`` is
the share of the *pool's* price kept (``price="params"``: the parameters of the heads and neurons it prices), so
``share = 1 - ceil(b x non-embedding params) / pool parameters``. The parameters the compressed model actually
keeps are measured and reported, not assumed.
"""

from __future__ import annotations

import math
import time

from torch import nn

from headprune import PruneSettings, compress
from headprune.compression.compensation import get_compensations
from headprune.core.model.unit_cost import unit_costs
from headprune.methods import with_settings

from .plan import nonembedding_params

CONFIGURATIONS: dict[str, dict] = {
    "headprune-fisher": {"units": "both", "price": "params", "scores": "fisher", "compensate": "none"},
    "headprune-fisher+reconstruct": {"units": "both", "price": "params", "scores": "fisher",
                                     "compensate": "reconstruct"},
    "headprune-fisher+bias": {"units": "both", "price": "params", "scores": "fisher", "compensate": "bias"},
    # FLAP's metric and compensation inside headprune's one budget (scores standardised per kind, as FLAP)
    "headprune-fluctuation+bias": {"units": "both", "price": "params", "scores": "fluctuation", "compensate": "bias"},
    # ... then the least-squares refit of every pruned projection, biases included (guarded on held-out blocks)
    "headprune-fluctuation+bias+reconstruct": {"units": "both", "price": "params", "scores": "fluctuation",
                                               "compensate": "bias+reconstruct"},
    # FLAP's metric, each removed feature replaced by its least-squares affine prediction from the kept ones
    # (headprune.core.cut.standins), in the statistics' one pass; damping 0.3 chosen on the held-out calibration blocks
    # at 20% (benchmarks/linear_damping.py -> benchmarks/results/linear_damping.json; no evaluation text read)
    "headprune-fluctuation+linear": {"units": "both", "price": "params", "scores": "fluctuation",
                                     "compensate": "linear", "damping": 0.3},
    # the Fisher's (loss-based) scores with the same stand-ins and damping
    "headprune-fisher+linear": {"units": "both", "price": "params", "scores": "fisher", "compensate": "linear",
                                "damping": 0.3},
    # the same, the stand-ins fitted block after block on the pruned model's inputs (compensate="linear-seq");
    # damping 0.05 chosen at 50% on the held-out calibration blocks (perplexity 128.9 against 130.0 at 0.3)
    "headprune-fisher+linear-seq": {"units": "both", "price": "params", "scores": "fisher",
                                    "compensate": "linear-seq", "damping": 0.05},
    # the units within each site / FFN re-chosen by their OBS error on the pruned model's inputs (compensate=
    # "obs-seq"); damping 0.01 chosen at 50% on the held-out calibration blocks (121.5 against 121.9 at 0.05)
    "headprune-fisher+obs-seq": {"units": "both", "price": "params", "scores": "fisher", "compensate": "obs-seq",
                                 "damping": 0.01},
    # the same in two rounds, the second scored on the model the first left (steps=2; held-out at 50%, damping 0.05:
    # 118.6 against 121.9 in one round)
    "headprune-fisher+obs-seq-2steps": {"units": "both", "price": "params", "scores": "fisher",
                                        "compensate": "obs-seq", "damping": 0.01, "steps": 2},
    # three rounds (held-out at 50%: a first try that split the budget by parameters, not by price, gave 114.8; the
    # committed row 117.1, behind two rounds' 116.0)
    "headprune-fisher+obs-seq-3steps": {"units": "both", "price": "params", "scores": "fisher",
                                        "compensate": "obs-seq", "damping": 0.01, "steps": 3},
    # two rounds of headprune-fisher+linear (Fisher on 2 of the 8 calibration batches in the first round, on 1 in
    # the second; damping 0.3) only choose the units; obs-seq then runs once on the unpruned model, re-choosing within
    # each site / FFN on the pruned model's inputs: one sequential pass instead of one per round. Held-out at 50%:
    # benchmarks/results/step_standin.json (the second round's 1 batch set there after the pruning time was seen)
    "headprune-fisher+linear-2steps+obs-seq": {"units": "both", "price": "params", "scores": "fisher",
                                               "compensate": "obs-seq", "damping": 0.01, "steps": 2,
                                               "step_standin": "linear", "step_damping": 0.3,
                                               "score_batches": [2, 1]},
    # the same metric unstandardised: each unit's expected squared output change, traded by its price
    "headprune-fluctuation-raw+bias": {"units": "both", "price": "params", "scores": "fluctuation-raw",
                                       "compensate": "bias"},
}


def settings_for(name: str, model: nn.Module, budget: float) -> PruneSettings:
    """The PruneSettings of configuration ``name`` removing ``budget`` of ``model``'s non-embedding parameters."""
    target = math.ceil(budget * nonembedding_params(model))
    pool = unit_costs(model, "params").total()
    return PruneSettings(share=1 - target / pool, **as_settings(CONFIGURATIONS[name]))


def as_settings(config: dict) -> dict:
    """A configuration as PruneSettings fields: ``compensate`` as the list of compensation objects run in order,
    each with ``damping`` where it has that setting, and ``step_standin`` as an object with ``step_damping`` (else
    ``damping``). The configurations keep the flat form their committed rows were recorded with (e.g.
    ``"compensate": "bias+reconstruct"``, ``"damping": 0.3``)."""
    fields = {k: v for k, v in config.items() if k not in ("damping", "step_damping")}
    damping = {"damping": config.get("damping")}
    fields["compensate"] = [with_settings(c, damping) for c in get_compensations(config["compensate"].split("+"))]
    if config.get("step_standin") is not None:
        step = config.get("damping") if config.get("step_damping") is None else config["step_damping"]
        fields["step_standin"] = with_settings(get_compensations(config["step_standin"])[0], {"damping": step})
    return fields


def headprune_row(name: str, model: nn.Module, batches, budget: float) -> tuple[nn.Module, dict]:
    """(the compressed copy of ``model``, what compress did) for configuration ``name``."""
    settings = settings_for(name, model, budget)
    start = time.perf_counter()
    result = compress(model, list(batches), settings)
    seconds = time.perf_counter() - start
    d = result.to_dict()
    heads = d.get("dropped_heads", d.get("dropped", {}))
    neurons = d.get("dropped_neurons", {})
    info = {"settings": settings.to_dict(), "stages": d.get("stages"),
            "heads": sum(len(v) for v in heads.values()), "neurons": sum(len(v) for v in neurons.values()),
            "seconds": seconds}
    return result.model, info
