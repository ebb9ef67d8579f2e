"""``importance --checkpoint-blocks`` and ``ablate/all-but-one --prefix-cache stream``: same results, less memory."""

from __future__ import annotations

import csv
import json
import random

import pytest
from typer.testing import CliRunner

import headprune as hp
from headprune.cli import app
from tiny import build, word_tokenizer

runner = CliRunner()
WORDS = "the a good bad film plot actor slow fun dull great awful story ending music".split()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("large_flags")
    rng = random.Random(0)
    lines = ["sentence\tlabel"] + [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + f"\t{rng.randint(0, 2)}"
                                   for _ in range(12)]
    (root / "data.tsv").write_text("\n".join(lines) + "\n")
    hp.save_pruned(build("bert"), root / "model", tokenizer=word_tokenizer(WORDS))
    return root, ["--task", "classification", "--data", str(root / "data.tsv")]


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_importance_checkpoint_blocks_gives_the_same_scores(setup):
    root, data = setup
    for name, extra in (("plain", []), ("ckpt", ["--checkpoint-blocks"])):
        result = runner.invoke(app, ["importance", str(root / "model"), *data, "--normalize", "none", *extra,
                                     "-o", str(root / name)])
        assert result.exit_code == 0, result.output
    plain, ckpt = (json.loads((root / n / "importance.json").read_text())["scores"] for n in ("plain", "ckpt"))
    assert plain.keys() == ckpt.keys()
    for site, ref in plain.items():
        scale = max(abs(v) for v in ref)
        assert scale > 0 and max(abs(a - b) for a, b in zip(ckpt[site], ref, strict=True)) <= 1e-5 * scale, site


@pytest.mark.parametrize("command, table", [("ablate", "ablation.csv"), ("all-but-one", "all_but_one.csv")])
def test_streamed_prefix_cache_gives_the_same_table(setup, command, table):
    root, data = setup
    tables = {}
    for mode in ("full", "stream"):
        out = root / f"{command}-{mode}"
        result = runner.invoke(app, [command, str(root / "model"), *data, "--prefix-cache", mode,
                                     "-o", str(out)])
        assert result.exit_code == 0, result.output
        tables[mode] = _rows(out / table)
    assert tables["stream"] == tables["full"] and len(tables["full"]) > 1


def test_bad_prefix_cache_exits_2_and_writes_nothing(setup):
    root, data = setup
    result = runner.invoke(app, ["ablate", str(root / "model"), *data, "--prefix-cache", "some", "-o", str(root / "x")])
    assert result.exit_code == 2 and "--prefix-cache 'some'" in result.output and "full, stream, off" in result.output
    assert not (root / "x").exists()
