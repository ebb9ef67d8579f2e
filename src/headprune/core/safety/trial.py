"""The trial run behind the safety net: checks on a shrunk copy of a model's class.

:func:`run_trial` builds the copy (random weights, from a shrunk config: :func:`.verify.shrunk_config`),
records how its attention is called (:mod:`.calls`), then checks that a ``[batch, heads]`` mask
scales each example's own heads, that pruned equals masked for random plans (one emptying a site,
one uneven under grouped-query attention; padded inputs), that a cached greedy ``generate`` of the
pruned copy gives the masked copy's tokens and scores, and that the pruned copy saved and loaded
back computes the same. For FFN neurons (``units`` with ``"neurons"``) the same trial checks that
neuron surgery equals the neuron mask for random plans (one emptying an FFN) and survives saving:
an FFN that mixes its intermediate features (a norm over them, a gate over a window) fails here.
Each check's failure is one line of :attr:`Trial.problems`. Surgery here is the unverified cut
(:mod:`.surgery`, :mod:`.neurons`); the public functions that verify, then cut, sit above (:mod:`.prune`).
"""

from __future__ import annotations

import copy
import inspect
import random
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from torch import nn

from ...errors import HeadpruneError, UnsupportedModelError
from ..cut.neurons import cut_neurons
from ..cut.surgery import cut_heads
from ..masks.masking import mask_from_heads, masked, masked_neurons, neuron_mask_from
from ..model.calls import TEMPLATES, read_template
from ..model.ffn import FFN, find_ffns
from ..model.sites import Site, find_sites
from ..store.saving import read_pruned, save_pruned

RTOL = 1e-4  # of the largest output compared; inexact surgery differs by 1e-2 .. 1e0


@dataclass
class Trial:
    exact: list[str] = field(default_factory=list)  # the checks passed
    problems: list[str] = field(default_factory=list)  # what differed (empty: exact)
    transient: bool = False  # a check failed for a reason of the machine (e.g. a full disk)


def run_trial(cls: type, config, attn: str | None, units: tuple[str, ...] = ("heads",)) -> Trial:
    """Build ``cls`` from ``config`` (a shrunk one) with attention implementation ``attn`` and run every
    check of ``units`` (``"heads"``, ``"neurons"``) on it; never raises for a model that fails a check."""
    verdict = Trial()
    try:
        small = _build(cls, config, attn)
        sites = find_sites(small)
        x = example_batch(small)
    except HeadpruneError as e:
        verdict.problems.append(f"the shrunk copy cannot be checked: {e}")
        return verdict
    except Exception as e:  # a config headprune cannot shrink or run: not verified, so refused
        verdict.problems.append(f"the shrunk copy cannot be built or run ({type(e).__name__}: {e})")
        return verdict
    try:
        ran = record_templates(small, sites, x)
    except Exception as e:  # the unpruned copy cannot run: nothing below could
        verdict.problems.append(f"the shrunk copy cannot run ({type(e).__name__}: {e})")
        return verdict
    if idle := [s.name for s in sites if s.name not in ran]:  # e.g. a vision tower fed text only
        verdict.problems.append(f"sites {idle} do not run on the example inputs, so their surgery cannot be checked")
        return verdict
    checks = []
    if "heads" in units:
        checks += [("batched mask", lambda: _check_batched_mask(small, sites, x)),
                   ("pruned == masked", lambda: _check_plans(small, config, sites, x)),
                   ("cached generate", lambda: _check_generate(small, config, sites, x)),
                   ("save/load", lambda: _check_roundtrip(small, config, sites, x))]
    if "neurons" in units:
        checks += [("neurons pruned == masked", lambda: _check_neuron_plans(small, config, x)),
                   ("neurons save/load", lambda: _check_neuron_roundtrip(small, config, x))]
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


def record_templates(model: nn.Module, sites: list[Site], x: dict) -> set[str]:
    """Run ``model`` once and record how each attention class is called and what it returns
    (:mod:`.calls`), for the forward of sites that lose every head. Returns the names of the sites
    that ran."""
    projected: dict[int, list[torch.Tensor]] = {id(s.attention): [] for s in sites}
    calls: dict[type, tuple] = {}
    ran: set[str] = set()
    handles = []
    for site in sites:
        cls = type(site.attention)
        handles.append(site.o.register_forward_hook(
            lambda m, a, y, key=id(site.attention): projected[key].append(y)))

        def capture(module, args, kwargs, output, cls=cls, site=site):
            ran.add(site.name)
            if cls not in calls:
                calls[cls] = (module, args, kwargs, output, list(projected[id(module)]), site.meta.get("bert_style", False))

        handles.append(site.attention.register_forward_hook(capture, with_kwargs=True))
    try:
        _output(model, x)
    finally:
        for h in handles:
            h.remove()
    for cls, (module, args, kwargs, output, proj, bert) in calls.items():
        template = read_template(module, args, kwargs, output, proj, bert)
        if template is not None:
            TEMPLATES[cls] = template
        else:
            TEMPLATES.pop(cls, None)
    return ran


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
    vocab = getattr(config, "vocab_size", None) or model.get_input_embeddings().num_embeddings  # composite configs
    pad = getattr(config, "pad_token_id", None) or 0
    ids = torch.randint(4, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if _causal(model):
        ids[-1, :2], mask[-1, :2] = pad, 0
    else:
        ids[-1, -2:], mask[-1, -2:] = pad, 0
    x = {"input_ids": ids, "attention_mask": mask}
    if getattr(config, "is_encoder_decoder", False):
        x["decoder_input_ids"] = torch.randint(4, vocab, (batch, 5), generator=g)
    return x


def _causal(model: nn.Module) -> bool:
    return not getattr(model.config, "is_encoder_decoder", False) and (
        type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")) or getattr(model.config, "is_decoder", False))


def _output(model: nn.Module, x: dict, mask=None, neurons=None) -> torch.Tensor:
    """The model's main output with padded positions zeroed (they may hold anything), under head mask ``mask``
    and neuron mask ``neurons`` when given."""
    with torch.no_grad(), (masked(model, mask) if mask else nullcontext()), \
            (masked_neurons(model, neurons) if neurons else nullcontext()):
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
    attn = getattr(model.config, "_attn_implementation", None)
    for plan in _plans(sites):
        want = _output(model, x, mask_from_heads(sites, plan))
        pruned = _build(type(model), config, attn)
        cut_heads(pruned, plan)
        problem = _differs(_output(pruned, x), want)
        if problem:
            return f"plan {plan}: {problem}"
    return ""


def _check_generate(model: nn.Module, config, sites: list[Site], x: dict) -> str:
    if not (hasattr(model, "generate") and model.can_generate()) or "input_ids" not in x:
        return "skip"
    attn = getattr(model.config, "_attn_implementation", None)
    inputs = {k: v for k, v in x.items() if k in ("input_ids", "attention_mask")}
    kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=1, use_cache=True,
              output_scores=True, return_dict_in_generate=True, pad_token_id=getattr(config, "pad_token_id", None) or 0)
    for plan in _plans(sites)[:2]:
        with torch.no_grad(), masked(model, mask_from_heads(sites, plan)):
            want = model.generate(**inputs, **kw)
        pruned = _build(type(model), config, attn)
        cut_heads(pruned, plan)
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
    plan = _plans(sites)[0]
    pruned = _build(type(model), config, getattr(model.config, "_attn_implementation", None))
    cut_heads(pruned, plan)
    return _reloaded_differs(pruned, x)


def _neuron_plans(ffns: list[FFN], n: int = 2, seed: int = 0) -> list[dict[str, list[int]]]:
    """Random neuron plans: plan 0 empties the first FFN."""
    rng = random.Random(seed)
    plans = []
    for i in range(n):
        plan = {f.name: sorted(rng.sample(range(f.width), rng.randint(1, max(1, f.width - 1)))) for f in ffns}
        if i == 0:
            plan[ffns[0].name] = list(range(ffns[0].width))
        plans.append(plan)
    return plans


def _check_neuron_plans(model: nn.Module, config, x: dict) -> str:
    ffns = find_ffns(model)
    if not ffns:
        return "no feed-forward block found"
    attn = getattr(model.config, "_attn_implementation", None)
    for plan in _neuron_plans(ffns):
        want = _output(model, x, neurons=neuron_mask_from(model, plan))
        pruned = _build(type(model), config, attn)
        cut_neurons(pruned, plan)
        problem = _differs(_output(pruned, x), want)
        if problem:
            return f"neuron plan {plan}: {problem}"
    return ""


def _check_neuron_roundtrip(model: nn.Module, config, x: dict) -> str:
    pruned = _build(type(model), config, getattr(model.config, "_attn_implementation", None))
    cut_neurons(pruned, _neuron_plans(find_ffns(pruned))[1])
    return _reloaded_differs(pruned, x)


def _reloaded_differs(pruned: nn.Module, x: dict) -> str:
    """What differs between ``pruned`` and ``pruned`` saved and read back ("" when nothing)."""
    want = _output(pruned, x)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a shard bar per check is noise
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model"
            save_pruned(pruned, path)
            loaded = read_pruned(path, model_class=type(pruned))
            if getattr(pruned.config, "_attn_implementation", None) and hasattr(loaded, "set_attn_implementation"):
                loaded.set_attn_implementation(pruned.config._attn_implementation)
            got = _output(loaded.float().eval(), x)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    return _differs(got, want)
