"""``PruneSettings``: what to prune, how much of it to keep, and how -- one vocabulary for heads and neurons.

A budget is either ``share`` (the share of the pool's ``price`` kept: its unit ``count``, its ``flops`` at
``seq_len``, its ``params``, its ``kv`` cache bytes per token, or its measured ``latency``) or ``n_keep`` (a
count of units kept). Units are scored by ``scores`` (``ih``: the paper's I_h; ``fisher``: the diagonal
Fisher of the mask; ``random``; ``fluctuation``: FLAP's label-free input fluctuation, standardised per kind
over all layers, :mod:`headprune.scoring.fluctuation`; ``fluctuation-raw``: the same fluctuation not
standardised, the expected squared output change of holding a unit at its mean, which the budget trades
against price like any additive score; or any registered name or :class:`~headprune.scoring.scorer.Scorer`
object), and the loss of what is cut is made up for by
``compensate``: ``none``; ``rearrange`` (Fisher swaps within a site); ``tune`` (rearrange, then per-site head
scales fitted by least squares and folded into the weights, Kwon et al. 2022); ``reconstruct`` (every pruned
projection refitted by least squares, kept only if it lowers the loss on held-out validation batches);
``bias`` (every removed unit held at its calibration mean, folded into the output projection's bias: FLAP's
compensation, exact, no labels); ``linear`` / ``linear-seq`` / ``obs-seq`` (removed units replaced by their
least-squares prediction from the kept ones); ``distill`` (the pruned model trained towards the unpruned one); a
list runs in order (``["bias", "reconstruct"]``: the refit then fitting the bias too); left out, the pipeline's own
(``tune`` for the head plan, ``reconstruct`` for the budget over heads and neurons, ``bias`` with either
``fluctuation`` score).

The settings here are the pipeline's: the budget, the units, the selection's rules, the lengths FLOPs are priced
at, the guard, the rounds. A method owns its own settings: a scorer or compensation is an object whose fields are
its knobs, validated by its own class (``Tune(damping=1e-2, max_scale=10.0, target="residual")``,
``Reconstruct(damping=..., target=...)``, ``Linear(variant="obs-seq", damping=0.01)``, ``Distill(epochs=2,
lr=1e-4)``, :mod:`headprune.compression.compensations`); a name (``"linear"``) is the object registered under it,
default-configured, and a spec table (``{"name": "linear", "damping": 0.3}``, :mod:`headprune.methods`) the same
with some settings changed -- the form :meth:`PruneSettings.to_dict` and :meth:`PruneSettings.to_toml` write.

One pipeline runs them (:func:`headprune.compression.compress`), whose selection step the settings choose
(:attr:`PruneSettings.head_plan`, read in :mod:`headprune.compression` only): heads alone with a ``count`` /
``flops`` / ``kv`` budget and ``none`` / ``rearrange`` / ``tune`` go through the head plan
(:func:`headprune.compression.plan.plan_heads`: GQA modes, ``min_per_site``, ``same_per_site``); neurons,
both, ``params`` / ``latency`` prices, ``fluctuation`` scores, ``reconstruct`` / ``bias`` or distillation go
through the one budget over heads
and neurons (:mod:`headprune.selection.units`). Every setting is checked here, on creation, against
what its pipeline can do, so nothing given is ignored. ``low_memory`` runs the second pipeline within about
the model's own memory (activation checkpointing, stand-ins block by block, the cut in place: the model passed is
the model returned), the same result, where no stage needs the unpruned model afterwards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from ..checks import check_choice, check_int, check_share, is_int
from ..errors import ConfigError
from ..scoring.registry import get_scorer, scorer_names, scorer_spec
from ..scoring.scorer import Scorer
from ..selection.budgets import Budget, HeadRule
from ..selection.gqa import GQA_MODES
from ..selection.units import UNITS
from .compensation import Compensation, compensation_names, compensation_spec, get_compensations

PRICES = ("count", "flops", "kv", "params", "latency")
HEAD_PLAN_PRICES = ("count", "flops", "kv")  # what the head plan can budget
POOL_PRICES = ("flops", "params", "latency")  # what the budget over heads and neurons can


@dataclass
class PruneSettings:
    """One budget (``share`` of ``price`` kept, or ``n_keep`` units) over ``units``, and how to meet it."""

    units: str = "heads"  # heads | neurons | both
    share: float | None = None  # share of the pool's price kept, in (0, 1]
    n_keep: int | None = None  # number of units kept (the head plan: heads), >= 1
    price: str = "flops"  # what share measures: count | flops (at seq_len) | params | kv (cache bytes) | latency
    scores: str | dict | Scorer = "fisher"  # ih | fisher | random | fluctuation (FLAP: one forward, no labels, no
    # gradients; standardised per kind) | fluctuation-raw (the same, not standardised: heads and neurons traded by
    # price) | any registered name | a Scorer object
    compensate: str | dict | Compensation | list | None = None  # none | rearrange | tune | reconstruct | bias |
    # linear | linear-seq | obs-seq | distill | any registered name (default-configured) | a Compensation object with
    # its own settings (Tune(damping=...), Linear(variant=..., damping=...), Distill(epochs=...)) | a spec table
    # ({"name": "linear", "damping": 0.3}) | a list of them, run in order (None: tune
    # for the head plan with Fisher scores, none with other scores; for the budget over heads and neurons
    # reconstruct, or bias with scores='fluctuation'; set on creation)
    gqa: str = "uniform"  # grouped-query attention: uniform | groups | free (headprune.selection.gqa)
    min_per_site: int = 0  # keep at least this many heads in every site (both paths)
    same_per_site: bool = False  # the head plan: the same heads kept in every site (a stock config describes it)
    seq_len: int = 128  # tokens per example for FLOP prices (encoder / decoder-only)
    tgt_len: int | None = None  # decoder tokens of encoder-decoders (None: seq_len)
    guard: bool = True  # keep each compensation stage only where it lowers the (calibration / validation) loss
    val_share: float = 0.25  # the guard of the stages after the cut (refits, distillation), without val_batches:
    # the share of the calibration batches held out for it
    seed: int = 0  # of scores="random" and of distill's order
    multiple_of: int = 1  # every FFN width and attention width (heads x head_dim) pruning changes is a multiple
    # of this: 32 / 256 for llama.cpp's legacy / K-quant blocks, 64 / 128 for GPU tiles (1: any width; the budget
    # over heads and neurons, headprune.selection.aligned)
    low_memory: bool = False  # the budget over heads and neurons, for models near the machine's memory: score with
    # activation checkpointing, solve linear stand-ins one block at a time (headprune.compression.blockwise) and cut
    # the model passed *in place* (no copy; it is the returned model). Refused with refits or distillation (they
    # read the unpruned model)
    steps: int = 1  # the budget over heads and neurons: rounds of score, select, stand-in and cut, each taking an
    # equal part of the budget from the model the round before left (its scores see what is already gone)
    step_standin: str | dict | Compensation | None = None  # steps > 1: the stand-in every round folds (e.g. "linear",
    # or Linear(damping=0.3)); the rounds then only choose the units, and compensate's stand-in runs once, after them,
    # on the model passed (an obs-seq one re-choosing which units of each site / FFN go among all of them, on the pruned
    # model's inputs)
    score_batches: int | list[int] = 0  # the budget over heads and neurons: the scoring pass (the scores, and the
    # stand-in moments it gathers) reads this many calibration batches, spread over their order from the first (0: all
    # of them); a list: one number per round of ``steps``; block-by-block stand-ins, refits and the guard read all

    def __post_init__(self):
        check_choice("units", self.units, UNITS)
        check_choice("price", self.price, PRICES)
        self._scorer = get_scorer(self.scores)
        self._compensations, self._step_standin = (), None
        if self.compensate is None:
            self.compensate = default_compensate(self._scorer, pool=bool(self._pool_reason()))
        self._compensations = get_compensations(self.compensate)
        check_choice("gqa", self.gqa, GQA_MODES)
        self._check_budget()
        for name in ("min_per_site", "seq_len", "seed", "multiple_of", "steps"):
            check_int(name, getattr(self, name), 0 if name in ("min_per_site", "seed") else 1)
        self._check_score_batches()
        check_int("tgt_len", self.tgt_len, 1, optional=True)
        check_share("val_share", self.val_share, one=False)
        for name in ("guard", "same_per_site", "low_memory"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}; allowed: True or False")
        self._check_methods()

    def _check_budget(self) -> None:
        self._budget = Budget.of(self.price, least=1, share=self.share, n_keep=self.n_keep)  # the one validation
        if self.share == 0:
            raise ConfigError("share=0; allowed: a number in (0, 1] (0 would remove every unit)")

    @property
    def budget(self) -> Budget:
        """The budget: ``share`` of ``price`` kept, or ``n_keep`` units kept."""
        return self._budget

    def _check_methods(self) -> None:
        """The scorer and the compensations against each other and against the pipeline that runs them."""
        stages = [c.stage for c in self._compensations]
        if stages != sorted(stages, key=("plan", "standin", "refit").index) or stages.count("standin") > 1:
            raise ConfigError(f"compensate={self._compensate_text()}; allowed: at most one stand-in (bias, linear), "
                              "in the order plan (rearrange, tune), stand-in, refit (reconstruct)")
        name = self._scorer.name
        if "plan" in stages and not self._scorer.fisher:
            other = " | ".join(self._pool_names()) if self._scorer.pool else "'none'"
            raise ConfigError(f"compensate={self._compensate_text()} with scores={name!r}; allowed: scores='fisher' "
                              f"(rearrangement and tuning read the Fisher matrix), or compensate {other}")
        if self.low_memory and (self.head_plan or self.refits):
            given = f"compensate={self._compensate_text()}" if self.refits else "the head plan"
            raise ConfigError(f"low_memory=True with {given}: low_memory prunes the model in place, and refits and "
                              "distillation read the unpruned one; allowed: the budget over heads and neurons "
                              "(units neurons | both, or price params) with compensate none | bias | linear")
        self._check_steps()
        if self.head_plan and self.steps > 1:
            raise ConfigError(f"steps={self.steps} with the head plan; allowed: steps=1, or the budget over heads and "
                              "neurons (units neurons | both, or price params)")
        if self.head_plan:
            if self.same_per_site and (self.gqa == "free" or (self.n_keep is None and self.price != "count")):
                raise ConfigError(f"same_per_site=True with gqa={self.gqa!r}, price={self.price!r}; allowed: gqa "
                                  "'uniform' or 'groups' with a head count budget (n_keep, or share of price='count')")
            return
        refused = [f"{k}={v!r}" for k, v in (("n_keep", self.n_keep), ("same_per_site", self.same_per_site or None))
                   if v is not None]
        if self.price not in POOL_PRICES:
            refused.append(f"price={self.price!r}")
        if "plan" in stages:
            refused.append(f"compensate={self._compensate_text()}")
        if not self._scorer.pool:
            refused.append(f"scores={name!r}")
        if refused:
            raise ConfigError(f"{', '.join(refused)} with {self._pool_reason()}; allowed there: a share of price "
                              f"{' | '.join(POOL_PRICES)}, scores {' | '.join(self._pool_scores())}, compensate "
                              f"{' | '.join(self._pool_names())}")

    def _check_score_batches(self) -> None:
        """``score_batches``: one count >= 0, or one per round (a list of ``steps`` of them, kept as a list)."""
        value = self.score_batches
        if isinstance(value, list | tuple):
            if len(value) != self.steps or not all(is_int(v) and v >= 0 for v in value):
                raise ConfigError(f"score_batches={value!r}; allowed: an integer >= 0, or a list of {self.steps} of "
                                  f"them (one per round of steps={self.steps})")
            self.score_batches = [int(v) for v in value]
        else:
            check_int("score_batches", value, 0)

    def round_score_batches(self, i: int) -> int:
        """How many calibration batches round ``i`` (1 .. ``steps``) scores on (0: all of them)."""
        value = self.score_batches
        return value[i - 1] if isinstance(value, list) else value

    def _check_steps(self) -> None:
        """``step_standin`` / ``score_batches`` against the rounds and the pipeline that runs them."""
        if self.head_plan and any(self.round_score_batches(i) for i in range(1, self.steps + 1)):
            raise ConfigError(f"score_batches={self.score_batches} with the head plan; allowed: 0, or the budget over "
                              "heads and neurons (units neurons | both, or price params)")
        self._step_standin = None
        if self.step_standin is None:
            return
        standins = [n for n in compensation_names() if get_compensations(n)[0].stage == "standin"]
        given = None if isinstance(self.step_standin, list | tuple) else self.step_standin
        found = get_compensations(given) if given is not None and given != "none" else ()
        if len(found) != 1 or found[0].stage != "standin":
            raise ConfigError(f"step_standin={self.step_standin!r}; allowed: None or a stand-in: "
                              f"{' | '.join(standins)} (a name, a spec table or an object)")
        self._step_standin = found[0]
        if self.steps < 2 or self.standin is None or self.low_memory:
            why = f"steps={self.steps}" if self.steps < 2 else "low_memory=True" if self.low_memory else \
                f"compensate={self._compensate_text()}"
            raise ConfigError(f"step_standin={self._step_standin.name!r} with {why}; allowed: steps >= 2, a stand-in "
                              "in compensate (it runs once after the rounds, on the model passed, which low_memory "
                              "cuts in the first round)")

    @staticmethod
    def _pool_scores() -> list[str]:
        return [n for n in scorer_names() if get_scorer(n).pool]

    @staticmethod
    def _pool_names() -> list[str]:
        return ["none", *(n for n in compensation_names() if get_compensations(n)[0].stage != "plan")]

    def _compensate_text(self) -> str:
        names = self.compensation_names
        return repr(names[0]) if len(names) == 1 else repr(list(names)) if names else "'none'"

    @property
    def scorer(self) -> Scorer:
        """The scorer ``scores`` names (or is)."""
        return self._scorer

    @property
    def compensations(self) -> tuple[Compensation, ...]:
        """The compensations ``compensate`` names (or is), in order; () for none."""
        return self._compensations

    @property
    def compensation_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self._compensations)

    @property
    def standin(self) -> Compensation | None:
        """The stand-in compensation (``bias``, ``linear``), or None."""
        return next((c for c in self._compensations if c.stage == "standin"), None)

    @property
    def round_standin(self) -> Compensation | None:
        """The stand-in the rounds of ``steps`` fold (``step_standin`` as an object), or None."""
        return self._step_standin

    @property
    def refits(self) -> tuple[Compensation, ...]:
        """The compensations run on the pruned model and guarded on validation data, in order."""
        return tuple(c for c in self._compensations if c.stage == "refit")

    @property
    def head_plan(self) -> bool:
        """Whether the head plan selects (heads only, a count / flops / kv budget, no reconstruction); else the
        budget over heads and neurons does. The pipeline's one switch: the CLI, the experiments and the scorers never
        read it."""
        return not self._pool_reason()

    def _pool_reason(self) -> str:
        """Why the budget over heads and neurons runs ('' when the head plan does)."""
        pool_stage = any(c.stage != "plan" for c in self._compensations)
        for reason, applies in ((f"units={self.units!r}", self.units != "heads"),
                                (f"price={self.price!r}", self.price not in HEAD_PLAN_PRICES),
                                (f"scores={self._scorer.name!r}", not self._scorer.plan),
                                (f"multiple_of={self.multiple_of}", self.multiple_of > 1),
                                (f"compensate={self._compensate_text()}", pool_stage)):
            if applies:
                return reason
        return ""

    @property
    def method(self) -> str:
        """Scores and compensations in one line for titles (``fisher+tune``, ``ih``, ``fluctuation+bias``)."""
        return "+".join((self._scorer.name, *self.compensation_names))

    def to_dict(self) -> dict:
        """The settings as JSON: methods as specs (:mod:`headprune.methods`: a name, or ``{"name": ..., setting:
        value}`` for a method whose settings are not those of its name; ``compensate`` a list of them, ``[]`` for
        none); ``PruneSettings(**settings.to_dict())`` is the same settings."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        step = self._step_standin
        return out | {"scores": scorer_spec(self._scorer), "compensate": [compensation_spec(c) for c in
                                                                           self._compensations],
                      "step_standin": None if step is None else compensation_spec(step)}

    def to_toml(self) -> str:
        """The settings as a ``[settings]`` TOML table (methods as specs: a name, or an inline table of the method's
        name and the settings it sets, ``{name = "linear", damping = 0.3}``; unset fields left out): the file
        ``headprune compress --config`` reads, written into every compress run directory."""
        lines = ["# headprune compress --config: PruneSettings fields (headprune.compression.PruneSettings)",
                 "[settings]"]
        for key, value in self.to_dict().items():
            if value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_toml(cls, path) -> PruneSettings:
        """The settings of a ``[settings]`` table in the TOML file ``path`` (unknown keys refused, by name)."""
        try:
            import tomllib
        except ImportError:  # Python 3.10
            try:
                import tomli as tomllib
            except ImportError:
                raise ConfigError("a TOML settings file needs Python >= 3.11 or the tomli package") from None
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, ValueError) as err:
            raise ConfigError(f"settings file {str(path)!r}: {err}") from None
        table = data.get("settings")
        if not isinstance(table, dict) or set(data) - {"settings"}:
            raise ConfigError(f"settings file {str(path)!r}: tables {sorted(data)}; allowed: one [settings] table")
        own = [f.name for f in fields(cls)]
        unknown = sorted(set(table) - set(own))
        if unknown:
            raise ConfigError(f"settings file {str(path)!r}: unknown keys {unknown}; allowed: {', '.join(own)}")
        return cls(**table)

    def head_rule(self, sites: list[str] | None = None) -> HeadRule:
        """How the head plan spends :attr:`budget` (:func:`headprune.selection.select_heads`); ``sites``: the pool."""
        return HeadRule(self.gqa, self.min_per_site, None if sites is None else tuple(sites), self.same_per_site)


def default_compensate(scorer: Scorer, *, pool: bool) -> str:
    """The compensation ``compensate=None`` stands for: with the budget over heads and neurons (``pool``) ``bias``
    for a label-free scorer, else ``reconstruct``; with the head plan ``tune`` for Fisher scores, else ``none``."""
    if pool:
        return "bias" if scorer.label_free else "reconstruct"
    return "tune" if scorer.fisher else "none"


def _toml_value(value) -> str:
    """A TOML literal of a settings value (string, boolean, number, a method's spec table, or a list of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, dict):  # an inline table: keys are field names (bare keys)
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"
