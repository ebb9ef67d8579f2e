"""Methods own their settings (issue #48): each scorer and compensation is a class whose fields are its settings,
validated by itself in one line naming the field; a variant is a setting of one class; ``PruneSettings`` holds
the pipeline's settings and the method objects, and writes them as specs (a name, or a table of the settings a
method changes) that build the same settings again.

The reference for "the same result": the committed hashes of ``compress_unchanged.json``, recorded from the code
in which these knobs were ``PruneSettings`` fields (``damping=0.3``, ``step_damping=0.3`` ...); here the same
configurations are written as method objects, spec tables and a TOML file, and must give those weights bit for
bit."""

from __future__ import annotations

import json
import re

import pytest
import torch

from headprune.compression import Bias, Distill, Linear, PruneSettings, Rearrange, Reconstruct, Tune, compress
from headprune.compression.compensation import compensation_names, get_compensations
from headprune.errors import ConfigError
from headprune.scoring.registry import get_scorer
from headprune.scoring.scorers import FluctuationScorer
from llm_tiny import tiny_decoder
from test_compress_unchanged import BUDGET, FIXTURE, _batches, settings_for, state_hash


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Tune(damping=-1.0), "damping=-1.0; allowed"),
    (lambda: Tune(max_scale=0.0), "max_scale=0.0; allowed"),
    (lambda: Tune(target="input"), "target='input'; allowed: residual, output"),
    (lambda: Reconstruct(damping=float("nan")), "damping=nan; allowed"),
    (lambda: Reconstruct(target="input"), "target='input'; allowed: residual, output"),
    (lambda: Linear(variant="quadratic"), "variant='quadratic'; allowed: linear, linear-seq, obs-seq"),
    (lambda: Linear(damping=-0.5), "damping=-0.5; allowed"),
    (lambda: Distill(epochs=0), "epochs=0; allowed: an integer >= 1"),
    (lambda: Distill(lr=0.0), "lr=0.0; allowed"),
    (lambda: FluctuationScorer(standardise="yes"), "standardise='yes'; allowed: True"),
])
def test_each_method_refuses_a_bad_value_of_its_own_field_in_one_line(make, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        make()
    assert "\n" not in str(err.value)


def test_a_spec_table_is_checked_by_the_method_it_names():
    with pytest.raises(ConfigError, match=re.escape("damping=-1; allowed")):
        PruneSettings(units="both", share=0.5, compensate=[{"name": "linear", "damping": -1}])
    with pytest.raises(ConfigError, match="linear has no setting max_scale; allowed: variant, damping"):
        PruneSettings(units="both", share=0.5, compensate=[{"name": "linear", "max_scale": 5.0}])
    with pytest.raises(ConfigError, match="a table with name = "):
        PruneSettings(units="both", share=0.5, compensate=[{"damping": 0.3}])
    assert get_scorer({"name": "fluctuation", "standardise": False}).name == "fluctuation-raw"


def test_the_settings_moved_onto_the_methods_are_not_pipeline_fields(tmp_path):
    with pytest.raises(TypeError, match="damping"):
        PruneSettings(share=0.5, damping=0.3)  # type: ignore[call-arg]
    path = tmp_path / "old.toml"
    path.write_text('[settings]\nshare = 0.5\ndamping = 0.3\n')
    with pytest.raises(ConfigError, match=re.escape("unknown keys ['damping']")):
        PruneSettings.from_toml(path)


def test_variants_are_settings_of_one_class():
    linears = get_compensations(["linear", "linear-seq", "obs-seq"])
    assert {type(c) for c in linears} == {Linear}
    assert [c.name for c in linears] == ["linear", "linear-seq", "obs-seq"]
    assert [(c.sequential, c.reselect) for c in linears] == [(False, False), (True, False), (True, True)]
    assert type(get_scorer("fluctuation")) is type(get_scorer("fluctuation-raw")) is FluctuationScorer
    # every built-in name is a default-configured object; no other classes than these
    classes = {type(c) for c in get_compensations([n for n in compensation_names()])}
    assert classes == {Rearrange, Tune, Reconstruct, Bias, Linear, Distill}


def test_specs_are_names_unless_a_setting_differs_and_build_the_same_settings(tmp_path):
    settings = PruneSettings(units="both", share=0.5, price="params",
                             compensate=[Linear(variant="obs-seq", damping=0.05), "reconstruct",
                                         Distill(epochs=2, lr=1e-4)],
                             steps=2, step_standin=Linear(damping=0.3))
    d = settings.to_dict()
    assert d["compensate"] == [{"name": "obs-seq", "damping": 0.05}, "reconstruct",
                               {"name": "distill", "epochs": 2, "lr": 1e-4}]
    assert d["step_standin"] == {"name": "linear", "damping": 0.3} and d["scores"] == "fisher"
    assert "damping" not in d and "distill_epochs" not in d
    assert json.loads(json.dumps(d)) == d
    assert PruneSettings(**d).to_dict() == d
    path = tmp_path / "compress.toml"
    path.write_text(settings.to_toml())
    assert 'compensate = [{name = "obs-seq", damping = 0.05}, "reconstruct"' in path.read_text()
    again = PruneSettings.from_toml(path)
    assert again.to_dict() == d and again.compensations == settings.compensations


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# configuration of compress_unchanged.json -> the same as method objects / spec tables, no flat knob
AS_OBJECTS = {
    "headprune-fisher+linear": dict(compensate=[Linear(damping=0.3)]),
    "headprune-fluctuation+linear": dict(scores="fluctuation", compensate=[{"name": "linear", "damping": 0.3}]),
    "headprune-fisher+linear-2steps+obs-seq": dict(compensate=[Linear(variant="obs-seq", damping=0.01)], steps=2,
                                                   step_standin={"name": "linear", "damping": 0.3},
                                                   score_batches=[2, 1]),
}


@pytest.mark.parametrize("name", list(AS_OBJECTS))
def test_method_objects_give_the_committed_weights_of_the_field_based_settings(one_thread, tmp_path, name):
    """Written as objects (and through a TOML file), the configuration gives the weights the code with the knobs
    on ``PruneSettings`` gave (``compress_unchanged.json``)."""
    torch.manual_seed(0)
    model = tiny_decoder("llama", layers=3, seed=0)
    share = settings_for(name, model, BUDGET).share
    settings = PruneSettings(units="both", price="params", share=share, **{"scores": "fisher", **AS_OBJECTS[name]})
    path = tmp_path / "s.toml"
    path.write_text(settings.to_toml())
    expected = json.loads(FIXTURE.read_text())[name]
    for given in (settings, PruneSettings.from_toml(path)):
        assert state_hash(compress(model, _batches(), given).model) == expected, name


@pytest.mark.parametrize(("flags", "message"), [
    (["--compensate", "linear", "--max-scale", "5"], "--max-scale 5.0 with --compensate linear: no method given has"),
    (["--compensate", "bias", "--steps", "2", "--step-standin", "bias", "--step-damping", "0.3"],
     "--step-damping 0.3 with --compensate bias --step-standin bias: no method given has"),
    (["--compensate", "linear", "--step-damping", "0.3"], "--step-damping 0.3 without --step-standin"),
    (["--compensate", "linear", "--damping", "-1"], "--damping -1.0; allowed"),
    (["--compensate", "linear", "--steps", "2", "--step-standin", "linear", "--step-damping", "-1"],
     "--step-damping -1.0; allowed"),
    (["--compensate", "reconstruct", "--distill-epochs", "-1"], "--distill-epochs -1; allowed: an integer >= 1"),
    (["--compensate", "reconstruct", "--distill-lr", "1e-4"], "--distill-lr 0.0001 without --distill-epochs"),
])
def test_the_cli_method_flags_set_the_methods_and_are_refused_by_flag_name(tmp_path, flags, message):
    """The flags build the method objects before anything is read: a flag no method given has, or a bad value,
    is refused in the flag's words."""
    from typer.testing import CliRunner

    from headprune.cli import app

    result = CliRunner().invoke(app, ["compress", str(tmp_path / "model"), "--task", "lm", "--data",
                                      str(tmp_path / "text.txt"), "--units", "both", "--share", "0.5", *flags, "-o",
                                      str(tmp_path / "out")], terminal_width=400, env={"COLUMNS": "400"})
    assert result.exit_code != 0
    assert message in " ".join(result.output.split()), result.output
    assert not (tmp_path / "out").exists()
