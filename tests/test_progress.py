"""Progress a person can trust (issue 28): a bar says how many steps there are, transformers' own bars stay quiet
inside headprune's loads and saves (and come back afterwards). The demo's labels: test_readme_walkthrough.py."""

from __future__ import annotations

import re

import pytest
from transformers.utils import logging as hf_logging

import headprune as hp
from headprune.core.quiet import transformers_bars_off
from tiny import build, inputs, labels


def test_the_importance_bar_has_a_total(capsys):
    """It read 'importance: 1batch [00:38, 38.56s/batch]': no total, no way to tell how long is left."""
    model = build("bert").eval()
    batches = []
    for seed in (1, 2, 3):
        batch = inputs("bert", seed=seed)
        batches.append({**batch, "labels": labels("bert", batch, seed=seed)})
    hp.head_importance(model, batches, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"\b3/3 \[", err), err  # n/total, as tqdm writes it when it knows the total
    assert "batch/s" in err or "s/batch" in err  # and its unit


@pytest.mark.parametrize("enabled", [True, False])
def test_transformers_bars_are_off_inside_headprune_and_restored(tmp_path, capsys, enabled):
    """'Writing model shards' (save) and 'Loading weights' (load) printed on every save_pruned / load_pruned;
    headprune turns them off for its own calls only and leaves the user's setting as it found it."""
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        model = build("bert")
        hp.prune_heads(model, {"encoder.0.self": [1]})
        hp.save_pruned(model, tmp_path / "m")
        hp.load_pruned(tmp_path / "m")
        err = capsys.readouterr().err
        assert "Writing model shards" not in err and "Loading weights" not in err, err
        assert hf_logging.is_progress_bar_enabled() is enabled
        if enabled:  # the same save outside headprune still shows transformers' bar: the switch was restored
            model.save_pretrained(tmp_path / "plain")
            assert "Writing model shards" in capsys.readouterr().err
    finally:
        hf_logging.enable_progress_bar()


def test_bars_off_is_restored_when_the_block_raises():
    hf_logging.enable_progress_bar()
    with pytest.raises(RuntimeError), transformers_bars_off():
        assert not hf_logging.is_progress_bar_enabled()
        raise RuntimeError("boom")
    assert hf_logging.is_progress_bar_enabled()


def test_the_gguf_conversion_bar_is_off_inside_headprune(tmp_path, capsys):
    """'Converting and de-quantizing GGUF tensors...' (plain tqdm inside transformers) printed on every load."""
    pytest.importorskip("gguf")
    from gguf_writer import write_llama_gguf

    file = write_llama_gguf(build("llama"), tmp_path / "tiny.gguf")
    hf_logging.enable_progress_bar()
    model = hp.load_model(file)
    err = capsys.readouterr().err
    assert "Converting and de-quantizing" not in err and "Loading weights" not in err, err
    assert hf_logging.is_progress_bar_enabled() and len(hp.find_sites(model)) == 2
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from tqdm.auto import tqdm

    assert gguf_utils.tqdm is tqdm  # transformers' own module is as it was


def test_task_batches_know_their_count_so_every_pass_shows_a_total(capsys):
    """Issue 38: `importance: 0batch [00:15, ?batch/s]` in the demo -- a task's batches were a bare generator.
    Their len is now what they yield (counted here by iterating), and the importance bar prints n/total."""
    from headprune.evaluation.lm import LanguageModelling
    from tiny import word_tokenizer

    texts = ["the cat sat on the mat and then the dog came by " * 6] * 4
    task = LanguageModelling(word_tokenizer(texts), texts, block_size=8, batch_size=3)
    for limit in (None, 5):
        assert len(task.batches(limit=limit)) == sum(1 for _ in task.batches(limit=limit))
    model = build("llama").eval()
    hp.head_importance(model, task.batches(limit=7), progress=True)
    assert re.search(r"\b3/3 \[", capsys.readouterr().err)  # 7 blocks in batches of 3
