"""``Budget``: one type for what a selection keeps or removes -- a share of the pool's price, or a count of units.

Every selection function reads its budget through :meth:`Budget.of`, the one validation: exactly one budget
among its keywords, a share in 0..1 (a number, not NaN), a count an integer >= 0. The keywords name what the
number means, so one meaning is one name (never an ``amount`` whose type changes its meaning):

- ``n_drop`` / ``fraction``: a count / share of the pool's units removed;
- ``n_keep`` / ``keep``: a count / share of the pool's units kept;
- ``flops`` / ``kv``: a share of the pool's FLOPs / KV-cache bytes kept;
- ``share``: a share of the pool's ``price`` kept (count, flops, params, kv or latency), as
  :class:`~headprune.compression.PruneSettings` says it.

A caller builds the budget once (``Budget.of(fraction=0.5)``) and passes it, with a :class:`HeadRule` (how heads
are spread: grouped-query attention mode, heads kept per site, the sites in the pool), to
:func:`headprune.selection.select_heads`; :func:`~headprune.selection.select_units` reads a ``share`` budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import check_choice, check_int, check_share
from ..errors import ConfigError

GQA_MODES = ("uniform", "groups", "free")  # grouped-query attention: see headprune.selection.gqa
PRICES = ("count", "flops", "params", "kv", "latency")
# keyword -> (a share, else a count; what is removed, else what is kept; the price it measures, None: ``price``)
KEYWORDS = {"n_drop": (False, True, "count"), "fraction": (True, True, "count"), "n_keep": (False, False, "count"),
            "keep": (True, False, "count"), "flops": (True, False, "flops"), "kv": (True, False, "kv"),
            "share": (True, False, None)}


@dataclass(frozen=True)
class Budget:
    """One budget: ``amount`` (a share in 0..1, or a count) of the pool's ``price``, kept or ``removed``."""

    keyword: str  # the name it was given by (n_keep, keep, flops, kv, share, n_drop, fraction): for messages
    amount: float | int
    is_share: bool
    removed: bool = False
    price: str = "count"

    @classmethod
    def of(cls, price: str = "count", least: int = 0, **given) -> Budget:
        """The one budget among ``given`` (keywords of :data:`KEYWORDS`, None for not given); ``price``: what
        ``share`` measures; ``least``: the smallest count allowed. Refused in one line naming the keywords."""
        unknown = [k for k in given if k not in KEYWORDS]
        if unknown:
            raise ConfigError(f"budget keywords {unknown}; allowed: {', '.join(KEYWORDS)}")
        if price not in PRICES:
            raise ConfigError(f"price={price!r}; allowed: {', '.join(PRICES)}")
        chosen = {k: v for k, v in given.items() if v is not None}
        if len(chosen) != 1:
            got = ", ".join(f"{k}={v!r}" for k, v in chosen.items()) or "none"
            raise ConfigError(f"give exactly one budget: {' or '.join(f'{k}=' for k in given)}; got {got}")
        (keyword, amount), = chosen.items()
        is_share, removed, measured = KEYWORDS[keyword]
        if is_share:
            check_share(keyword, amount)
        elif isinstance(amount, bool) or not isinstance(amount, int) or amount < least:
            raise ConfigError(f"{keyword}={amount!r}; allowed: an integer >= {least}")
        return cls(keyword, amount, is_share, removed, measured or price)

    def count_removed(self, total: int) -> int:
        """How many of ``total`` units a count / count-share budget removes (a count above ``total`` refused)."""
        if self.price != "count":
            raise ConfigError(f"{self.keyword}=: a share of {self.price}, not a count of units")
        if self.is_share:
            n = int(round(self.amount * total))
            return n if self.removed else total - n
        if self.amount > total:
            raise ConfigError(f"{self.keyword}={self.amount!r}; allowed: an integer 0..{total}")
        return int(self.amount) if self.removed else total - int(self.amount)


@dataclass(frozen=True)
class HeadRule:
    """How a head budget is spent, whatever its size (:func:`headprune.selection.select_heads`)."""

    gqa: str = "uniform"  # uniform | groups | free: how heads leave key/value groups (headprune.selection.gqa)
    min_per_site: int = 0  # every site keeps at least this many heads (its best), paid from the budget
    sites: tuple[str, ...] | None = None  # the pool: only these sites lose heads (the others keep all, uncounted)
    same_per_site: bool = False  # every site of the pool keeps the same number of heads (uniform / groups only)

    def __post_init__(self) -> None:
        check_choice("gqa", self.gqa, GQA_MODES)
        check_int("min_per_site", self.min_per_site, 0)
        if self.sites is not None:
            if isinstance(self.sites, str) or not all(isinstance(s, str) for s in self.sites):
                raise ConfigError(f"sites={self.sites!r}; allowed: a list of site names or None")
            object.__setattr__(self, "sites", tuple(self.sites))
        if not isinstance(self.same_per_site, bool):
            raise ConfigError(f"same_per_site={self.same_per_site!r}; allowed: True or False")
        if self.same_per_site and self.gqa == "free":
            raise ConfigError("same_per_site=True with gqa='free'; allowed: gqa 'uniform' or 'groups'")


def check_budget(budget, *prices: str) -> Budget:
    """``budget`` when it is a :class:`Budget` measured in one of ``prices``; else one line naming it."""
    if not isinstance(budget, Budget):
        raise ConfigError(f"budget={budget!r}; allowed: a Budget, e.g. Budget.of(fraction=0.5)")
    if budget.price not in prices:
        raise ConfigError(f"budget {budget.keyword}={budget.amount!r} is a share of {budget.price}; allowed here: "
                          f"a budget in {' or '.join(prices)}")
    return budget
