"""Figures say what they draw (legends read from the matplotlib objects), curve verdicts are tested
ones, and a goal is met only by an interval's worse end."""

from __future__ import annotations

import json

import pytest

import headprune as hp
from headprune.errors import DataError
from headprune.evaluation.significance import goal_met
from headprune.experiments.curves import no_significant_loss
from headprune.report import figures
from tiny import build


@pytest.fixture
def drawn(monkeypatch):
    """The figures a call draws, kept open for inspection (plt.close is what each drawing ends with)."""
    kept = []
    close = figures.plt.close
    monkeypatch.setattr(figures.plt, "close", lambda fig=None: kept.append(fig))
    yield kept
    close("all")


def _legend(fig) -> list[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def test_kept_heads_without_tuning_has_a_kept_removed_legend_and_no_colour_bar(drawn, tmp_path):
    model = build("bert")
    sites = {s.name: s for s in hp.find_sites(model)}
    first = next(iter(sites))
    figures.kept_heads_grid(sites, {first: [0, 2]}, None, tmp_path / "kept.png")
    fig = drawn[-1]
    assert _legend(fig) == ["kept", "removed"]
    assert len(fig.axes) == 1  # one kind, no colour bar axis (every kept cell is 1.0: nothing to scale)
    image = fig.axes[0].get_images()
    assert len(image) == 2  # removed cells (grey) under kept cells (one colour)
    removed = image[0].get_array()
    assert int((~removed.mask).sum()) == 2  # exactly the two removed heads are drawn as removed


def test_kept_heads_with_tuned_scales_keeps_the_colour_bar_and_marks_removed(drawn, tmp_path):
    model = build("bert")
    sites = {s.name: s for s in hp.find_sites(model)}
    first = next(iter(sites))
    kept = sites[first].num_heads - 1
    scales = {name: [0.5 + 0.1 * i for i in range(s.num_heads - (1 if name == first else 0))]
              for name, s in sites.items()}
    figures.kept_heads_grid(sites, {first: [1]}, scales, tmp_path / "kept.png")
    fig = drawn[-1]
    assert _legend(fig) == ["removed"] and len(fig.axes) == 2  # the plot and its colour bar
    low, high = fig.axes[0].get_images()[1].get_clim()
    assert (low, high) == pytest.approx((0.5, 0.5 + 0.1 * (max(s.num_heads for s in sites.values()) - 1)))
    assert kept == len(scales[first])


def test_heads_and_neurons_figure_draws_both_per_layer(drawn, tmp_path):
    rows = [{"unit": "encoder.0.self", "kind": "heads", "kept": 3, "dropped": 1},
            {"unit": "encoder.1.self", "kind": "heads", "kept": 4, "dropped": 0},
            {"unit": "encoder.0.ffn", "kind": "neurons", "kept": 20, "dropped": 12},
            {"unit": "encoder.1.ffn", "kind": "neurons", "kept": 32, "dropped": 0}]
    figures.kept_units_per_layer(rows, tmp_path / "units.png")
    fig = drawn[-1]
    heads, neurons = fig.axes
    assert heads.get_title() == "heads: 7 of 8 kept" and neurons.get_title() == "neurons: 52 of 64 kept"
    assert [p.get_height() for p in neurons.patches] == [20, 32, 12, 0]  # kept bars, then removed stacked on them
    assert _legend(fig) == ["kept", "removed", "kept", "removed"] and (tmp_path / "units.png").is_file()


def _summary(order: str, points: list[tuple[int, float, float, float]], base: float = 0.9, seeds: int = 1):
    """Curve summary rows (pruned of 10, score, ci_low, ci_high; p computed as 0.01 when the interval excludes 0)."""
    rows = []
    for pruned, score, low, high in points:
        p = 0.01 if (low > 0 or high < 0) else 0.5
        rows.append({"order": order, "fraction": pruned / 10, "pruned": pruned, "of": 10, "score": score,
                     "relative": score / base, "seeds": seeds, "std": 0.0,
                     **({"ci_low": low, "ci_high": high, "p_value": p} if pruned and seeds == 1 else
                        {"ci_low": None, "ci_high": None, "p_value": None})})
    return rows


def test_no_significant_loss_stops_at_the_first_significant_loss():
    rows = _summary("importance", [(0, 0.9, 0.0, 0.0), (2, 0.91, -0.01, 0.03), (4, 0.88, -0.05, 0.01),
                                   (6, 0.80, -0.15, -0.05), (8, 0.89, -0.03, 0.01)])
    rows += _summary("random", [(0, 0.9, 0, 0), (2, 0.7, 0, 0)], seeds=3)
    out = no_significant_loss(rows)
    assert set(out) == {"importance"}  # averaged over seeds: no per-step test
    t = out["importance"]
    assert t["share"] == 0.4 and t["first_loss"] == 0.6  # 80% is not reached: the loss at 60% ends the run
    assert t["ci_at_share"] == [-0.05, 0.01]
    assert t["relative_low_at_share"] == pytest.approx(0.85 / 0.9)  # losses this large are not excluded
    better = _summary("importance", [(0, 0.9, 0, 0), (2, 0.95, 0.02, 0.08)])  # significantly better is no loss
    assert no_significant_loss(better)["importance"]["share"] == 0.2


def test_curve_legend_names_a_band_only_where_one_is_drawn(drawn, tmp_path):
    one = _summary("random", [(0, 0.9, 0, 0), (5, 0.8, -0.2, 0.05)])
    for r in one:
        r["ci_low"] = r["ci_high"] = r["p_value"] = None  # one seed, no test: no band
    figures.pruning_curves(one, "accuracy", tmp_path / "c.png", source=None)
    assert "random (one seed)" in _legend(drawn[-1]) and not drawn[-1].axes[0].collections
    many = _summary("random", [(0, 0.9, 0, 0), (5, 0.8, 0, 0)], seeds=3)
    tested = _summary("importance", [(0, 0.9, 0, 0), (5, 0.85, -0.1, 0.02)])
    table = tmp_path / "curves_summary.csv"
    table.write_text("order\n")
    figures.pruning_curves(many + tested, "accuracy", tmp_path / "curves.png", source=table,
                           unpruned_label="unpruned, held-out text")
    labels = _legend(drawn[-1])
    assert "random (mean ± std over 3 seeds)" in labels
    assert "I_h (importance, computed once) (band: 95% interval vs unpruned)" in labels
    assert "unpruned, held-out text (90.00)" in labels
    assert len(drawn[-1].axes[0].collections) == 2  # both bands drawn
    meta = json.loads((tmp_path / "figures.json").read_text())["curves.png"]
    assert meta["labels"]["random"] == "random (mean ± std over 3 seeds)" and meta["unpruned"] == 0.9


@pytest.mark.parametrize(("estimate", "low", "high", "goal", "higher", "verdict"), [
    (0.992, 0.981, 0.999, 0.99, True, "point estimate only"),  # SST-2 99.2% whose interval reaches 98.1%
    (0.995, 0.991, 0.999, 0.99, True, "met"),
    (0.985, 0.97, 0.99, 0.99, True, "not met"),
    (36.0, 35.0, 37.5, 37.0, False, "point estimate only"),  # perplexity: the upper end must meet it
    (36.0, 35.0, 36.5, 37.0, False, "met"),
])
def test_goal_met_needs_the_intervals_worse_end(estimate, low, high, goal, higher, verdict):
    out = goal_met(estimate, low, high, goal, higher_is_better=higher)
    assert out["verdict"] == verdict and out["worse_end"] == (low if higher else high)
    assert f"{goal:g}" in out["line"]


def test_goal_met_refuses_an_estimate_outside_its_interval():
    with pytest.raises(DataError, match="outside its interval"):
        goal_met(0.5, 0.6, 0.7, 0.55)
