"""``PruneSettings``: what to prune, how much of it to keep, and how -- one vocabulary for heads and neurons.

A budget is either ``share`` (the share of the pool's ``price`` kept: its unit ``count``, its ``flops`` at
``seq_len``, its ``params``, its ``kv`` cache bytes per token, or its measured ``latency``) or ``n_keep`` (a
count of units kept). Units are scored by ``scores`` (``ih``: the paper's I_h; ``fisher``: the diagonal
Fisher of the mask; ``random``; ``fluctuation``: FLAP's label-free input fluctuation, standardised per kind
over all layers, :mod:`headprune.scoring.fluctuation`; ``fluctuation-raw``: the same fluctuation not
standardised, the expected squared output change of holding a unit at its mean, which the budget trades
against price like any additive score), and the loss of what is cut is made up for by
``compensate``: ``none``; ``rearrange`` (Fisher swaps within a site); ``tune`` (rearrange, then per-site head
scales fitted by least squares and folded into the weights, Kwon et al. 2022); ``reconstruct`` (every pruned
projection refitted by least squares, kept only if it lowers the loss on held-out validation batches);
``bias`` (every removed unit held at its calibration mean, folded into the output projection's bias: FLAP's
compensation, exact, no labels); ``bias+reconstruct`` (both, the refit then fitting the bias too); left out,
the pipeline's own (``tune`` for the head plan, ``reconstruct`` for the budget over heads and neurons, ``bias``
with either ``fluctuation`` score).

Two pipelines run them (:func:`headprune.compression.compress`): heads alone with a ``count`` / ``flops`` /
``kv`` budget and ``none`` / ``rearrange`` / ``tune`` go through the head plan
(:func:`headprune.compression.plan.plan_heads`: GQA modes, ``min_per_site``, ``same_per_site``); neurons,
both, ``params`` / ``latency`` prices, ``fluctuation`` scores, ``reconstruct`` / ``bias`` or distillation go
through the one budget over heads
and neurons (:mod:`headprune.selection.units`). Every setting is checked here, on creation, against
what its pipeline can do, so nothing given is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..checks import check_choice, check_int, check_number, check_share
from ..errors import ConfigError
from ..selection.gqa import GQA_MODES
from ..selection.units import UNITS
from .plan import CompressSettings
from .tuning import TARGETS
from .units import UnitSettings

PRICES = ("count", "flops", "params", "kv", "latency")
SCORES = ("ih", "fisher", "random", "fluctuation", "fluctuation-raw")
COMPENSATIONS = ("none", "rearrange", "tune", "reconstruct", "bias", "bias+reconstruct", "linear",
                 "linear+reconstruct")
POOL_SCORES = ("fisher", "fluctuation", "fluctuation-raw")  # what the budget over heads and neurons can score with
POOL_COMPENSATIONS = ("none", "reconstruct", "bias", "bias+reconstruct", "linear", "linear+reconstruct")
HEAD_PLAN_PRICES = ("count", "flops", "kv")  # what the head plan can budget
POOL_PRICES = ("flops", "params", "latency")  # what the budget over heads and neurons can


@dataclass
class PruneSettings:
    """One budget (``share`` of ``price`` kept, or ``n_keep`` units) over ``units``, and how to meet it."""

    units: str = "heads"  # heads | neurons | both
    share: float | None = None  # share of the pool's price kept, in (0, 1]
    n_keep: int | None = None  # number of units kept (the head plan: heads), >= 1
    price: str = "flops"  # what share measures: count | flops (at seq_len) | params | kv (cache bytes) | latency
    scores: str = "fisher"  # ih | fisher | random | fluctuation (FLAP: one forward, no labels, no gradients;
    # standardised per kind) | fluctuation-raw (the same, not standardised: heads and neurons traded by price)
    compensate: str | None = None  # none | rearrange | tune | reconstruct | bias | linear | bias+reconstruct |
    # linear+reconstruct (None: tune
    # for the head plan with Fisher scores, none with other scores; for the budget over heads and neurons
    # reconstruct, or bias with scores='fluctuation'; set on creation)
    gqa: str = "uniform"  # grouped-query attention: uniform | groups | free (headprune.selection.gqa)
    min_per_site: int = 0  # keep at least this many heads in every site (both paths)
    same_per_site: bool = False  # the head plan: the same heads kept in every site (a stock config describes it)
    seq_len: int = 128  # tokens per example for FLOP prices (encoder / decoder-only)
    tgt_len: int | None = None  # decoder tokens of encoder-decoders (None: seq_len)
    damping: float = 1e-2  # tune / reconstruct: ridge towards the unpruned solution, relative
    max_scale: float = 10.0  # tune: scales outside [-max_scale, max_scale] are refused (unit scales kept)
    target: str = "residual"  # tune / reconstruct: what each site reproduces, the residual stream or its output
    guard: bool = True  # keep each compensation stage only where it lowers the (calibration / validation) loss
    val_share: float = 0.25  # reconstruct, without val_batches: share of the calibration batches held out
    distill_epochs: int = 0  # after reconstruct: passes of distillation over the fit batches (0: none)
    distill_lr: float = 2e-5  # its peak learning rate
    seed: int = 0  # of scores="random" and of the distillation order
    multiple_of: int = 1  # every FFN width and attention width (heads x head_dim) pruning changes is a multiple
    # of this: 32 / 256 for llama.cpp's legacy / K-quant blocks, 64 / 128 for GPU tiles (1: any width; the budget
    # over heads and neurons, headprune.selection.aligned)

    def __post_init__(self):
        check_choice("units", self.units, UNITS)
        check_choice("price", self.price, PRICES)
        check_choice("scores", self.scores, SCORES)
        if self.compensate is None:
            self.compensate = ("bias" if self.scores.startswith("fluctuation") else "reconstruct") \
                if self._pool_reason() \
                else "tune" if self.scores == "fisher" else "none"
        check_choice("compensate", self.compensate, COMPENSATIONS)
        check_choice("gqa", self.gqa, GQA_MODES)
        given = {k: v for k, v in (("share", self.share), ("n_keep", self.n_keep)) if v is not None}
        if len(given) != 1:
            got = ", ".join(f"{k}={v!r}" for k, v in given.items()) or "none"
            raise ConfigError(f"give exactly one budget: share= (the share of the units' {self.price} kept, 0..1) or "
                              f"n_keep= (the number of units kept); got {got}")
        if self.share is not None:
            check_share("share", self.share)
            if self.share == 0:
                raise ConfigError("share=0; allowed: a number in (0, 1] (0 would remove every unit)")
        check_int("n_keep", self.n_keep, 1, optional=True)
        for name in ("min_per_site", "seq_len", "distill_epochs", "seed", "multiple_of"):
            check_int(name, getattr(self, name), 0 if name in ("min_per_site", "distill_epochs", "seed") else 1)
        check_int("tgt_len", self.tgt_len, 1, optional=True)
        check_number("damping", self.damping, low=0)
        check_number("max_scale", self.max_scale, low=0, strict=True)
        check_choice("target", self.target, TARGETS)
        check_share("val_share", self.val_share, one=False)
        check_number("distill_lr", self.distill_lr, low=0, strict=True)
        for name in ("guard", "same_per_site"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}; allowed: True or False")
        if self.compensate in ("rearrange", "tune") and self.scores != "fisher":
            other = " | ".join(POOL_COMPENSATIONS) if self.scores in POOL_SCORES else "'none'"
            raise ConfigError(f"compensate={self.compensate!r} with scores={self.scores!r}; allowed: scores='fisher' "
                              f"(rearrangement and tuning read the Fisher matrix), or compensate {other}")
        if self.head_plan:
            if self.same_per_site and (self.gqa == "free" or (self.n_keep is None and self.price != "count")):
                raise ConfigError(f"same_per_site=True with gqa={self.gqa!r}, price={self.price!r}; allowed: gqa "
                                  "'uniform' or 'groups' with a head count budget (n_keep, or share of price='count')")
            return
        why = self._pool_reason()
        refused = [f"{k}={v!r}" for k, v in (("n_keep", self.n_keep), ("same_per_site", self.same_per_site or None))
                   if v is not None]
        if self.price not in POOL_PRICES:
            refused.append(f"price={self.price!r}")
        if self.compensate in ("rearrange", "tune"):
            refused.append(f"compensate={self.compensate!r}")
        if self.scores not in POOL_SCORES:
            refused.append(f"scores={self.scores!r}")
        if refused:
            raise ConfigError(f"{', '.join(refused)} with {why}; allowed there: a share of price "
                              f"{' | '.join(POOL_PRICES)}, scores {' | '.join(POOL_SCORES)}, compensate "
                              f"{' | '.join(POOL_COMPENSATIONS)}")

    @property
    def head_plan(self) -> bool:
        """Whether the head plan runs (heads only, a count / flops / kv budget, no reconstruction)."""
        return not self._pool_reason()

    def _pool_reason(self) -> str:
        """Why the budget over heads and neurons runs ('' when the head plan does)."""
        for reason, applies in ((f"units={self.units!r}", self.units != "heads"),
                                (f"price={self.price!r}", self.price not in HEAD_PLAN_PRICES),
                                (f"scores={self.scores!r}", self.scores.startswith("fluctuation")),
                                (f"multiple_of={self.multiple_of}", self.multiple_of > 1),
                                (f"compensate={self.compensate!r}", self.compensate in POOL_COMPENSATIONS[1:]),
                                (f"distill_epochs={self.distill_epochs}", self.distill_epochs > 0)):
            if applies:
                return reason
        return ""

    def heads_settings(self) -> CompressSettings:
        """The head plan's settings (``head_plan`` must hold): same-named fields copied, the budget and
        ``scores`` + ``compensate`` in the plan's words (``keep`` / ``n_keep`` / ``flops`` / ``kv``, ``method``)."""
        budget = {"n_keep": self.n_keep} if self.n_keep is not None else \
            {{"count": "keep", "flops": "flops", "kv": "kv"}[self.price]: self.share}
        method = self.scores if self.compensate == "none" else f"fisher+{self.compensate}"
        return CompressSettings(**self._shared(CompressSettings, budget), **budget, method=method)

    def unit_settings(self) -> UnitSettings:
        """The settings of the budget over heads and neurons (``head_plan`` must not hold): same-named fields."""
        return UnitSettings(**self._shared(UnitSettings, {}))

    def _shared(self, cls, taken: dict) -> dict:
        own = {f.name for f in fields(self)}
        return {f.name: getattr(self, f.name) for f in fields(cls) if f.name in own and f.name not in taken}
