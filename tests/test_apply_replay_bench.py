"""benchmarks/apply_replay.py's comparison: two saved models are bit for bit equal only when every tensor and the
config are (one tensor moved by one ulp, or a config value, is found and named); the configurations' CLI flags
name every setting the configuration holds."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("apply_replay", ROOT / "benchmarks" / "apply_replay.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _folder(path: Path, tensors: dict, config: dict) -> Path:
    path.mkdir()
    save_file(tensors, str(path / "pruned.safetensors"))
    save_file({"x": torch.ones(1)}, str(path / "plan.safetensors"))  # a plan beside the model is not the model
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_compare_finds_one_ulp_and_a_config_value(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(4, 3, generator=g), "b.bias": torch.randn(5, generator=g)}
    config = {"hidden_size": 8}
    a = _folder(tmp_path / "a", tensors, config)
    assert bench.compare(a, _folder(tmp_path / "same", {k: v.clone() for k, v in tensors.items()}, config)) == {
        "tensors": 2, "same_names": True, "unequal": [], "config_equal": True, "bit_for_bit": True}
    moved = {k: v.clone() for k, v in tensors.items()}
    moved["b.bias"][2] = torch.nextafter(moved["b.bias"][2], torch.tensor(math.inf))
    got = bench.compare(a, _folder(tmp_path / "ulp", moved, config))
    assert got["unequal"] == ["b.bias"] and not got["bit_for_bit"]
    got = bench.compare(a, _folder(tmp_path / "cfg", tensors, {"hidden_size": 9}))
    assert not got["config_equal"] and not got["bit_for_bit"]
    assert set(load_file(str(a / "plan.safetensors"))) == {"x"}


def test_every_configuration_becomes_flags_for_each_of_its_settings():
    for name, config in bench.CONFIGURATIONS.items():
        flags = bench.cli_flags(name)
        assert flags[::2] == [bench.FLAGS[k] for k in config], name
        assert "+" not in flags[flags.index("--compensate") + 1]
