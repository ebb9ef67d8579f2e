"""The safety net: before surgery touches a model, prove on a shrunk copy of its class that it is exact.

Sites are found by shape, so a family nobody has tried may still be found -- and pruned wrong. Two
guards run before anything changes (a model headprune cannot prune exactly is refused, never
touched):

1. A scan of every attention module for parameters and buffers that surgery does not slice but
   that have a per-head dimension (``num_heads`` or ``num_kv_heads``: per-head norms, sinks, gates,
   bias tables) or span the heads' whole width (``heads * head_dim``: a norm over all heads).
2. A shrunk copy of the same class (the model's config with at most two layers per stack, a small
   feed-forward and vocabulary, random weights; the model itself is not copied) on which:
   masking with a batched ``[batch, heads]`` mask equals masking each example alone (the mask
   scales the heads of the right example); pruning equals masking for random plans, one of them
   emptying a site and, under grouped-query attention, one uneven (padded inputs); a cached greedy
   ``generate`` of the pruned copy gives the masked copy's tokens and scores; and the pruned copy
   saved and loaded back computes the same.

Verdicts are cached per (model class, shrunk config, attention implementation, transformers
version) for the process. Anything not exact raises :class:`UnsupportedModelError` naming the
family, the attention class and what differed. ``verify=False`` (CLI: ``--trust-unverified``) is
the only way past it.
"""

from __future__ import annotations

import copy
import inspect
import json
import random
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from torch import nn

from ..errors import HeadpruneError, UnsupportedModelError
from .masking import mask_from_heads, masked
from .runtime import RepeatHeads
from .sites import POSITION_BUFFERS, Site, find_sites, head_lists, head_tensors

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers")
FFN_KEYS = ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "n_inner",
            "moe_intermediate_size", "shared_expert_intermediate_size")
SMALL_LAYERS, SMALL_FFN, SMALL_VOCAB = 2, 16, 96
TOKEN_KEYS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2,
              "sep_token_id": 2, "cls_token_id": 1, "unk_token_id": 3, "mask_token_id": 3}
RTOL = 1e-4  # of the largest output compared; inexact surgery differs by 1e-2 .. 1e0


@dataclass
class Verdict:
    """What the checks found: ``exact`` (each check's name) or ``problems`` (what differed)."""

    family: str
    model_class: str
    attention_classes: list[str]
    exact: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    transient: bool = False  # a check failed for a reason of the machine (e.g. a full disk): not cached

    @property
    def ok(self) -> bool:
        return not self.problems

    def error(self) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"{self.family} ({self.model_class}, attention {', '.join(self.attention_classes)}): headprune cannot "
            f"prune it exactly: {'; '.join(self.problems)}. Nothing was changed. Pass verify=False "
            "(CLI: --trust-unverified) only if you have checked the result yourself")


_VERDICTS: dict[str, Verdict] = {}
_ACTIVE = [0]  # verifications running now: the shrunk copies' own surgery and reload are not re-verified


def verify_surgery(model: nn.Module) -> Verdict:
    """Refuse ``model`` (raise :class:`UnsupportedModelError`) unless surgery is exact for its class."""
    verdict = check_model(model)
    if not verdict.ok:
        raise verdict.error()
    return verdict


def check_model(model: nn.Module) -> Verdict:
    """Run (or recall) every check for ``model``'s class and options; never raises for a wrong model."""
    sites = find_sites(model)
    scan = per_head_parameters(sites)
    family = getattr(model.config, "model_type", None) or type(model).__name__
    classes = sorted({type(s.attention).__name__ for s in sites})
    small_config = shrunk_config(model.config)
    key = _key(model, small_config)
    if _ACTIVE[0]:
        return Verdict(family, type(model).__name__, classes, exact=["(inside a verification)"])
    verdict = _VERDICTS.get(key)
    if verdict is None:
        _ACTIVE[0] += 1
        try:
            verdict = _check_copy(model, small_config, family, classes)
        finally:
            _ACTIVE[0] -= 1
        if not verdict.transient:
            _VERDICTS[key] = verdict
    verdict = copy.deepcopy(verdict)
    verdict.problems = scan + verdict.problems
    return verdict


def per_head_parameters(sites: list[Site]) -> list[str]:
    """Parameters / buffers of attention modules with a per-head or whole-width dimension that surgery
    does not slice, as one problem line per module (empty when there is none)."""
    problems = []
    for site in sites:
        handled = {id(m) for m in (site.q.module, site.k.module, site.v.module, site.o, *site.meta.get("extras", []))}
        handled |= {id(m.base) for m in (site.k.module, site.v.module) if isinstance(m, RepeatHeads)}
        if _is_t5(site.attention):
            handled.add(id(site.attention.relative_attention_bias) if site.attention.has_relative_attention_bias
                        else -1)
        lists = {id(getattr(parent, attr)) for parent, attr, _ in head_lists(site)}  # sliced by surgery
        sliced = {(id(module), name) for module, name, _, _ in head_tensors(site)}  # sliced by surgery too
        heads = {site.num_heads, site.num_kv_heads} - {1}
        widths = {site.num_heads * site.head_dim, site.num_kv_heads * site.head_dim}
        found = []
        for name, module in site.attention.named_modules():
            if id(module) in handled or any(id(m) in handled for m in _ancestors(site.attention, name)):
                continue
            if id(module) in lists or any(id(m) in lists for m in _ancestors(site.attention, name)):
                continue  # one module per head: surgery keeps the kept heads' entries (their sizes are per head_dim)
            tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
            for pname, t in tensors:
                if pname in POSITION_BUFFERS or t.dim() == 0 or (id(module), pname) in sliced:
                    continue
                if any(d in heads for d in t.shape) or (module is not site.attention and any(d in widths for d in t.shape)):
                    found.append(f"{(name + '.') if name else ''}{pname} {tuple(t.shape)}")
        if found:
            problems.append(f"{site.name} has per-head or whole-width tensors surgery does not slice: {', '.join(found)}")
    return problems


def shrunk_config(config):
    """A copy of ``config`` with at most two layers per stack, a small feed-forward and vocabulary, and no
    headprune records: the same attention class and options at a fraction of the size."""
    small = copy.deepcopy(config)
    for key in ("headprune_kept_heads", "headprune_original_heads", "headprune_plan", "headprune_heads",
                "headprune_version", "quantization_config"):
        if hasattr(small, key):
            delattr(small, key)
    for key in LAYER_KEYS:
        value = getattr(small, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > SMALL_LAYERS:
            setattr(small, key, SMALL_LAYERS)
    for key in ("layer_types", "attention_layers", "block_types"):
        value = getattr(small, key, None)
        if isinstance(value, list) and len(value) > SMALL_LAYERS:
            setattr(small, key, _keep_kinds(value, SMALL_LAYERS))
    for key in FFN_KEYS:
        value = getattr(small, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > SMALL_FFN:
            setattr(small, key, SMALL_FFN)
    vocab = getattr(small, "vocab_size", None)
    if isinstance(vocab, int) and vocab > SMALL_VOCAB:
        small.vocab_size = SMALL_VOCAB
        for key, value in TOKEN_KEYS.items():
            current = getattr(small, key, None)
            if isinstance(current, int) and current >= SMALL_VOCAB:
                setattr(small, key, value)
    return small


def _keep_kinds(values: list, n: int) -> list:
    """The first ``n`` entries, swapping in the first entry of each kind that would be lost."""
    out = list(values[:n])
    missing = [v for v in dict.fromkeys(values) if v not in out]
    for i, v in enumerate(missing[: n - 1]):
        out[n - 1 - i] = v
    return out


def _key(model: nn.Module, small_config) -> str:
    options = small_config.to_dict()
    for k in ("_name_or_path", "transformers_version", "architectures", "torch_dtype", "dtype"):
        options.pop(k, None)
    impl = getattr(model.config, "_attn_implementation", None)
    return json.dumps([type(model).__name__, impl, transformers.__version__, options], sort_keys=True, default=str)


# ---------------------------------------------------------------- checks on the shrunk copy

def _check_copy(model: nn.Module, config, family: str, classes: list[str]) -> Verdict:
    verdict = Verdict(family, type(model).__name__, classes)
    try:
        small = _build(type(model), config, getattr(model.config, "_attn_implementation", None))
        sites = find_sites(small)
        x = example_batch(small)
    except HeadpruneError as e:
        verdict.problems.append(f"the shrunk copy cannot be checked: {e}")
        return verdict
    except Exception as e:  # a config headprune cannot shrink or run: not verified, so refused
        verdict.problems.append(f"the shrunk copy cannot be built or run ({type(e).__name__}: {e})")
        return verdict
    checks = [("batched mask", lambda: _check_batched_mask(small, sites, x)),
              ("pruned == masked", lambda: _check_plans(small, config, sites, x)),
              ("cached generate", lambda: _check_generate(small, config, sites, x)),
              ("save/load", lambda: _check_roundtrip(small, config, sites, x))]
    for name, check in checks:
        try:
            problem = check()
        except OSError as e:  # the machine (disk, memory), not the model: say so, and do not remember it
            verdict.transient = True
            problem = f"{type(e).__name__}: {e}"
        except Exception as e:  # any failure of surgery or of the pruned model means "not exact"
            problem = f"{type(e).__name__}: {e}"
        if problem == "skip":
            continue
        if problem:
            verdict.problems.append(f"{name}: {problem}")
            break
        verdict.exact.append(name)
    return verdict


def _build(cls: type, config, attn: str | None) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = copy.deepcopy(config)  # surgery records kept heads in the config: one per copy
        model = cls._from_config(config) if hasattr(cls, "_from_config") else cls(config)
    if attn is not None and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(attn)
    return model.float().eval()


def example_batch(model: nn.Module, batch: int = 3, length: int = 7) -> dict:
    """Random inputs with the last example padded (left for causal LMs, right otherwise)."""
    g = torch.Generator().manual_seed(1)
    name = getattr(model, "main_input_name", "input_ids")
    config = model.config
    if name == "pixel_values":
        size = getattr(config, "image_size", 32)
        size = size if isinstance(size, int) else size[0]
        return {"pixel_values": torch.randn(batch, getattr(config, "num_channels", 3), size, size, generator=g)}
    if name != "input_ids":
        raise UnsupportedModelError(f"cannot build example inputs for main input {name!r}")
    vocab = config.vocab_size
    ids = torch.randint(4, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if _causal(model):
        ids[-1, :2], mask[-1, :2] = config.pad_token_id or 0, 0
    else:
        ids[-1, -2:], mask[-1, -2:] = config.pad_token_id or 0, 0
    x = {"input_ids": ids, "attention_mask": mask}
    if getattr(config, "is_encoder_decoder", False):
        x["decoder_input_ids"] = torch.randint(4, vocab, (batch, 5), generator=g)
    return x


def _causal(model: nn.Module) -> bool:
    return not getattr(model.config, "is_encoder_decoder", False) and (
        type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")) or getattr(model.config, "is_decoder", False))


def _output(model: nn.Module, x: dict, mask=None) -> torch.Tensor:
    """The model's main output with padded positions zeroed (they may hold anything)."""
    with torch.no_grad(), (masked(model, mask) if mask else nullcontext()):
        out = model(**x, **({"use_cache": False} if _takes(model, "use_cache") else {}))
    y = getattr(out, "logits", None)
    if y is None:
        y = getattr(out, "last_hidden_state", None)
    if y is None:
        y = next(t for t in out.values() if isinstance(t, torch.Tensor))
    y = y.float()
    pad = x.get("attention_mask")
    if pad is not None and y.dim() >= 3 and y.shape[:2] == pad.shape:
        y = y * pad.view(*pad.shape, *([1] * (y.dim() - 2)))
    return torch.nan_to_num(y)


def _takes(model: nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def _differs(got: torch.Tensor, want: torch.Tensor) -> str:
    if got.shape != want.shape:
        return f"output shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = float((got - want).abs().max())
    scale = float(want.abs().max())
    return "" if diff <= RTOL * max(scale, 1e-6) + 1e-7 else f"max abs difference {diff:.3g} (outputs up to {scale:.3g})"


def _plans(sites: list[Site], n: int = 3, seed: int = 0) -> list[dict[str, list[int]]]:
    """Random plans: plan 0 empties the first site; plan 1 is uneven across key/value groups (GQA)."""
    rng = random.Random(seed)
    plans = []
    for i in range(n):
        plan = {s.name: sorted(rng.sample(range(s.num_heads), rng.randint(0, s.num_heads - 1))) for s in sites}
        if i == 0:
            plan[sites[0].name] = list(range(sites[0].num_heads))
        if i == 1:
            for s in sites:
                if s.num_kv_heads < s.num_heads:
                    plan[s.name] = [0]  # one query head of the first group only
        plans.append(plan)
    return plans


def _check_batched_mask(model: nn.Module, sites: list[Site], x: dict) -> str:
    """A [batch, heads] mask must scale example b's heads by row b (time-first layouts would not)."""
    batch = next(v for v in x.values() if isinstance(v, torch.Tensor)).shape[0]
    g = torch.Generator().manual_seed(2)
    rows = {s.name: (torch.rand(batch, s.num_heads, generator=g) > 0.4).float() for s in sites}
    together = _output(model, x, rows)
    for b in range(batch):
        one = {k: v[b:b + 1] for k, v in x.items() if isinstance(v, torch.Tensor)}
        alone = _output(model, one, {name: r[b] for name, r in rows.items()})
        problem = _differs(together[b:b + 1], alone)
        if problem:
            return f"example {b} under a batched mask differs from the same example masked alone: {problem}"
    return ""


def _check_plans(model: nn.Module, config, sites: list[Site], x: dict) -> str:
    from .surgery import prune_heads

    attn = getattr(model.config, "_attn_implementation", None)
    for plan in _plans(sites):
        want = _output(model, x, mask_from_heads(sites, plan))
        pruned = _build(type(model), config, attn)
        prune_heads(pruned, plan, verify=False)
        problem = _differs(_output(pruned, x), want)
        if problem:
            return f"plan {plan}: {problem}"
    return ""


def _check_generate(model: nn.Module, config, sites: list[Site], x: dict) -> str:
    from .surgery import prune_heads

    if not (hasattr(model, "generate") and model.can_generate()) or "input_ids" not in x:
        return "skip"
    attn = getattr(model.config, "_attn_implementation", None)
    inputs = {k: v for k, v in x.items() if k in ("input_ids", "attention_mask")}
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=1, use_cache=True,
              output_scores=True, return_dict_in_generate=True, pad_token_id=config.pad_token_id or 0)
    for plan in _plans(sites)[:2]:
        with torch.no_grad(), masked(model, mask_from_heads(sites, plan)):
            want = model.generate(**inputs, **kw)
        pruned = _build(type(model), config, attn)
        prune_heads(pruned, plan, verify=False)
        with torch.no_grad():
            got = pruned.generate(**inputs, **kw)
        if not torch.equal(got.sequences, want.sequences):
            return f"plan {plan}: generated tokens differ"
        for a, b in zip(got.scores, want.scores, strict=True):
            problem = _differs(torch.nan_to_num(a.float(), neginf=0.0), torch.nan_to_num(b.float(), neginf=0.0))
            if problem:
                return f"plan {plan}: generation scores differ, {problem}"
    return ""


def _check_roundtrip(model: nn.Module, config, sites: list[Site], x: dict) -> str:
    from .io import load_pruned, save_pruned  # io imports surgery, which imports this module
    from .surgery import prune_heads

    plan = _plans(sites)[0]
    pruned = _build(type(model), config, getattr(model.config, "_attn_implementation", None))
    prune_heads(pruned, plan, verify=False)
    want = _output(pruned, x)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a shard bar per check is noise
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model"
            save_pruned(pruned, path)
            loaded = load_pruned(path, model_class=type(pruned))
            if getattr(pruned.config, "_attn_implementation", None) and hasattr(loaded, "set_attn_implementation"):
                loaded.set_attn_implementation(pruned.config._attn_implementation)
            got = _output(loaded.float().eval(), x)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    return _differs(got, want)


def _ancestors(root: nn.Module, name: str) -> list[nn.Module]:
    parts = name.split(".") if name else []
    out, module = [], root
    for p in parts[:-1]:
        module = getattr(module, p)
        out.append(module)
    return out


def _is_t5(attn: nn.Module) -> bool:
    return hasattr(attn, "relative_attention_num_buckets") and hasattr(attn, "compute_bias")
