"""``headprune compress`` flags -> :class:`~headprune.compression.PruneSettings`, one flag per field.

The flags are the library's words: ``--units``, ``--share``, ``--n-keep``, ``--price``, ``--scores``,
``--compensate``, ``--target``, ``--no-verify`` (``verify=False``) ... The former flags (``--keep``, whose
meaning changed with ``--units``; ``--keep-heads``, a count; ``--flops``, ``--kv``; ``--method``, which
meant a reconstruction with ``--units``; ``--tune-target``; ``--trust-unverified``) keep working for one
release, checked and translated as before, and the command ends with one line per former flag naming
its replacement (at the end: a refused command prints one line only).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..deprecation import deprecation_line
from ..errors import ConfigError, DataError
from .dataflags import ARGUMENT_FLAGS, DATA_FLAGS, PHRASES, in_cli_terms

# library argument -> flag of the settings PruneSettings holds (the former flags keep ARGUMENT_FLAGS)
SETTING_FLAGS = {"share": "--share", "n_keep": "--n-keep", "price": "--price", "scores": "--scores",
                 "compensate": "--compensate", "units": "--units", "target": "--target", "gqa": "--gqa",
                 "max_scale": "--max-scale", "val_share": "--val-share", "same_per_site": "--same-per-site",
                 "min_per_site": "--min-per-site", "seq_len": "--seq-len", "tgt_len": "--tgt-len",
                 "damping": "--damping", "distill_epochs": "--distill-epochs", "distill_lr": "--distill-lr",
                 "seed": "--seed", "guard": "--no-guard", "multiple_of": "--multiple-of"}
FORMER_METHODS = ("ih", "fisher", "fisher+rearrange", "fisher+tune", "random")  # --method of the head plan
POOL_METHODS = {"fisher": "none", "fisher+tune": "reconstruct", "fisher+reconstruct": "reconstruct"}


@dataclass
class Translated:
    """The settings the flags give, and the former flags used (each with the flags that replace it)."""

    settings: object
    former: list[tuple[str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        return ["warning: " + deprecation_line(old, new) for old, new in self.former]


@contextmanager
def in_setting_terms() -> Iterator[None]:
    """Errors raised inside the block name the flags of :data:`SETTING_FLAGS` (``share=0`` -> ``--share 0``)."""
    try:
        yield
    except (DataError, ConfigError) as err:
        message = str(err)
        for phrase, cli in PHRASES:
            message = message.replace(phrase, cli)
        names = {**ARGUMENT_FLAGS, **DATA_FLAGS["--data"], **SETTING_FLAGS}
        alternatives = "|".join(sorted(names, key=len, reverse=True))
        message = re.sub(rf"\b({alternatives})=(?=[\s,;)]|$)", lambda m: names[m[1]], message)
        raise type(err)(re.sub(rf"\b({alternatives})=", lambda m: names[m[1]] + " ", message)) from err


def settings_from_flags(*, units: str, share, n_keep, price, scores, compensate, common: dict) -> Translated:
    """The new flags: each one field of PruneSettings (``common``: the fields every path shares, by name)."""
    from ..compression.settings import PruneSettings

    with in_setting_terms():
        return Translated(PruneSettings(units=units, share=share, n_keep=n_keep, price=price or "flops",
                                        scores=scores or "fisher", compensate=compensate, **common))


def settings_from_former(*, units: str, keep, keep_heads, flops, kv, method, price, pool_inputs: bool,
                         common: dict) -> Translated:
    """The former flags, checked with the former messages, as PruneSettings. ``pool_inputs``: ``--val-data``,
    ``--fit-limit`` or ``--distill-epochs`` given (they sent the former command to the heads-and-neurons path)."""
    from ..compression.plan import CompressSettings
    from ..compression.settings import PruneSettings
    from ..compression.units import UnitSettings

    method_given = method is not None
    method = method or "fisher+tune"
    former = [(f, new) for f, v, new in (
        ("--keep", keep, "--share (with --price count for a share of heads)"), ("--keep-heads", keep_heads, "--n-keep"),
        ("--flops", flops, "--share with --price flops"), ("--kv", kv, "--share with --price kv"),
        ("--method", method if method_given else None, "--scores and --compensate")) if v is not None]
    budgets = {f: v for f, v in (("--keep", keep), ("--keep-heads", keep_heads), ("--flops", flops), ("--kv", kv))
               if v is not None}
    zero = [f for f, v in budgets.items() if v == 0]
    if zero:
        raise ConfigError(f"{zero[0]} 0; allowed: a budget above 0 (0 would remove every unit): a share in (0, 1] "
                          "or a count >= 1")
    pool = units != "heads" or (price is not None and price != "flops") or method == "fisher+reconstruct" or \
        pool_inputs
    if pool:
        heads_only = [f for f, given in (("--kv", kv is not None), ("--same-per-site", common["same_per_site"]))
                      if given]
        if heads_only:
            raise ConfigError(f"{heads_only[0]} with --units {units} / --price {price or 'flops'} / --val-data / "
                              f"--method {method}; allowed: only on the heads-only path (--units heads, --price flops, "
                              "no --val-data, no --method fisher+reconstruct)")
        if units not in ("heads", "neurons", "both"):
            raise ConfigError(f"--units {units!r}; allowed: heads, neurons, both")
        if keep_heads is not None:
            raise ConfigError("--keep-heads counts heads; with --units/--price/--val-data give --keep (share of the "
                              "units' price) or --flops (share of their FLOPs)")
        price = price or "flops"
        given = {f: v for f, v in (("--keep", keep), ("--flops", flops)) if v is not None}
        if len(given) != 1:
            raise ConfigError(f"give exactly one budget of --keep (share of the units' {price} kept) or --flops; got "
                              f"{', '.join(given) or 'none'}")
        if flops is not None and price != "flops":
            raise ConfigError(f"--flops with --price {price!r}; allowed: --keep (share of the {price} kept), or "
                              "--price flops")
        if method not in POOL_METHODS:
            raise ConfigError(f"--method {method!r} with --units {units}; allowed: {', '.join(POOL_METHODS)} "
                              "(fisher+tune: least-squares reconstruction of every pruned layer, kept only if it "
                              "lowers the validation loss)")
        flag, share = next(iter(given.items()))
        if not 0.0 <= share <= 1.0:  # typer gives a float; NaN fails this too
            raise ConfigError(f"{flag} {share}; allowed: a number 0.0..1.0 (the share of the units' {price} kept)")
        pool_fields = {k: v for k, v in common.items() if k not in ("same_per_site", "max_scale")}
        with in_cli_terms():  # the former checks and messages
            UnitSettings(share=share, units=units, price=price, compensate=POOL_METHODS[method], **pool_fields)
        if method_given:
            former[-1] = ("--method", f"--compensate {POOL_METHODS[method]}")
        with in_setting_terms():
            return Translated(PruneSettings(units=units, share=share, price=price, scores="fisher",
                                            compensate=POOL_METHODS[method], **common), former)
    if len(budgets) != 1:
        raise ConfigError(f"give exactly one budget of --keep (share of heads), --keep-heads (number of heads), "
                          f"--flops (share of head FLOPs) or --kv (share of KV-cache bytes); got "
                          f"{', '.join(budgets) or 'none'}")
    if kv is not None and not (0.0 <= kv <= 1.0):
        raise ConfigError(f"--kv {kv}; allowed: a share 0..1 of the KV-cache bytes per token")
    gqa = common["gqa"]
    if gqa not in ("uniform", "groups", "free"):
        raise ConfigError(f"--gqa {gqa!r}; allowed: uniform, groups, free")
    if common["same_per_site"] and (gqa == "free" or flops is not None or kv is not None):
        raise ConfigError(f"--same-per-site with --gqa {gqa} and {', '.join(budgets)}; allowed: --gqa uniform or "
                          "groups with --keep or --keep-heads")
    head_fields = {k: v for k, v in common.items() if k not in ("val_share", "distill_epochs", "distill_lr",
                                                                 "multiple_of")}
    with in_cli_terms():  # the former checks and messages
        CompressSettings(keep=keep, n_keep=keep_heads, flops=flops, kv=kv, method=method, **head_fields)
    if method_given:
        scores_, compensate_ = _method(method)
        former[-1] = ("--method", f"--scores {scores_} --compensate {compensate_}")
    share, price = next(((v, p) for v, p in ((keep, "count"), (flops, "flops"), (kv, "kv")) if v is not None),
                        (None, "count"))
    scores_, compensate_ = _method(method)
    with in_setting_terms():
        return Translated(PruneSettings(share=share, n_keep=keep_heads, price=price, scores=scores_,
                                        compensate=compensate_, **common), former)


def _method(method: str) -> tuple[str, str]:
    """The former ``--method`` of the head plan as (scores, compensate)."""
    if method in ("ih", "random", "fisher"):
        return method, "none"
    return "fisher", method.split("+", 1)[1]
