"""A pruned model as a *stock* transformers directory, when its shape can be said in a stock config.

transformers has no per-layer head counts, but a model pruned to the same heads in every layer is
an ordinary model of its family with fewer heads: ``num_attention_heads``, ``num_key_value_heads``
and ``head_dim`` (GQA families such as Llama, Qwen2 and Mistral read ``head_dim`` from the config, so
fewer heads do not change the head size; Qwen2 reads it when present). :func:`stock_config` builds that config and accepts it
only if a model built from it (on the meta device, no memory) has exactly the pruned model's
parameter and buffer names and shapes; :func:`write_stock` saves with it and then reloads the
directory with plain ``from_pretrained`` and compares logits on real token ids (max difference <=
1e-5 of the logits' largest magnitude) before it says yes. Otherwise the caller writes headprune's
own layout (:mod:`.checkpoint`), which plain ``from_pretrained`` refuses loudly.

Not expressible: different head counts per layer, a site with no heads left, repeated key/value
heads (uneven GQA), families whose config derives the head size from ``hidden_size /
num_attention_heads`` (BERT, GPT-2, BART ...), config classes that refuse the shape (LlamaConfig checks
``hidden_size % num_attention_heads`` in recent transformers, even with ``head_dim`` set). Anything that
goes wrong while the stock form is written or reloaded is a reason too, never an error.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch
import transformers
from torch import nn

from .inputs import example_inputs
from .kept import original_heads
from .records import (
    ADDED_BIASES_KEY,
    CALLS_KEY,
    KEPT_KEY,
    LAYOUT_KEY,
    LEGACY_KEYS,
    ORIGINAL_KEY,
    config_record,
)
from .runtime import RepeatHeads
from .sites import find_sites

STOCK_KEY = "headprune_stock"  # in a stock config.json: what was pruned (transformers ignores it)
TOLERANCE = 1e-5  # of the largest logit magnitude; in half precision 4 eps of the model's dtype (see _tolerance)


def stock_config(model: nn.Module):
    """``(config, None)``: a stock config that builds exactly ``model``'s shapes, or ``(None, reason)``."""
    kept = config_record(model.config, KEPT_KEY)
    if not kept:
        return None, "the model is not pruned"
    biased = list(getattr(model.config, ADDED_BIASES_KEY, None) or [])
    if biased:
        return None, (f"the output projections of {', '.join(biased[:3])}{' ...' if len(biased) > 3 else ''} have "
                      "biases (bias compensation) that a stock config of the family does not describe")
    sites = find_sites(model)
    original = original_heads(model)
    if len(sites) != len(original):
        return None, f"{len(original) - len(sites)} site(s) lost every head"
    counts = {(s.num_heads, s.num_kv_heads, s.head_dim) for s in sites}
    if len(counts) != 1:
        return None, "the sites keep different numbers of heads"
    if any(isinstance(m, RepeatHeads) for s in sites for m in (s.k.module, s.v.module)):
        return None, "key/value heads are repeated (query heads kept unevenly across key/value groups)"
    (heads, kv_heads, head_dim), = counts
    config = copy.deepcopy(model.config)
    record = {"kept_heads": kept, "original_heads": original}
    for key in (KEPT_KEY, ORIGINAL_KEY, *LEGACY_KEYS.values(), LAYOUT_KEY, CALLS_KEY):
        if hasattr(config, key):
            delattr(config, key)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = heads, kv_heads, head_dim
    setattr(config, STOCK_KEY, record)
    cls = _base_class(model)
    try:
        type(config).from_dict(config.to_dict())  # what from_pretrained will do: validated on the way in
        with torch.device("meta"):
            fresh = cls(copy.deepcopy(config))
    except Exception as e:  # a config the family cannot hold or build: not expressible
        return None, (f"a stock {type(config).__name__} cannot say {heads} heads of size {head_dim} "
                      f"({type(e).__name__}: {_first_line(e)})")
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
    if want != got:
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        return None, (f"a stock {cls.__name__} with {heads} heads has other shapes ({', '.join(diff[:3])} ...): its "
                      "family does not read head_dim from the config")
    return config, None


def write_stock(model: nn.Module, directory: Path) -> tuple[str | None, bool]:
    """Save ``model`` into the empty ``directory`` with its stock config and check that plain
    ``from_pretrained`` rebuilds it exactly. Returns ``(None, True)`` on success, else ``(reason, tried)``
    (``directory`` emptied; ``tried``: a stock config was built, so the failure was in writing or reloading).
    Never raises for the model's sake: any failure to build, write or reload the stock form is a reason
    (e.g. a config class that validates ``hidden_size % num_attention_heads``). ``model`` is not changed."""
    try:
        config, reason = stock_config(model)
        if config is None:
            return reason, False
        reason = _write_and_check(model, config, directory)
    except Exception as e:  # whatever transformers refuses, the caller falls back to headprune's layout
        reason = f"the stock form could not be written ({type(e).__name__}: {_first_line(e)})"
    if reason is not None:
        for child in directory.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    return reason, True


def _write_and_check(model: nn.Module, config, directory: Path) -> str | None:
    saved = model.config
    try:
        model.config = config
        model.save_pretrained(directory)
    finally:
        model.config = saved
    attn = getattr(saved, "_attn_implementation", None)
    file = directory / "config.json"
    raw = json.loads(file.read_text(encoding="utf-8"))
    if isinstance(attn, str):
        raw["attn_implementation"] = attn
    file.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return _check_reload(model, directory)


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())  # huggingface_hub's validation errors span lines
    return text[:300]


def _check_reload(model: nn.Module, directory: Path) -> str | None:
    cls = _base_class(model)
    param = next(model.parameters())
    try:
        plain = getattr(transformers, cls.__name__, cls).from_pretrained(
            directory, dtype=param.dtype, local_files_only=True).eval()
    except Exception as e:  # any failure means: not loadable without headprune
        return f"plain from_pretrained failed ({type(e).__name__}: {_first_line(e)})"
    plain.to(param.device)  # compared on the model's own device: the same kernels, and inputs on one device
    x = {k: v.to(param.device) if torch.is_tensor(v) else v for k, v in example_inputs(model, 2, 8).items()}
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            want = model(**x)[0].float().cpu()
            got = plain(**x)[0].float().cpu()
    finally:
        model.train(was_training)
        del plain
    scale = float(want.abs().max()) or 1.0
    err = float((got - want).abs().max())
    if not err <= _tolerance(param.dtype) * scale:
        return f"plain from_pretrained computes other outputs (max difference {err:.3g}, {err / scale:.2g} relative)"
    return None


def _tolerance(dtype: torch.dtype) -> float:
    """Relative to the largest logit. A half-precision model cast with ``.to(dtype)`` keeps buffers such as
    rotary ``inv_freq`` in that dtype, where ``from_pretrained`` rebuilds them in float32: its logits
    differ by about one eps of the dtype (bfloat16: 0.4% seen), so the bound there is 4 eps."""
    return max(TOLERANCE, 4 * torch.finfo(dtype).eps) if dtype.is_floating_point and dtype.itemsize <= 2 else TOLERANCE


def _base_class(model: nn.Module) -> type:
    return getattr(type(model), "_hp_base", type(model))
