"""``headprune importance`` as a run directory: one score per head, as JSON, CSV, heatmap and report.

The scores are the library's (:func:`headprune.head_importance` or the diagonal of
:func:`headprune.fisher_information`, divided by the number of examples scored); this module only
writes them: ``importance.json`` ({"scores": {site: [score per head]}, "n", "signature"}),
``importance.csv`` (site, layer, kind, head, score), ``importance_heatmap.png``, ``results.json`` and
``report.html``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

from ..core.model.sites import find_sites
from ..errors import ConfigError
from ..provenance import versions
from ..report import build_report
from ..report import figures as fig
from ..scoring.fisher import fisher_information
from ..scoring.importance import importance_sums, normalize_per_site
from .rundir import RunOutput

SCORES = ("importance", "fisher")
TITLES = {"importance": "Head importance I_h = E_x |dL(x)/dxi_h| (Michel et al. 2019, 4.1)",
          "fisher": "Empirical Fisher of the head mask, diagonal, per example (Kwon et al. 2022)"}


def check_settings(scores: str, absolute: str, normalize: str | None) -> None:
    if scores not in SCORES:
        raise ConfigError(f"scores={scores!r}; allowed: {', '.join(SCORES)}")
    if absolute not in ("example", "batch"):
        raise ConfigError(f"absolute={absolute!r}; allowed: 'example', 'batch'")
    if normalize not in (None, "l2"):
        raise ConfigError(f"normalize={normalize!r}; allowed: 'l2' or None")


def head_scores(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], *, scores: str = "importance",
                absolute: str = "example", normalize: str | None = "l2",
                progress: bool = False) -> tuple[dict[str, torch.Tensor], int]:
    """({site: [H] float64 scores}, examples scored): I_h (``absolute`` per example or per batch) or the
    Fisher diagonal, both means over the examples scored, then ``normalize`` ("l2" per site, or None)."""
    check_settings(scores, absolute, normalize)
    if scores == "importance":
        sums, n = importance_sums(model, batches, absolute=absolute, progress=progress)
    else:
        fisher = fisher_information(model, batches, progress=progress)
        sums, n = fisher.diag, fisher.n
    means = {name: s / n for name, s in sums.items()}
    return (normalize_per_site(means) if normalize == "l2" else means), n


def score_rows(model: nn.Module, scores: Mapping[str, torch.Tensor]) -> list[dict]:
    """One row per head: site, layer, kind, head, score (sites in the model's order)."""
    where = {s.name: s for s in find_sites(model)}
    return [{"site": name, "layer": where[name].layer, "kind": where[name].kind, "head": h, "score": float(v)}
            for name in scores for h, v in enumerate(scores[name].tolist())]


def run_importance(model: nn.Module, batches: Callable[[], Iterable], output: RunOutput, *,
                   scores: str = "importance", absolute: str = "example", normalize: str | None = "l2") -> Path:
    """Score every head over ``batches()`` and write the run directory ``output.path`` (returns report.html)."""
    check_settings(scores, absolute, normalize)
    settings = {"scores": scores, "absolute": absolute if scores == "importance" else None, "normalize": normalize}
    signature = output.signature or {}
    sig = {"model": None, "data": None, "split": None, **signature, "method": scores, "settings": settings,
           "seed": signature.get("seed", 0), "versions": versions()}
    run = output.open(sig)  # under torchrun: rank 0 writes, the ranks share the batches
    values, n = head_scores(model, batches(), scores=scores, absolute=absolute, normalize=normalize,
                            progress=output.progress)
    plain = {name: v.tolist() for name, v in values.items()}
    run.write_json("importance.json", {"scores": plain, "n": n, "signature": run.signature})
    rows = score_rows(model, values)
    run.write_csv("importance.csv", rows)
    label = "I_h" if scores == "importance" else "Fisher diagonal"
    norm = "l2-normalised per layer" if normalize == "l2" else "not normalised"
    fig.importance_heatmap(plain, run.path / "importance_heatmap.png", title=f"{label} per head ({norm})")
    top = max(rows, key=lambda r: r["score"])
    low = min(rows, key=lambda r: r["score"])
    run.write_json("results.json", {
        "title": TITLES[scores], "experiment": "importance", "scores": plain, "n": n, "signature": run.signature,
        "headline": [["examples scored", n], ["heads", len(rows)],
                     ["most important head", f"{top['site']} head {top['head']}"],
                     ["least important head", f"{low['site']} head {low['head']}"]],
        "figures": [{"file": "importance_heatmap.png", "caption": f"{label} per head, {norm} (darker = lower)."}],
        "tables": [{"title": "Per head", "file": "importance.csv", "max_rows": 40}],
    })
    return build_report(run.path)
