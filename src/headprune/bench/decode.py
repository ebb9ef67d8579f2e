"""Decode throughput: tokens/s of ``generate`` with a key/value cache, and the cache it fills.

Every model gets the same random prompt (``[batch, prompt_len]`` token ids) and generates exactly
``new_tokens`` tokens greedily (``min_new_tokens = max_new_tokens``, cache on), so the work per call
is the same whatever the model predicts. Rounds alternate the models (A B, B A, ...) as the forward
benchmark does (:mod:`.timing`); tokens/s is ``batch * new_tokens`` over the median round time, and the
speed-up is the median of the paired ratios reference time / model time. ``cache_bytes`` is measured
on the cache ``generate`` returns (every key and value tensor), beside the counter's
:func:`headprune.core.model.kvcache.kv_cache_bytes` per token.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping

import torch
from torch import nn

from ..checks import check_int
from ..core.model.inputs import example_inputs, unwrap
from ..core.model.kvcache import kv_cache_bytes
from ..errors import ConfigError


def decode_benchmark(models: Mapping[str, nn.Module], *, prompt_len: int = 128, new_tokens: int = 128,
                     batch_size: int = 1, repeats: int = 3, warmup: int = 1, seed: int = 0,
                     reference: str | None = None) -> dict:
    """{"settings", "models": {name: tokens/s, quartiles, cache bytes}, "speedups": [{model, reference, measured}]}
    for models that generate (decoder-only or encoder-decoder); ``reference`` defaults to the first."""
    check_int("prompt_len", prompt_len, 1)
    check_int("new_tokens", new_tokens, 1)
    check_int("batch_size", batch_size, 1)
    check_int("repeats", repeats, 1)
    check_int("warmup", warmup, 0)
    if not isinstance(models, Mapping) or not models:
        raise ConfigError("models: expected a non-empty mapping name -> model")
    names = list(models)
    reference = names[0] if reference is None else reference
    if reference not in names:
        raise ConfigError(f"reference={reference!r}; allowed: one of {names}")
    check_decodable(models, prompt_len, new_tokens)
    prompts = {}
    for name, model in models.items():
        x = example_inputs(unwrap(model), batch_size, prompt_len, seed=seed)
        prompts[name] = {k: v for k, v in x.items() if k in ("input_ids", "attention_mask")}
    times: dict[str, list[float]] = {n: [] for n in names}
    caches: dict[str, int] = {}
    modes = {n: m.training for n, m in models.items()}
    try:
        for m in models.values():
            m.eval()
        for _ in range(warmup):
            for n in names:
                _generate(models[n], prompts[n], new_tokens)
        for r in range(repeats):
            for n in (names if r % 2 == 0 else names[::-1]):
                seconds, cache = _generate(models[n], prompts[n], new_tokens)
                times[n].append(seconds)
                caches[n] = cache
    finally:
        for n, m in models.items():
            m.train(modes[n])
    out = {}
    for n in names:
        t = times[n]
        q = statistics.quantiles(t, n=4, method="inclusive") if len(t) > 1 else [t[0], t[0], t[0]]
        kv = kv_cache_bytes(unwrap(models[n]))
        out[n] = {"tokens_per_s": batch_size * new_tokens / statistics.median(t),
                  "tokens_per_s_q25": batch_size * new_tokens / q[2], "tokens_per_s_q75": batch_size * new_tokens / q[0],
                  "seconds": t, "cache_bytes_measured": caches[n], "kv_cache_bytes_per_token": kv["per_token"],
                  "kv_cache_bytes_per_sequence": kv["per_token"] * (prompt_len + new_tokens)
                  + kv["per_source_token"] * prompt_len}
    speedups = []
    for n in names:
        if n == reference:
            continue
        paired = [a / b for a, b in zip(times[reference], times[n], strict=True)]
        speedups.append({"model": n, "reference": reference, "measured": statistics.median(paired),
                         "paired": paired,
                         "kv_cache_ratio": out[n]["kv_cache_bytes_per_token"] / max(out[reference]["kv_cache_bytes_per_token"], 1)})
    settings = {"prompt_len": prompt_len, "new_tokens": new_tokens, "batch_size": batch_size, "repeats": repeats,
                "warmup": warmup, "seed": seed, "reference": reference, "greedy": True, "cache": True}
    return {"settings": settings, "models": out, "speedups": speedups}


def check_decodable(models: Mapping[str, nn.Module], prompt_len: int, new_tokens: int) -> None:
    """Refuse a model that does not generate, or whose positions cannot hold the prompt and the new tokens."""
    for name, model in models.items():
        eager = unwrap(model)
        if not (hasattr(eager, "generate") and eager.can_generate()):
            raise ConfigError(f"decode: model {name!r} ({type(eager).__name__}) does not generate text; allowed: a "
                              "decoder-only or encoder-decoder language model")
        limit = getattr(eager.config, "max_position_embeddings", None) or getattr(eager.config, "n_positions", None)
        if limit and not eager.config.is_encoder_decoder and prompt_len + new_tokens > limit:
            raise ConfigError(f"prompt_len={prompt_len} + new_tokens={new_tokens} > the {limit} positions of {name!r}; "
                              "allowed: a shorter prompt or fewer new tokens")


def decode_table(result: dict) -> str:
    """Plain-text table: tokens/s (IQR), KV cache per token and per sequence, speed-up."""
    s = result["settings"]
    w = max([22] + [len(name) for name in result["models"]])  # a long name keeps the columns aligned
    head = f"{'model':<{w}} {'tokens/s':>9} {'IQR':>15} {'KV B/token':>11} {'KV MB/seq':>10} {'speed-up':>9}"
    ups = {u["model"]: u for u in result["speedups"]}
    lines = [f"decode: prompt {s['prompt_len']} + {s['new_tokens']} new tokens, batch {s['batch_size']}, greedy, "
             f"with a cache", head, "-" * len(head)]
    for name, r in result["models"].items():
        up = f"{ups[name]['measured']:>8.3f}x" if name in ups else f"{'-':>9}"
        lines.append(f"{name:<{w}} {r['tokens_per_s']:>9.1f} {r['tokens_per_s_q25']:>7.1f}-{r['tokens_per_s_q75']:<7.1f} "
                     f"{r['kv_cache_bytes_per_token']:>11,} {r['kv_cache_bytes_per_sequence'] / 1e6:>10.3f} {up}")
    return "\n".join(lines)


def cache_bytes(cache) -> int:
    """Bytes of every key and value tensor a transformers cache holds (self- and cross-attention)."""
    total = 0
    for part in (getattr(cache, "self_attention_cache", None), getattr(cache, "cross_attention_cache", None)) \
            if hasattr(cache, "self_attention_cache") else (cache,):
        for layer in getattr(part, "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
    return total


def _generate(model: nn.Module, prompt: dict, new_tokens: int) -> tuple[float, int]:
    config = unwrap(model).config
    pad = config.pad_token_id if config.pad_token_id is not None else (config.eos_token_id or 0)
    if isinstance(pad, list):
        pad = pad[0]
    with torch.inference_mode():
        start = time.perf_counter()
        out = model.generate(**prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             use_cache=True, pad_token_id=pad, return_dict_in_generate=True)
        seconds = time.perf_counter() - start
    return seconds, cache_bytes(generated_cache(out))


def generated_cache(out):
    """The cache ``generate`` returned, under the key the output holds: ``cache`` (newer transformers, where
    ``past_key_values`` is a deprecated alias) or ``past_key_values`` (older); looked up by the output's own
    keys, so neither version warns. None when it holds neither."""
    keys = list(out.keys())
    name = next((k for k in ("cache", "past_key_values") if k in keys), None)
    return None if name is None else out[name]
