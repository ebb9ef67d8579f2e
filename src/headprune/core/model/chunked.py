"""Per-token losses of a model with a large vocabulary, without its ``[B, T, V]`` logits at once.

A causal LM's logits are the largest tensor of its forward: Gemma-3's 262,144-token vocabulary makes
``[4, 256, V]`` float32 logits 1.07 GB, and a log-softmax beside them doubles it. Here the model runs with a
forward pre-hook on its output head (``get_output_embeddings()``, whatever the family) that keeps the head's
input, the hidden states ``[B, T, H]``, and hands the head only the first :data:`PROBE_TOKENS` positions. The
head, and whatever the family does to its output (Gemma-2/3's ``final_logit_softcapping``, Cohere's
``logit_scale``, Granite's ``logits_scaling``), is then applied to the hidden states in chunks of at most
:func:`chunk_rows` token rows, each chunk under :func:`torch.utils.checkpoint.checkpoint` so that its logits are
not kept for the backward.

Which map from the head's output to the model's logits applies is decided by behaviour on every forward: the
head's output on the probe positions, mapped by each candidate, must equal the logits the model returned for
them (float rounding allowed); the closest candidate within that is taken. Where none matches (a forward that
adds something after the head that no candidate knows), or the head is not called once on ``[B, T, H]``, the
model runs again whole and its full logits are used (:attr:`TokenOutputs.chunked` is False), and the model is
marked so that later forwards go straight there.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .inputs import token_cross_entropy, unwrap

PROBE_TOKENS = 4  # positions the head is run on inside the forward, to check the map to the model's logits
LOGIT_BYTES = 64 * 2**20  # float32 logits one chunk may hold (64 MiB: 64 rows of Gemma-3's 262,144 tokens)
_UNCHUNKED = "_headprune_full_logits"  # set on a model whose logits the hidden-state path does not reproduce


def chunk_rows(vocab: int, budget: int | None = None) -> int:
    """Token rows per chunk: as many as keep one chunk's float32 logits within ``budget`` bytes (1 at least)."""
    return max(1, (budget or LOGIT_BYTES) // (4 * max(vocab, 1)))


@dataclass
class TokenOutputs:
    """A forward of a model with outputs per token, for losses computed chunk by chunk.

    ``features [B, T, F]`` and ``to_logits`` (``[N, F] -> [N, V]``): the hidden states before the head and the
    head with the family's map after it (``chunked``), or the model's full logits and the identity (not
    ``chunked``: the fallback). ``outputs``: what the model returned (its ``logits`` then cover the probe
    positions only where ``chunked``)."""

    features: torch.Tensor  # [B, T, F]
    to_logits: Callable[[torch.Tensor], torch.Tensor]  # [N, F] -> [N, V]
    vocab: int
    chunked: bool
    outputs: object = None

    def shifted(self) -> TokenOutputs:
        """Positions ``0 .. T-2``: those that predict the next token."""
        return TokenOutputs(self.features[:, :-1], self.to_logits, self.vocab, self.chunked, self.outputs)

    def rows(self, budget: int | None = None) -> int:
        """Token rows per chunk: :func:`chunk_rows` of ``budget`` bytes (None: :data:`LOGIT_BYTES`); all of them
        for the fallback, whose logits exist already."""
        return chunk_rows(self.vocab, budget or LOGIT_BYTES) if self.chunked else max(1, math.prod(self.features.shape[:-1]))

    def token_nll(self, labels: torch.Tensor, *, budget: int | None = None) -> torch.Tensor:
        """Cross-entropy of every position, ``[B, T]`` (0 where ``labels`` is -100), as
        :func:`headprune.core.model.inputs.token_cross_entropy` computes it from the full logits; gradients flow to
        the features (and the head's parameters)."""
        b, t = self.features.shape[:2]
        labels = labels.to(self.features.device).reshape(b * t)
        scored = (labels != -100).nonzero().squeeze(-1)  # [N] rows that need the head at all
        h = self.features.reshape(b * t, -1).index_select(0, scored)  # [N, F]
        y = labels.index_select(0, scored)  # [N]
        nll = map_chunks(lambda hc, yc: _nll(self.to_logits, hc, yc), (h, y), self.rows(budget))  # [N]
        out = torch.zeros(b * t, dtype=nll.dtype, device=nll.device)
        return out.index_copy(0, scored, nll).view(b, t)


def _nll(to_logits: Callable, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return token_cross_entropy(to_logits(h).unsqueeze(0), y.unsqueeze(0)).squeeze(0)  # [N]


def map_chunks(fn: Callable[..., torch.Tensor], tensors: tuple[torch.Tensor, ...], rows: int) -> torch.Tensor:
    """``fn`` over chunks of ``rows`` rows of ``tensors`` (all ``[N, ...]``), concatenated (``[N, ...]``). Where
    gradients are recorded, each chunk runs under a non-reentrant checkpoint: only its inputs are kept, and its
    logits are computed again, one chunk at a time, in the backward."""
    n = tensors[0].shape[0]
    if n == 0:
        return fn(*tensors)
    record = torch.is_grad_enabled()
    parts = []
    for start in range(0, n, rows):
        chunk = tuple(t[start: start + rows] for t in tensors)
        parts.append(checkpoint(fn, *chunk, use_reentrant=False) if record else fn(*chunk))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def token_outputs(model: nn.Module, inputs: Mapping[str, object]) -> TokenOutputs:
    """Run ``model(**inputs)`` for per-token losses: the hidden states and the checked head map where the model
    allows (see the module), else its full logits. ``labels`` in ``inputs`` are not passed to the probed forward
    (an encoder-decoder gets the ``decoder_input_ids`` it would build from them); the fallback passes them.
    ``features`` of the fallback are the logits as the model returns them (``[B, C]`` for a classifier)."""
    base = unwrap(model)
    head = _head(base)
    probed = _without_labels(base, inputs)
    if head is not None and probed is not None and not base.__dict__.get(_UNCHUNKED):
        with _probe(head) as seen:
            outputs = model(**probed)
        path = _checked_map(base, seen, getattr(outputs, "logits", None))
        if path is not None:
            post, vocab = path
            return TokenOutputs(seen["hidden"], lambda h: post(head(h)), vocab, True, outputs)
        base.__dict__[_UNCHUNKED] = True
    outputs = model(**inputs)
    logits = outputs.logits  # [B, T, V]
    return TokenOutputs(logits, lambda x: x, logits.shape[-1], False, outputs)


def forward_few_logits(model: nn.Module, inputs: Mapping[str, object]):
    """``model(**inputs)`` with its output head run on the first :data:`PROBE_TOKENS` positions only: for
    forwards run for what happens inside the model (statistics, hooks), whose logits nobody reads. A model
    without an output head, or with labels it needs and cannot take as decoder inputs, runs as it is."""
    head, probed = _head(unwrap(model)), _without_labels(unwrap(model), inputs)
    if head is None or probed is None:
        return model(**inputs)
    with _probe(head):
        return model(**probed)


def _without_labels(model: nn.Module, inputs: Mapping[str, object]) -> dict | None:
    """``inputs`` without ``labels``, which a model would score against the probe positions' logits: an
    encoder-decoder's become its ``decoder_input_ids`` as the model builds them
    (``prepare_decoder_input_ids_from_labels``); None where they cannot be dropped so (the full logits then)."""
    inputs = dict(inputs)
    labels = inputs.pop("labels", None)
    if labels is None:
        return inputs
    prepare = getattr(model, "prepare_decoder_input_ids_from_labels", None)
    if not getattr(model.config, "is_encoder_decoder", False) or not callable(prepare) \
            or inputs.get("decoder_input_ids") is not None:
        return None
    inputs["decoder_input_ids"] = prepare(labels=labels)
    return inputs


def _head(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return head if isinstance(head, nn.Module) else None


@contextmanager
def _probe(head: nn.Module):
    """Inside: the head's first call keeps its input ``[B, T, H]`` (``seen["hidden"]``) and runs on the first
    :data:`PROBE_TOKENS` positions only (its output: ``seen["out"]``); ``seen["calls"]`` counts its calls."""
    seen: dict = {"calls": 0}

    def before(module, args):
        seen["calls"] += 1
        if seen["calls"] > 1 or not args or not isinstance(args[0], torch.Tensor) or args[0].dim() != 3:
            return None
        seen["hidden"] = args[0]
        return (args[0][:, :PROBE_TOKENS], *args[1:])

    def after(module, args, out):
        if seen["calls"] == 1:
            seen["out"] = out

    hooks = [head.register_forward_pre_hook(before), head.register_forward_hook(after)]
    try:
        yield seen
    finally:
        for hook in hooks:
            hook.remove()


def _checked_map(model: nn.Module, seen: dict, logits) -> tuple[Callable, int] | None:
    """(the map from the head's output to the model's logits, the vocabulary size), or None: of the candidate
    maps (:func:`_candidates`), the one closest to the model's logits on the probe positions, if within float
    rounding of them; None where the head was not called once on hidden states, or no candidate matches."""
    out = seen.get("out")
    if seen["calls"] != 1 or "hidden" not in seen or not isinstance(out, torch.Tensor) \
            or not isinstance(logits, torch.Tensor) or logits.shape != out.shape:
        return None
    with torch.no_grad():
        z, y = out.detach().float(), logits.detach().float().to(out.device)
        scale = float(y.abs().max()) if y.numel() else 0.0
        tol = 8 * torch.finfo(logits.dtype if logits.is_floating_point() else torch.float32).eps * max(scale, 1e-30)
        gaps = [(float((post(z) - y).abs().max()) if y.numel() else 0.0, post) for post in _candidates(model)]
    gap, post = min(gaps, key=lambda g: g[0])
    return (post, out.shape[-1]) if math.isfinite(gap) and gap <= tol else None


def _candidates(model: nn.Module) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    """Maps a family may apply to the head's output: none; soft-capping ``c * tanh(z / c)`` by the config's
    ``final_logit_softcapping``; multiplying by a ``logit_scale``; dividing by a ``logits_scaling``. Only the
    ones whose value the model's config (or text config) or the model holds are offered."""
    found: list[Callable[[torch.Tensor], torch.Tensor]] = [_unchanged]
    cap = _setting(model, "final_logit_softcapping")
    if cap:
        found.append(functools.partial(_softcap, cap=cap))
    scale = getattr(model, "logit_scale", None)
    scale = scale if scale is not None else _setting(model, "logit_scale")
    if scale is not None:
        found.append(functools.partial(torch.mul, other=scale))
    divide = _setting(model, "logits_scaling")
    if divide:
        found.append(functools.partial(torch.div, other=divide))
    return found


def _softcap(z: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.tanh(z / cap) * cap


def _unchanged(z: torch.Tensor) -> torch.Tensor:
    return z


def _setting(model: nn.Module, name: str):
    config = getattr(model, "config", None)
    for c in (config, getattr(config, "text_config", None)):
        value = getattr(c, name, None) if c is not None else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


def kl_rows(t_logits: torch.Tensor, s_logits: torch.Tensor) -> torch.Tensor:
    """``KL(teacher || student)`` of the softmax over the last dimension, per row, in float32 at least."""
    t = torch.log_softmax(t_logits.float(), -1)
    s = torch.log_softmax(s_logits.float(), -1)
    return (t.exp() * (t - s)).sum(-1)


def chunked_kl(teacher: TokenOutputs, student: TokenOutputs, keep: torch.Tensor | None = None, *,
               budget: int | None = None) -> torch.Tensor:
    """``KL(teacher || student)`` per position, ``[B, T]``, chunk by chunk, at the positions ``keep [B, T]``
    (bool; None: all) and 0 elsewhere; gradients flow to the student only (the teacher's head runs without)."""
    b, t = student.features.shape[:2]
    rows = torch.arange(b * t, device=student.features.device)
    if keep is not None:
        rows = rows[keep.to(rows.device).reshape(b * t)]  # [N] positions that count
    hs = student.features.reshape(b * t, -1).index_select(0, rows)  # [N, F]
    ht = teacher.features.detach().reshape(b * t, -1).to(hs.device).index_select(0, rows)

    def kl(s_chunk: torch.Tensor, t_chunk: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t_logits = teacher.to_logits(t_chunk.to(teacher.features.device)).to(s_chunk.device)
        return kl_rows(t_logits, student.to_logits(s_chunk))

    per = map_chunks(kl, (hs, ht), min(student.rows(budget), teacher.rows(budget)))  # [N]
    return torch.zeros(b * t, dtype=per.dtype, device=per.device).index_copy(0, rows, per).view(b, t)


__all__ = ["LOGIT_BYTES", "PROBE_TOKENS", "TokenOutputs", "chunk_rows", "chunked_kl", "forward_few_logits", "kl_rows",
           "map_chunks", "token_outputs"]
