"""Every LM window starts with the model's prefix token, as lm-evaluation-harness starts its rolling windows:
the BOS id, else the EOS id (issue #47). Checked against a hand computation with that rule and the model's own
``.loss``, on a tiny model of every decoder family the families table calls exact."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

import headprune as hp
from headprune.errors import ConfigError
from headprune.evaluation.build import EvalOptions, TaskData, build_task
from headprune.evaluation.data import load_text
from headprune.evaluation.lm import LanguageModelling, prefix_token_id
from tiny import word_tokenizer

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("families", ROOT / "benchmarks" / "families.py")
families = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("families", families)
_spec.loader.exec_module(families)

ROWS = json.loads(families.RESULTS.read_text())["families"]
INSTALLED = set(families.tiny_configs.model_types())
# decoder families: the causal-LM class of a type the committed table calls exact (installed here)
DECODERS = sorted(r["model_type"] for r in ROWS if r["verdict"] == "exact" and (r["class"] or "").endswith(
    "ForCausalLM") and r["model_type"] in INSTALLED)
TEXTS = ["the cat sat on the mat and the dog sat on the log", "a bird in the hand is worth two in the bush",
         "the quick brown fox jumps over the lazy dog near the river bank"]
BLOCK, BLOCKS = 8, 3


def _hand_perplexity(model, tok, texts, first: int) -> float:
    """exp(mean NLL) over windows built here by the rule: [first] + the next BLOCK - 1 text tokens (texts joined,
    each followed by EOS), the NLL from the model's own ``.loss`` (mean over the window's predicted tokens)."""
    ids: list[int] = []
    for text in texts:
        ids += [tok.convert_tokens_to_ids(w) for w in text.split()] + [tok.eos_token_id]
    width = BLOCK - 1
    total = 0.0
    for i in range(BLOCKS):
        window = torch.tensor([[first] + ids[i * width:(i + 1) * width]])
        with torch.no_grad():
            total += float(model(input_ids=window, labels=window).loss.double()) * width
    return math.exp(total / (BLOCKS * width))


def test_decoder_families_are_listed():
    named = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "granite"}  # the issue's
    assert named & INSTALLED <= set(DECODERS) and len(DECODERS) >= 50


@pytest.mark.parametrize("model_type", DECODERS)
def test_perplexity_equals_hand_computation_with_bos(model_type):
    _, _, model = families.build(model_type, build_limit=600.0)  # a slow build on a busy machine is no failure
    tok = word_tokenizer(TEXTS)
    task = LanguageModelling(tok, TEXTS, block_size=BLOCK, batch_size=2, max_blocks=BLOCKS)
    assert task.signature["prefix_token"] == tok.bos_token_id == 1
    assert bool((task.blocks[:, 0] == 1).all())
    got = task.evaluate(model).score
    want = _hand_perplexity(model, tok, TEXTS, tok.bos_token_id)
    assert abs(got - want) <= 1e-5 * want, (model_type, got, want)


def test_prefix_is_eos_without_bos_and_can_be_turned_off():
    model = hp_tiny_llama()
    tok = word_tokenizer(TEXTS)
    tok.bos_token = None
    assert tok.bos_token_id is None and prefix_token_id(tok) == tok.eos_token_id == 2
    task = LanguageModelling(tok, TEXTS, block_size=BLOCK, batch_size=2, max_blocks=BLOCKS)
    assert task.signature["prefix_token"] == 2
    want = _hand_perplexity(model, tok, TEXTS, tok.eos_token_id)
    got = task.evaluate(model).score
    assert abs(got - want) <= 1e-5 * want
    plain = LanguageModelling(tok, TEXTS, block_size=BLOCK, batch_size=2, max_blocks=BLOCKS, prefix=False)
    assert plain.signature["prefix_token"] is None and int(plain.blocks[0, 0]) != 2
    assert abs(plain.evaluate(model).score - want) > 1e-3 * want  # another number: the switch does something


def test_no_prefix_token_refused_in_one_line():
    tok = word_tokenizer(TEXTS)
    tok.bos_token, tok.eos_token = None, None
    with pytest.raises(ConfigError, match="neither bos_token_id nor eos_token_id.*--no-prefix-token"):
        LanguageModelling(tok, TEXTS, block_size=BLOCK)
    with pytest.raises(ConfigError, match="prefix=.*'yes'"):
        LanguageModelling(word_tokenizer(TEXTS), TEXTS, block_size=BLOCK, prefix="yes")
    with pytest.raises(ConfigError, match="applies to --task lm only"):
        build_task("classification", word_tokenizer(TEXTS), None, TaskData("x.tsv"), EvalOptions(prefix=False))


def test_cli_records_the_prefix_token(tmp_path):
    """``headprune evaluate --task lm`` starts windows with BOS (signature ``prefix_token``), and
    ``--no-prefix-token`` records None and gives the plain-window number."""
    from typer.testing import CliRunner

    from headprune.cli import app

    model, tok = hp_tiny_llama(), word_tokenizer(TEXTS * 20)
    hp.save_pruned(model, tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    data = tmp_path / "t.txt"
    data.write_text("\n\n".join(TEXTS * 20))
    out = {}
    for flag in ("--prefix-token", "--no-prefix-token"):  # the default, and the switch
        res = CliRunner().invoke(app, ["evaluate", str(tmp_path / "m"), "--task", "lm", "--data", str(data),
                                       "--block-size", "8", "--limit", "6", "--json",
                                       *([flag] if flag == "--no-prefix-token" else [])])
        assert res.exit_code == 0, res.output
        out[flag] = json.loads(res.stdout)
    assert out["--prefix-token"]["signature"]["prefix_token"] == 1
    assert out["--no-prefix-token"]["signature"]["prefix_token"] is None
    task = LanguageModelling(tok, load_text(data), block_size=8, max_blocks=6)  # the file's paragraphs
    want = task.evaluate(hp.load_pruned(tmp_path / "m")).score
    assert abs(out["--prefix-token"]["score"] - want) <= 1e-6 * want


def hp_tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(4.0)  # logits that differ clearly between contexts
    return model
