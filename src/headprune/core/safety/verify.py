"""The safety net: before surgery touches a model, prove on a shrunk copy of its class that it is exact.

Sites are found by shape, so a family nobody has tried may still be found -- and pruned wrong. Two
guards run before anything changes (a model headprune cannot prune exactly is refused, never
touched):

1. A scan of every attention module for parameters and buffers that surgery does not slice but
   that have a per-head dimension (``num_heads`` or ``num_kv_heads``) or span the heads' whole
   width (``heads * head_dim``: e.g. a norm over all heads' queries). Per-head tensors and module
   lists surgery does slice (sinks, per-head norms: :func:`.sites.head_tensors`,
   :func:`.sites.head_lists`) pass.
2. A trial run (:mod:`.trial`) on a shrunk copy of the same class: the model's config with at most
   two layers per stack, a small feed-forward and vocabulary (:func:`shrunk_config`), random
   weights; the model itself is not copied.

Neuron surgery is verified by the same trial (``units=("neurons",)``): pruned FFN neurons must
compute what masked ones do, which a family with a norm or any other mix over the intermediate
features fails.

A site left without heads answers in its family's call shape (:mod:`.calls`):
:func:`give_removed_sites_calls` gives a pruned or loaded model the templates it needs (from its
config, or computed from one run of a shrunk copy), so it never depends on a trial having run.

Verdicts are cached per (model class, shrunk config, attention implementation, transformers
version, units) for the process. Anything not exact raises :class:`UnsupportedModelError` naming the
family, the attention class and what differed. ``verify=False`` (CLI: ``--no-verify``) is
the only way past it.
"""

from __future__ import annotations

import copy
import json
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
import transformers
from torch import nn

from ...errors import UnsupportedModelError
from ..model.calls import TEMPLATES, CallTemplate, template_from_record, template_record
from ..model.families import ffn_keys
from ..model.records import CALLS_KEY, RECORD_KEYS, VERSION_KEY, config_record
from ..model.runtime import RepeatHeads, give_calls, removed_attention_classes, shares_t5_bias
from ..model.sites import POSITION_BUFFERS, Site, ancestors, find_sites, head_axes, head_lists, head_tensors
from .trial import example_batch, record_templates, run_trial

LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers")
SMALL_LAYERS, SMALL_FFN, SMALL_VOCAB = 2, 16, 96
TOKEN_KEYS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2,
              "sep_token_id": 2, "cls_token_id": 1, "unk_token_id": 3, "mask_token_id": 3}


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
            "(CLI: --no-verify) only if you have checked the result yourself")


# The documented cache: verdicts per class and shrunk config (module doc), for this process; a verdict is data
# written once per key, so threads at worst compute one twice.
_VERDICTS: dict[str, Verdict] = {}
# Whether a verification runs in this thread / task: the shrunk copies' own surgery and reload are not
# re-verified. A context variable, not a module-level counter: concurrent verifications do not see each other.
_VERIFYING: ContextVar[bool] = ContextVar("headprune_verifying", default=False)


UNITS = ("heads", "neurons")


def verify_surgery(model: nn.Module, units: tuple[str, ...] = ("heads",)) -> Verdict:
    """Refuse ``model`` (raise :class:`UnsupportedModelError`) unless surgery of ``units`` (``"heads"``,
    ``"neurons"``) is exact for its class."""
    verdict = check_model(model, units)
    if not verdict.ok:
        raise verdict.error()
    return verdict


def check_model(model: nn.Module, units: tuple[str, ...] = ("heads",)) -> Verdict:
    """Run (or recall) every check of ``units`` for ``model``'s class and options; never raises for a wrong
    model."""
    units = tuple(u for u in UNITS if u in units)
    sites = find_sites(model)
    scan = per_head_parameters(sites) if "heads" in units else []
    family = getattr(model.config, "model_type", None) or type(model).__name__
    classes = sorted({type(s.attention).__name__ for s in sites})
    small_config = shrunk_config(model.config)
    key = _key(model, small_config, units)
    if _VERIFYING.get():
        return Verdict(family, type(model).__name__, classes, exact=["(inside a verification)"])
    verdict = _VERDICTS.get(key)
    if verdict is None:
        token = _VERIFYING.set(True)
        try:
            outcome = run_trial(type(model), small_config, getattr(model.config, "_attn_implementation", None), units)
            verdict = Verdict(family, type(model).__name__, classes, exact=outcome.exact, problems=outcome.problems,
                              transient=outcome.transient)
        finally:
            _VERIFYING.reset(token)
        if not verdict.transient:
            _VERDICTS[key] = verdict
    verdict = copy.deepcopy(verdict)
    verdict.problems = scan + verdict.problems
    return verdict


def give_removed_sites_calls(model: nn.Module) -> None:
    """Give every site of ``model`` with no heads left the call template of its attention class and record
    them in ``model.config`` (:data:`.records.CALLS_KEY`, saved with the model): read from the config, else
    from this process's trial, else computed now from one run of a shrunk copy of the model's class. After
    this the model runs the same in any process, verified or not."""
    classes = removed_attention_classes(model)
    if not classes:
        return
    record = config_record(model.config, CALLS_KEY) or {}
    known = {n: t for n, r in record.items() if n in classes and (t := template_from_record(r)) is not None}
    known |= {n: TEMPLATES[c] for n, c in classes.items() if n not in known and c in TEMPLATES}
    if set(classes) - set(known):
        known |= _read_calls(model, {n: c for n, c in classes.items() if n not in known})
    give_calls(model, known)
    setattr(model.config, CALLS_KEY, {n: template_record(known[n]) for n in sorted(classes) if n in known})


def _read_calls(model: nn.Module, classes: dict[str, type]) -> dict[str, CallTemplate]:
    """Call templates of ``classes`` read off one run of an unpruned shrunk copy of ``model``'s class (none
    when the copy cannot run: the removed sites then take ``hidden_states``-like inputs and return a pair)."""
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            small = type(model)._from_config(shrunk_config(model.config))
        attn = getattr(model.config, "_attn_implementation", None)
        if attn is not None and hasattr(small, "set_attn_implementation"):
            small.set_attn_implementation(attn)
        small = small.float().eval()
        record_templates(small, find_sites(small), example_batch(small))
    except Exception:  # a class the trial could not run either: the default call shape stays
        return {}
    return {n: TEMPLATES[c] for n, c in classes.items() if c in TEMPLATES}


def per_head_parameters(sites: list[Site]) -> list[str]:
    """Parameters / buffers of attention modules with a per-head or whole-width dimension that surgery
    does not slice, as one problem line per module (empty when there is none)."""
    problems = []
    for site in sites:
        handled = {id(m) for m in (site.q.module, site.k.module, site.v.module, site.o, *site.meta.get("extras", []))}
        handled |= {id(m.base) for m in (site.k.module, site.v.module) if isinstance(m, RepeatHeads)}
        if shares_t5_bias(site.attention):
            handled.add(id(site.attention.relative_attention_bias) if site.attention.has_relative_attention_bias
                        else -1)
        lists = {id(getattr(parent, attr)) for parent, attr, _ in head_lists(site)}  # sliced by surgery
        sliced = {(id(module), name) for module, name, _, _ in head_tensors(site)}  # sliced by surgery too
        heads = {site.num_heads, site.num_kv_heads} - {1}
        widths = {site.num_heads * site.head_dim, site.num_kv_heads * site.head_dim}
        found = []
        for name, module in site.attention.named_modules():
            if id(module) in handled or any(id(m) in handled for m in ancestors(site.attention, name)):
                continue
            if id(module) in lists or any(id(m) in lists for m in ancestors(site.attention, name)):
                continue  # one module per head: surgery keeps the kept heads' entries (their sizes are per head_dim)
            tensors = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
            for pname, t in tensors:
                if pname in POSITION_BUFFERS or t.dim() == 0 or (id(module), pname) in sliced:
                    continue
                axes = head_axes(site, module, tuple(t.shape))  # a norm's [head_dim] features are not heads
                if any(d in heads for d in axes) or (module is not site.attention and any(d in widths for d in axes)):
                    found.append(f"{(name + '.') if name else ''}{pname} {tuple(t.shape)}")
        if found:
            problems.append(f"{site.name} has per-head or whole-width tensors surgery does not slice: {', '.join(found)}")
    return problems


def shrunk_config(config):
    """A copy of ``config`` with at most two layers per stack, a small feed-forward and vocabulary, and no
    headprune records: the same attention class and options at a fraction of the size."""
    small = copy.deepcopy(config)
    for key in (*RECORD_KEYS, VERSION_KEY, "quantization_config"):
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
    for key in ffn_keys():
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


def _key(model: nn.Module, small_config, units: tuple[str, ...]) -> str:
    options = small_config.to_dict()
    for k in ("_name_or_path", "transformers_version", "architectures", "torch_dtype", "dtype"):
        options.pop(k, None)
    impl = getattr(model.config, "_attn_implementation", None)
    return json.dumps([type(model).__name__, impl, transformers.__version__, list(units), options], sort_keys=True,
                      default=str)
