"""A pruned model as a *stock* transformers directory, when its shape can be said in a stock config.

transformers has no per-layer head counts, but a model pruned to the same heads in every layer (and, where
FFN neurons went, the same FFN width in every layer: the config's ``intermediate_size`` or its family's name for
it, :attr:`.families.Family.ffn_keys`) is an ordinary model of its family with fewer heads: ``num_attention_heads``, ``num_key_value_heads``
and ``head_dim`` (GQA families such as Llama, Qwen2 and Mistral read ``head_dim`` from the config, so
fewer heads do not change the head size; Qwen2 reads it when present). :func:`stock_config` builds that config and accepts it
only if a model built from it (on the meta device, no memory) has exactly the pruned model's
parameter and buffer names and shapes; :func:`write_stock` saves with it and then reloads the
directory with plain ``from_pretrained`` and compares logits on real token ids (max difference <=
1e-5 of the logits' largest magnitude) before it says yes. Otherwise the caller writes headprune's
own layout (:mod:`.checkpoint`), which plain ``from_pretrained`` refuses loudly.

Not expressible: different head counts or FFN widths per layer, a site with no heads left, repeated key/value
heads (uneven GQA), families whose config derives the head size from ``hidden_size /
num_attention_heads`` (BERT, GPT-2, BART ...), config classes that refuse the shape (LlamaConfig checks
``hidden_size % num_attention_heads`` in recent transformers, even with ``head_dim`` set) -- unless an
equivalent architecture of another family (:func:`equivalent_configs`: Mistral for a Llama without biases
or sliding window) builds the same parameters and, saved and reloaded with its Auto class, computes the
same logits. Anything that goes wrong while the stock form is written or reloaded is a reason too, never
an error.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import torch
import transformers
from torch import nn

from ..model.families import ffn_keys, stock_targets
from ..model.ffn import find_ffns
from ..model.inputs import example_inputs
from ..model.kept import original_heads, original_neurons
from ..model.records import (
    ADDED_BIASES_KEY,
    CALLS_KEY,
    KEPT_KEY,
    KEPT_NEURONS_KEY,
    LAYOUT_KEY,
    LEGACY_KEYS,
    ORIGINAL_KEY,
    ORIGINAL_NEURONS_KEY,
    config_record,
)
from ..model.runtime import RepeatHeads
from ..model.sites import find_sites

STOCK_KEY = "headprune_stock"  # in a stock config.json: what was pruned (transformers ignores it)
TOLERANCE = 1e-5  # of the largest logit magnitude; in half precision 4 eps of the model's dtype (see _tolerance)


def stock_config(model: nn.Module):
    """``(config, None)``: a stock config of ``model``'s own family that builds exactly its shapes, or
    ``(None, reason)``."""
    config, reason, _ = _family_config(model)
    return config, reason


def _family_config(model: nn.Module):
    """(config, None, False) as :func:`stock_config`; (None, reason, refused): ``refused`` when the shape is
    one stock layout but the family's own config class refuses or cannot build it (another may)."""
    kept = config_record(model.config, KEPT_KEY)
    if not kept:
        return None, "the model is not pruned", False
    biased = list(getattr(model.config, ADDED_BIASES_KEY, None) or [])
    if biased:
        return None, (f"the output projections of {', '.join(biased[:3])}{' ...' if len(biased) > 3 else ''} have "
                      "biases (bias compensation) that a stock config of the family does not describe"), False
    sites = find_sites(model)
    original = original_heads(model)
    if len(sites) != len(original):
        return None, f"{len(original) - len(sites)} site(s) lost every head", False
    counts = {(s.num_heads, s.num_kv_heads, s.head_dim) for s in sites}
    if len(counts) != 1:
        return None, "the sites keep different numbers of heads", False
    if any(isinstance(m, RepeatHeads) for s in sites for m in (s.k.module, s.v.module)):
        return None, "key/value heads are repeated (query heads kept unevenly across key/value groups)", False
    widths = {f.width for f in find_ffns(model, skip_moe=True)}
    if len(widths) > 1:
        return None, "the FFNs keep different numbers of neurons", False
    config = _stock_source(model)
    reason = _builds(model, _base_class(model), config)
    return (config, None, False) if reason is None else (None, reason, reason.startswith(REFUSED))


REFUSED = "a stock config refuses the shape"  # the start of a reason another family's config may not have


def _builds(model: nn.Module, cls: type, config) -> str | None:
    """None when ``config`` validates as from_pretrained will validate it and ``cls`` built from it (on the meta
    device) has exactly ``model``'s parameter and buffer names and shapes; else why not."""
    try:
        type(config).from_dict(config.to_dict())  # what from_pretrained will do: validated on the way in
        with torch.device("meta"):
            fresh = cls(copy.deepcopy(config))
    except Exception as e:  # a config the family cannot hold or build: not expressible
        return (f"{REFUSED}: a stock {type(config).__name__} cannot say {config.num_attention_heads} heads of size "
                f"{config.head_dim} ({type(e).__name__}: {_first_line(e)})")
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
    if want != got:
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        return (f"a stock {cls.__name__} with {config.num_attention_heads} heads of size {config.head_dim} has other "
                f"shapes ({', '.join(diff[:3])} ...)")
    return None


def write_stock(model: nn.Module, directory: Path) -> tuple[str | None, bool]:
    """Save ``model`` into the empty ``directory`` with its stock config and check that plain
    ``from_pretrained`` rebuilds it exactly. Returns ``(None, True)`` on success, else ``(reason, tried)``
    (``directory`` emptied; ``tried``: a stock config was built, so the failure was in writing or reloading).
    When the family's own config refuses the shape, an equivalent architecture of another
    family is tried the same way (saved, reloaded with the Auto class, logits compared).
    Never raises for the model's sake: any failure to build, write or reload the stock form is a reason
    (e.g. a config class that validates ``hidden_size % num_attention_heads``). ``model`` is not changed."""
    tried = False
    try:
        config, reason, refused = _family_config(model)
        if config is not None:
            tried = True
            reason = _write_and_check(model, config, directory, _base_class(model))
        elif refused:
            reasons = [reason]
            for alt, auto in equivalent_configs(model):
                tried = True
                why = _write_and_check(model, alt, directory, auto)
                if why is None:
                    return None, True
                reasons.append(f"as {alt.model_type}: {why}")
                _empty(directory)
            reason = "; ".join(reasons)
    except Exception as e:  # whatever transformers refuses, the caller falls back to headprune's layout
        reason, tried = f"the stock form could not be written ({type(e).__name__}: {_first_line(e)})", True
    if reason is not None:
        _empty(directory)
    return reason, tried


def _stock_source(model: nn.Module):
    """The family config with the pruned shape and the stock record, unvalidated: what another family translates."""
    config = copy.deepcopy(model.config)
    for key in (KEPT_KEY, ORIGINAL_KEY, *LEGACY_KEYS.values(), LAYOUT_KEY, CALLS_KEY, KEPT_NEURONS_KEY,
                ORIGINAL_NEURONS_KEY):
        if hasattr(config, key):
            delattr(config, key)
    site = find_sites(model)[0]
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = (site.num_heads, site.num_kv_heads,
                                                                               site.head_dim)
    record = {"kept_heads": config_record(model.config, KEPT_KEY), "original_heads": original_heads(model)}
    kept_n = config_record(model.config, KEPT_NEURONS_KEY)
    ffns = find_ffns(model, skip_moe=True)
    if kept_n and ffns:  # FFN neurons pruned to one width everywhere: the config's FFN size(s) that were the original
        original = set(original_neurons(model).values())
        for key in ffn_keys():
            if getattr(config, key, None) in original:
                setattr(config, key, ffns[0].width)
        record |= {"kept_neurons": kept_n, "original_neurons": original_neurons(model)}
    setattr(config, STOCK_KEY, record)
    return config


def _empty(directory: Path) -> None:
    for child in directory.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()


def _write_and_check(model: nn.Module, config, directory: Path, loader) -> str | None:
    saved = model.config
    architectures = list(config.architectures or [])  # save_pretrained writes the saving class's name over it
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
    if config.model_type != saved.model_type:  # an equivalent architecture of another family
        raw["architectures"] = architectures
    file.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return _check_reload(model, directory, loader)


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())  # huggingface_hub's validation errors span lines
    return text[:300]


def _check_reload(model: nn.Module, directory: Path, loader) -> str | None:
    """Reload ``directory`` with ``loader.from_pretrained`` (the model's stock class, or an Auto class) and
    compare logits with ``model``'s."""
    param = next(model.parameters())
    try:
        plain = getattr(transformers, loader.__name__, loader).from_pretrained(
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


# Decoder families whose configs read head_dim (Family.stock_target in the family table, :mod:`.families`) are
# tried in table order when a family's own config refuses a pruned shape; a candidate is kept only by behaviour:
# the same parameter names and shapes, then equal logits on reload.
NOT_COPIED = ("model_type", "architectures", "transformers_version", "_name_or_path", "auto_map")


def equivalent_configs(model: nn.Module) -> list[tuple[object, type]]:
    """[(config of another family, the Auto class that loads it)] that build exactly ``model``'s parameter names
    and shapes: its config's fields copied, a sliding window the model does not have switched off (Mistral's
    default is 4096). :func:`write_stock` then saves with each and keeps the first whose plain reload computes
    the same logits (biases, norms or rotary settings a family reads differently show up there)."""
    source = _stock_source(model)
    auto = _auto_class(model)
    if auto is None:
        return []
    raw = {k: v for k, v in source.to_dict().items() if k not in NOT_COPIED}
    out = []
    for model_type in stock_targets():
        if model_type == source.model_type:
            continue
        try:
            config = transformers.AutoConfig.for_model(model_type, **copy.deepcopy(raw))
            if getattr(config, "sliding_window", None) is not None and getattr(source, "sliding_window", None) is None:
                config.sliding_window = None
            if getattr(config, "use_sliding_window", False) and not getattr(source, "use_sliding_window", False):
                config.use_sliding_window = False
            with torch.device("meta"):
                cls = type(auto.from_config(copy.deepcopy(config)))
        except Exception:  # a family that cannot take these fields is no candidate
            continue
        config.architectures = [cls.__name__]
        if _builds(model, cls, config) is None:
            out.append((config, auto))
    return out


def _auto_class(model: nn.Module):
    """The Auto class that builds ``model``'s own class from its config (checked by building on the meta device)."""
    cls = _base_class(model)
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModelForSequenceClassification,
                 transformers.AutoModelForTokenClassification, transformers.AutoModel):
        try:
            with torch.device("meta"):
                if type(auto.from_config(copy.deepcopy(model.config))) is cls:
                    return auto
        except Exception:  # this Auto class does not take the family
            continue
    return None
