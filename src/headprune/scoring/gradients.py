"""One mask-gradient pass: per-example dL_b/dxi_h for every head, exact, in one backward per batch.

Every site gets a *batched* mask ``xi [batch, heads]`` of ones. Example ``b`` only flows through
row ``b``, so with ``L = sum_b L_b`` the gradient ``dL/dxi[b, h]`` is exactly ``dL_b/dxi_h``: one
backward pass gives every example's gradient. Parameters are frozen during scoring, so no weight
gradient is computed. I_h (:mod:`.importance`) and the Fisher (:mod:`.fisher`) are two reductions
of these gradients (:func:`gradient_sums`).

The mask is applied on top of any mask the model already has (``with hp.masked(model, m):``): the
gradients are then those of the masked model, and heads the outer mask switches off get zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sized
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from ..core.masks.masking import HeadMask, masked, ones_mask, row_of_masks
from ..core.model.chunked import token_outputs
from ..core.model.devices import accumulator_device, input_device, to_device
from ..core.model.finite import check_finite, check_finite_scores, check_finite_weights, nonfinite_losses
from ..core.model.inputs import batch_size, model_inputs, rows_with_tokens, token_cross_entropy, unwrap
from ..distributed import gather, rank_world, reduce_sums, shard
from ..errors import ConfigError, NonFiniteError, UnsupportedModelError
from ..progress import progress_bar

LossFn = Callable[[object, Mapping[str, torch.Tensor]], torch.Tensor]  # (outputs, batch) -> [B]


def gradient_sums(
    model: nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    reduce: Callable[[torch.Tensor], torch.Tensor],
    *,
    loss_fn: LossFn | None = None,
    mask: Mapping[str, torch.Tensor] | None = None,
    progress: bool = False,
    desc: str = "scoring",
) -> tuple[dict[str, torch.Tensor], int]:
    """({site: sum over batches of ``reduce(g)``}, examples scored), with ``g`` [n_valid, H] float64 the
    per-example mask gradients of a batch's examples that have anything to score.

    The sums are accumulated in float64 on each site's device (no copy per batch) and moved to the CPU
    once, at the end. Inside :func:`headprune.distributed.sharded`, each rank takes every world-th batch
    and the sums and counts are all-reduced. NaN or inf in the model's weights, a batch's losses or the sums are
    refused (:class:`~headprune.errors.NonFiniteError`, :mod:`headprune.core.model.finite`)."""
    check_finite_weights(model)
    totals: dict[str, torch.Tensor] = {}
    counts: list[torch.Tensor] = []  # [] per batch, on the device: no synchronisation per batch
    losses: list[torch.Tensor] = []  # [B] per batch, on the device, checked at the end
    rank, world = rank_world()
    total = len(range(rank, len(batches), world)) if isinstance(batches, Sized) else None  # this rank's batches
    for batch in progress_bar(shard(batches), desc=desc, unit="batch", total=total, show=progress):
        grads, valid, batch_losses = _batch_gradients(model, batch, loss_fn, mask)
        counts.append(valid.sum())
        losses.append(batch_losses)
        for name, g in grads.items():  # g [B, H]
            part = reduce(g[valid.to(g.device)].to(accumulator_device(g.device), torch.float64))
            totals[name] = part if name not in totals else totals[name] + part
    count = int(sum(int(c) for c in counts))
    totals, count = reduce_sums(totals, count)  # over the ranks under torchrun (headprune.distributed)
    totals = {name: t.cpu() for name, t in totals.items()}
    if count == 0:
        raise ConfigError("batches: no example had anything to score (empty input or all padding)")
    refused = [m for m in gather(nonfinite_losses(losses, rank, world)) if m]  # every rank, or none, raises
    if refused:
        raise NonFiniteError(refused[0])
    check_finite_scores(totals, f"the {desc} sums")  # never pick heads from NaN scores
    return totals, count


def mask_gradients(
    model: nn.Module, batch: Mapping[str, torch.Tensor], *, loss_fn: LossFn | None = None,
    mask: Mapping[str, torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Per-example mask gradients of one batch: ({site: dL_b/dxi [B, H]}, valid [B] bool).

    One forward and one backward; parameters are frozen meanwhile; the model runs in eval mode. NaN or inf
    weights or losses are refused (:class:`~headprune.errors.NonFiniteError`).
    """
    check_finite_weights(model)
    grads, valid, losses = _batch_gradients(model, batch, loss_fn, mask)
    check_finite(losses, "the losses of the batch (one per example)")
    return grads, valid


def _batch_gradients(model: nn.Module, batch: Mapping[str, torch.Tensor], loss_fn: LossFn | None,
                     mask: Mapping[str, torch.Tensor] | None) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """:func:`mask_gradients` without its checks, and the batch's losses [B] (0 where not valid), detached."""
    n = batch_size(batch)
    batch = to_device(batch, input_device(model))
    xi = ones_mask(model, n)  # on each site's device
    for name, value in (mask or {}).items():  # start from the given [H] mask, one row per example
        xi[name] = torch.as_tensor(value, dtype=torch.float32).to(xi[name].device).expand(n, -1).clone()
    for t in xi.values():
        t.requires_grad_(True)
    with scoring_mode(model), masked(model, xi), torch.enable_grad():
        losses, valid = batch_losses(model, batch, loss_fn)
        names = list(xi)
        grads = torch.autograd.grad((losses * valid).sum(), [xi[n] for n in names], allow_unused=True)
    out = {n: (g if g is not None else torch.zeros_like(xi[n])).detach() for n, g in zip(names, grads, strict=True)}
    return out, valid, torch.where(valid, losses.detach(), 0.0)


def mean_loss(model: nn.Module, batches: Iterable[Mapping[str, torch.Tensor]], *, mask: HeadMask | None = None,
              loss_fn: LossFn | None = None) -> float:
    """Mean per-example loss over ``batches`` (the same loss the scores use), under ``mask``; no gradients.
    NaN or inf weights or losses are refused (:class:`~headprune.errors.NonFiniteError`)."""
    check_finite_weights(model)
    total, n = 0.0, 0
    with scoring_mode(model), torch.no_grad(), (masked(model, mask) if mask else nullcontext()):
        for i, batch in enumerate(batches):
            losses, valid = batch_losses(model, to_device(batch, input_device(model)), loss_fn)
            check_finite(losses[valid], f"the losses of batch {i} (one per example)")
            total += float(losses[valid].sum())
            n += int(valid.sum())
    if n == 0:
        raise ConfigError("batches: no example had a loss (empty input or all padding)")
    return total / n


def batch_losses(model: nn.Module, batch: Mapping[str, torch.Tensor],
                 loss_fn: LossFn | None) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] losses, [B] valid) of one forward of ``model`` on ``batch`` (on the model's input device), as
    :func:`example_losses` gives them. The model's own loss of a model with outputs per token (not an
    encoder-decoder) is computed from its hidden states chunk by chunk (:mod:`headprune.core.model.chunked`), never
    from all its ``[B, T, V]`` logits at once; only the first batch's check of the shift
    (:func:`own_loss_check`) runs the batch's row with the most targets with its full logits, ``[1, T, V]``."""
    if loss_fn is None and _token_model(model, batch):
        shift = _checked_shift(model, batch)
        out = token_outputs(model, model_inputs(model, batch, cache=False))
        if out.chunked:
            labels = _shifted_labels(_labels(batch, shift), shift, batch.get("attention_mask"))
            token = (out.shifted() if shift else out).token_nll(labels)  # [B, T'] 0 where not scored
            n_tokens = (labels != -100).sum(-1).to(token.device)
            return token.sum(-1) / n_tokens.clamp_min(1), (n_tokens > 0) & rows_with_tokens(batch).to(token.device)
        return example_losses(model, batch, out.outputs, None)
    outputs = model(**model_inputs(model, batch, labels=loss_fn is not None, cache=False))
    return example_losses(model, batch, outputs, loss_fn)


def _token_model(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``model`` may have outputs per token that the chunked loss covers: an output head
    (``get_output_embeddings()``), not an encoder-decoder, ``input_ids [B, T]`` and labels absent or ``[B, T]``."""
    base = unwrap(model)
    get = getattr(base, "get_output_embeddings", None)
    ids, labels = batch.get("input_ids"), batch.get("labels")
    return (callable(get) and isinstance(get(), nn.Module) and not getattr(base.config, "is_encoder_decoder", False)
            and isinstance(ids, torch.Tensor) and ids.dim() == 2 and (labels is None or labels.dim() == 2))


def _checked_shift(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> bool:
    """:func:`own_loss_check` for the chunked loss, on the batch's row with the most targets alone (with any
    batched mask cut to that row), so that the check's full logits are one row's; the whole batch where an
    input is not one row per example."""
    known = unwrap(model).__dict__.get(_CHECKED)
    if known is not None:
        return known
    n = batch_size(batch)
    if any(not isinstance(v, torch.Tensor) or not v.dim() or v.shape[0] != n for v in batch.values()):
        return own_loss_check(model, batch, None)
    r = int((_labels(batch, True) != -100).sum(-1).argmax())
    with row_of_masks(model, r):
        return own_loss_check(model, {k: v[r:r + 1] for k, v in batch.items()}, None)


def example_losses(model: nn.Module, batch: Mapping[str, torch.Tensor], outputs,
                    loss_fn: LossFn | None) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] losses, [B] valid) of one batch: ``loss_fn``'s, else the model's own; rows without tokens invalid."""
    n = batch_size(batch)
    if loss_fn is not None:
        losses = loss_fn(outputs, batch)
        valid = torch.ones(n, dtype=torch.bool, device=losses.device)
    else:
        losses, valid = per_example_loss(model, batch, outputs)
    if losses.shape != (n,):
        raise ConfigError(f"loss_fn must return one loss per example, shape ({n},); "
                          f"got {tuple(losses.shape)}")
    return losses, valid & rows_with_tokens(batch).to(valid.device)


def per_example_loss(model: nn.Module, batch: Mapping[str, torch.Tensor], outputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's own loss, one value per example: ([B] losses, [B] valid).

    Sequence classification: cross-entropy (MSE for one regression label). Token outputs
    (causal LM, seq2seq, token classification): mean cross-entropy over the example's tokens
    whose label is not -100 (labels shifted by one where the model shifts them; a model that shifts
    and has no labels predicts its own ``input_ids`` where ``attention_mask`` is 1, and no target is
    scored whose predicting position is padding: the first real token of a left-padded row has no context).

    Whether the labels are shifted is decided by what the model does, once per model
    (:func:`own_loss_check`): headprune's loss must equal the model's own ``.loss`` on the first batch
    scored, or the model is refused for scoring (pass a ``loss_fn``).
    """
    shift = own_loss_check(model, batch, outputs)
    losses, n_tokens = _example_losses(outputs.logits, _labels(batch, shift), shift, batch.get("attention_mask"))
    return losses, n_tokens > 0


def own_loss_check(model: nn.Module, batch: Mapping[str, torch.Tensor], outputs) -> bool:
    """Whether the model shifts token labels by one (a causal LM does), decided by behaviour and checked.

    On ``batch``, headprune's loss (the mean over the scored tokens, or over examples, reduced as models
    reduce it) must equal the model's own ``.loss`` for the same batch and labels, within what float
    rounding explains (:func:`loss_tolerance`); NaN or inf outputs are a :class:`NonFiniteError`; else
    :class:`UnsupportedModelError` (pass ``loss_fn=``). Token outputs of a model that is not an
    encoder-decoder: the batch's row with the most targets is run once more with labels built to tell the two
    apart (each position's target is the token the position before predicts best: shifted and unshifted
    cross-entropy then differ even on a random model). Run on a model's first batch only: the answer is kept
    on the model (a copy keeps it too).
    """
    model = unwrap(model)
    known = model.__dict__.get(_CHECKED)
    if known is not None:
        return known
    report = own_loss_report(model, batch, outputs)
    own, candidates = report["own"], report["candidates"]
    agree = [shift for shift, value in candidates.items() if _close(value, own, report["rtol"])]
    if not agree:
        mine = ", ".join(f"{v:.8g} ({'labels shifted' if k else 'unshifted'})" for k, v in candidates.items())
        raise UnsupportedModelError(
            f"model of class {type(model).__name__}: its own loss on the first batch is {own!r}, headprune's "
            f"per-example loss gives {mine} (relative tolerance {report['rtol']:.2g}); headprune scores only "
            "with a loss it has checked against the model's own .loss; allowed: pass loss_fn=(outputs, batch) "
            "-> [batch] losses (from the CLI: a --task whose loss is the model's own)")
    assert own is not None  # agree is empty without it (_close)
    shift = min(agree, key=lambda k: abs(candidates[k] - own))
    model.__dict__[_CHECKED] = shift
    return shift


def own_loss_report(model: nn.Module, batch: Mapping[str, torch.Tensor], outputs=None) -> dict:
    """What :func:`own_loss_check` compares: ``{"own": the model's .loss (None without one), "candidates":
    {shifted: headprune's loss}, "targets": how many targets the mean is over, "rtol": the tolerance}``.

    ``outputs``: the model's outputs on ``batch`` (without labels), computed here when not given."""
    model = unwrap(model)
    with torch.no_grad():
        if outputs is None:
            outputs = model(**model_inputs(model, to_device(batch, input_device(model)), labels=False, cache=False))
        logits = _logits(model, outputs)
        if logits.dim() == 2 or getattr(model.config, "is_encoder_decoder", False):
            # classification; seq2seq (its labels build its decoder inputs, so outputs has its loss)
            labels = _labels(batch, False)
            _check_label_shape(model, logits, labels)
            own = getattr(outputs, "loss", None) if logits.dim() == 3 else None
            own = own if own is not None else _own_loss(model, batch, labels)
            candidates = {False: _mean_loss(logits, labels, False, None)}
        else:
            own, candidates = _shift_probe(model, batch, logits)
    check_finite(logits, f"the logits of {type(model).__name__} on the first batch")
    check_finite(torch.tensor([v for v, _ in candidates.values()]), "headprune's losses of the first batch")
    targets = max(n for _, n in candidates.values())
    return {"own": None if own is None else float(own.detach().float()), "targets": targets,
            "candidates": {shift: value for shift, (value, _) in candidates.items()},
            "rtol": loss_tolerance(logits, targets)}


_CHECKED = "_headprune_shifts_labels"  # the answer of own_loss_check, kept on the model it was checked on


def _shift_probe(model: nn.Module, batch: Mapping[str, torch.Tensor], logits: torch.Tensor):
    """(own loss, {shifted: (loss, targets)}) of a model with token outputs, on labels that tell the shifts
    apart: first each target is what the position before predicts best; where that leaves the two equal
    (a model predicting one token everywhere), random labels on the same targets."""
    scored = _labels(batch, True)
    _check_label_shape(model, logits, scored)
    with _fullest_row(model, batch, logits, scored) as (batch, logits, scored):
        return _probe_shifts(model, batch, logits, scored)


def _probe_shifts(model: nn.Module, batch: Mapping[str, torch.Tensor], logits: torch.Tensor, scored: torch.Tensor):
    """:func:`_shift_probe` on ``batch`` as given."""
    labels = _telling_labels(logits, scored, batch.get("attention_mask"))
    if not bool((labels != -100).any()):  # one token a row: nothing a causal LM could be scored on
        labels = _labels(batch, False)
        return _own_loss(model, batch, labels), {False: _mean_loss(logits, labels, False, None)}
    for attempt in range(2):
        candidates = {shift: _mean_loss(logits, labels, shift, None) for shift in (True, False)}
        own = _own_loss(model, batch, labels)
        (a, n), (b, _) = candidates[True], candidates[False]
        if attempt or abs(a - b) > 2 * loss_tolerance(logits, n) * max(abs(a), abs(b), 1e-6):
            break
        g = torch.Generator().manual_seed(0)
        random = torch.randint(0, logits.shape[-1], labels.shape, generator=g).to(labels.device)
        labels = random.masked_fill(labels == -100, -100)
    return own, candidates


@contextmanager
def _fullest_row(model: nn.Module, batch: Mapping[str, torch.Tensor], logits: torch.Tensor, labels: torch.Tensor):
    """(``batch``, ``logits`` [B, T, V], ``labels`` [B, T]) cut to the row with the most targets, with any batched
    mask applied to ``model`` cut to that row too: a shift shows on one row as on all, and the model's own loss is
    then one row's forward, not the batch's. Uncut where an input is not one row per example (images, say: which
    belong to which row is the model's business)."""
    n = logits.shape[0]
    if n == 1 or any(not isinstance(v, torch.Tensor) or not v.dim() or v.shape[0] != n for v in batch.values()):
        yield batch, logits, labels
        return
    r = int((labels != -100).sum(-1).argmax())
    with row_of_masks(model, r):
        yield {k: v[r:r + 1] for k, v in batch.items()}, logits[r:r + 1], labels[r:r + 1]


def _logits(model: nn.Module, outputs) -> torch.Tensor:
    logits = getattr(outputs, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise UnsupportedModelError(
            f"model of class {type(model).__name__} returns no logits (a base model without a head has no loss "
            "of its own to check); allowed: a model with a task head, or loss_fn=(outputs, batch) -> [batch] losses")
    return logits.detach()


def _check_label_shape(model: nn.Module, logits: torch.Tensor, labels: torch.Tensor) -> None:
    """Labels [B] for outputs [B, C], labels [B, T] for outputs [B, T, V]."""
    if labels.dim() != logits.dim() - 1:
        raise ConfigError(f"batch labels of shape {tuple(labels.shape)} do not fit the outputs of "
                          f"{type(model).__name__}, of shape {tuple(logits.shape)}; allowed: labels [batch] for a "
                          "classifier, [batch, tokens] for a model with outputs per token")


def _labels(batch: Mapping[str, torch.Tensor], shift: bool) -> torch.Tensor:
    """The batch's labels; a model that shifts them and has none predicts its own real ``input_ids``."""
    labels = batch.get("labels")
    if labels is None and shift and "input_ids" in batch:
        ids = batch["input_ids"]
        labels = ids.masked_fill(batch.get("attention_mask", torch.ones_like(ids)) == 0, -100)
    if labels is None:
        raise ConfigError("batch has no 'labels'; pass labels in the batch or a loss_fn(outputs, batch) -> [batch]")
    return labels


def _example_losses(logits: torch.Tensor, labels: torch.Tensor, shift: bool,
                    attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] losses, [B] how many targets each: 1 or 0 for a classification) from logits [B, C] or [B, T, V]."""
    logits = logits.float() if logits.is_floating_point() and logits.element_size() < 4 else logits  # float32 at least
    labels = labels.to(logits.device)  # a model spread by a device_map returns its logits on the last device
    if logits.dim() == 2:  # [B, C]
        if logits.shape[-1] == 1 and labels.is_floating_point():
            losses = F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype), reduction="none")
            return losses, torch.ones_like(losses, dtype=torch.long)
        valid = labels != -100
        return F.cross_entropy(logits, labels.clamp_min(0), reduction="none") * valid, valid.long()
    logits, labels = (logits[:, :-1] if shift else logits), _shifted_labels(labels, shift, attention_mask)
    token = token_cross_entropy(logits, labels)  # [B, T], 0 where not scored
    n_tokens = (labels != -100).sum(-1)
    return token.sum(-1) / n_tokens.clamp_min(1), n_tokens


def _shifted_labels(labels: torch.Tensor, shift: bool, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """The targets of positions ``0 .. T-2`` (``labels[:, 1:]``) where ``shift``, else ``labels``; a target
    predicted from a padding position (left padding) means nothing and is not scored (-100)."""
    if not shift:
        return labels
    labels = labels[:, 1:]
    if attention_mask is not None:
        labels = labels.masked_fill(attention_mask[:, :-1].to(labels.device) == 0, -100)
    return labels


def _mean_loss(logits: torch.Tensor, labels: torch.Tensor, shift: bool,
               attention_mask: torch.Tensor | None) -> tuple[float, int]:
    """(what a model's own ``.loss`` is, how many targets it averages): the mean over all scored targets of
    the batch (tokens, or examples), reduced as models reduce it: one sum over the targets, one division."""
    logits = logits.float() if logits.is_floating_point() and logits.element_size() < 4 else logits
    labels = labels.to(logits.device)
    if logits.dim() == 2:
        losses, n = _example_losses(logits, labels, shift, attention_mask)
        return float(losses.sum() / n.sum().clamp_min(1)), int(n.sum())
    logits, labels = (logits[:, :-1] if shift else logits), _shifted_labels(labels, shift, attention_mask)
    n = int((labels != -100).sum())
    return float(token_cross_entropy(logits, labels).sum() / max(n, 1)), n


def loss_tolerance(logits: torch.Tensor, n_targets: int) -> float:
    """Relative tolerance between two computations of one mean cross-entropy that differ only in rounding.

    float32 (the dtype models compute their loss in, at least): the log-sum-exp over ``V`` classes and the
    sum over ``n`` targets each round within about ``log2(V) + log2(n)`` units of float32 epsilon (pairwise
    sums), taken 8 times over; a model whose logits are narrower may compute its loss in their dtype, so
    4 epsilons of that dtype at least. SmolLM2 (1,016 targets, V 49,152) gets 2.5e-5; the gap measured there,
    like with like, is 1e-7 (``benchmarks/own_loss_tolerance.py``), and a wrong shift misses by far more.
    """
    eps = torch.finfo(torch.float32).eps
    classes = logits.shape[-1] if logits.dim() > 1 else 1
    rtol = 8 * eps * (math.log2(max(classes, 2)) + math.log2(max(n_targets, 2)))
    if logits.is_floating_point() and logits.element_size() < 4:
        rtol = max(rtol, 4 * torch.finfo(logits.dtype).eps)
    return rtol


def _telling_labels(logits: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Labels [B, T] where position t's target is what position t-1 predicts best (where t is a target a
    shifting model would score): a shifting model's loss is then the lowest its logits allow, an unshifted
    one's is not."""
    best = logits.argmax(-1).to(labels.device)  # [B, T]
    told = torch.full_like(labels, -100)
    told[:, 1:] = best[:, :-1]
    scored = torch.zeros_like(labels, dtype=torch.bool)
    scored[:, 1:] = labels[:, 1:] != -100
    if attention_mask is not None:
        scored[:, 1:] &= attention_mask[:, :-1].to(labels.device) != 0
    return told.masked_fill(~scored, -100)


def _own_loss(model: nn.Module, batch: Mapping[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor | None:
    """The model's ``.loss`` on ``batch`` with ``labels`` (None when it returns none)."""
    inputs = model_inputs(model, batch, labels=True, cache=False)
    inputs["labels"] = labels
    try:
        return getattr(model(**inputs), "loss", None)
    except TypeError:  # a forward that takes no labels
        return None


def _close(value: float, own: float | None, rtol: float = 1e-4) -> bool:
    return own is not None and math.isfinite(own) and abs(value - own) <= rtol * max(abs(own), 1e-6)


@contextmanager
def scoring_mode(model: nn.Module):
    """Eval mode and frozen parameters, restored afterwards."""
    was_training = model.training
    frozen = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)
        model.train(was_training)
