"""Torch-Pruning 1.6.1 (Fang et al., "DepGraph: Towards Any Structural Pruning", CVPR 2023; PyPI
``torch-pruning==1.6.1``) run with its own BERT recipe, ``examples/transformers/prune_hf_bert.py`` of
github.com/VainF/Torch-Pruning (read, not copied): ``BasePruner`` (``MetaPruner``) with
``MagnitudeImportance(p=2, group_reduction="mean")``, no global pruning, one step, ``num_heads`` per
query/key/value projection, ``prune_num_heads=True``, ``prune_head_dims=False``, the same ratio for heads
(``head_pruning_ratio``) and channels (``pruning_ratio``); the pooler ignored (here also the classifier, whose
outputs are the labels); then the recipe's attribute updates of every ``BertSelfAttention``
(``num_attention_heads``, ``attention_head_size``, ``all_head_size``). Head dimensions are not pruned, so the
attention scaling is unchanged.

The recipe narrows the hidden size too (embeddings, LayerNorms, every projection's input), which has no
head/neuron plan, so it is not applied through headprune's surgery; it runs as published on a copy of the model
in a forked child process under a time limit, and reports the phase it reached (``grouping``: the pruner's
constructor tracing the dependency graph; ``pruning``; ``matching``) and, on success, the pruned model (saved
by the child, loaded by the parent: every row is evaluated by the harness after every plan is made).

Matched FLOPs: the ratio is a width ratio. The child bisects it (each try prunes a fresh copy) for the largest
kept FLOPs of the heads and FFN neurons -- headprune's ``price="flops"`` pool at ``seq_len``, counted on the
pruned model by the same counter as every other row -- that does not exceed the target.
"""

from __future__ import annotations

import copy
import faulthandler
import multiprocessing as mp
import queue
import tempfile
import time
import traceback
from pathlib import Path

import torch
from torch import nn

from headprune.core.model.unit_cost import unit_costs

from .torch_pruning_run import _stack, installed_version

STEPS = 14  # bisection steps of the ratio


def run_recipe(model: nn.Module, example: dict, ratio: float, report=lambda phase: None) -> nn.Module:
    """Prune ``model`` (a BERT-style sequence classifier) in place as ``prune_hf_bert.py`` does."""
    import torch_pruning as tp

    attentions = [m for m in model.modules() if hasattr(m, "query") and hasattr(m, "num_attention_heads")
                  and hasattr(m, "attention_head_size")]
    num_heads = {}
    for m in attentions:
        for proj in (m.query, m.key, m.value):
            num_heads[proj] = m.num_attention_heads
    ignored = [m for m in (getattr(model.base_model, "pooler", None), getattr(model, "classifier", None)) if m is not None]
    report("grouping")
    pruner = tp.pruner.BasePruner(
        model, example, global_pruning=False, importance=tp.importance.MagnitudeImportance(p=2, group_reduction="mean"),
        iterative_steps=1, pruning_ratio=ratio, num_heads=num_heads, prune_head_dims=False, prune_num_heads=True,
        head_pruning_ratio=ratio, output_transform=lambda out: out.logits.sum(), ignored_layers=ignored)
    report("pruning")
    for group in pruner.step(interactive=True):
        group.prune()
    for m in attentions:
        m.num_attention_heads = pruner.num_heads[m.query]
        m.attention_head_size = m.query.out_features // m.num_attention_heads
        m.all_head_size = m.query.out_features
    return model


def pool_flops(model: nn.Module, seq_len: int) -> float:
    """FLOPs per example of the heads and FFN neurons (headprune's ``price="flops"`` pool)."""
    return unit_costs(model, "flops", seq_len=seq_len).total()


def matched(model: nn.Module, example: dict, target: float, seq_len: int, report) -> tuple[nn.Module, dict]:
    """The recipe at the smallest ratio (of :data:`STEPS` bisection steps) whose pool FLOPs are <= ``target``."""
    lo, hi = 0.0, 0.95
    best, tries = None, []
    for step in range(STEPS):
        ratio = (lo + hi) / 2
        pruned = run_recipe(copy.deepcopy(model), example, ratio, report if step == 0 else (lambda p: None))
        if step == 0:
            report("matching")
        kept = pool_flops(pruned, seq_len)
        tries.append({"ratio": ratio, "pool_flops": kept})
        if kept <= target:
            best, hi = (pruned, ratio, kept), ratio
        else:
            lo = ratio
    if best is None:
        pruned = run_recipe(copy.deepcopy(model), example, hi)
        best = (pruned, hi, pool_flops(pruned, seq_len))
    return best[0], {"ratio": best[1], "pool_flops": best[2], "tries": tries}


def _child(model, example, target, seq_len, out, path, stack_file, stack_after):
    def report(phase):
        out.put(("phase", phase, time.perf_counter()))

    stacks = open(stack_file, "w")  # noqa: SIM115 -- open until the child ends: faulthandler writes to it
    faulthandler.dump_traceback_later(stack_after, file=stacks)
    try:
        torch.set_num_threads(1)
        start = time.perf_counter()
        pruned, info = matched(model, example, target, seq_len, report)
        seconds = time.perf_counter() - start
        torch.save(pruned, path)
        out.put(("done", info | {"prune_seconds": seconds}, time.perf_counter()))
    except BaseException as e:  # the recipe's failure is the result
        out.put(("error", f"{type(e).__name__}: {e}", traceback.format_exc(limit=3)))


def torch_pruning_encoder(model: nn.Module, example: dict, target_flops: float, *, seq_len: int = 128,
                          timeout: float = 600.0) -> tuple[nn.Module | None, dict]:
    """(the pruned model or None, the row's record: status ok | failed | timeout | unavailable, phase reached,
    seconds, the matched ratio and its pool FLOPs)."""
    try:
        import torch_pruning as tp
    except ImportError as e:
        return None, {"status": "unavailable", "reason": f"torch_pruning not importable: {e}"}
    info = {"package": "torch-pruning", "version_installed": installed_version(),
            "module_version": getattr(tp, "__version__", "?"), "recipe": "examples/transformers/prune_hf_bert.py",
            "importance": "MagnitudeImportance(p=2, group_reduction='mean')", "timeout_s": timeout}
    if next(model.parameters()).device.type != "cpu":
        return None, info | {"status": "unavailable", "reason": "the recipe runs in a forked child: CPU models only"}
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    path = tempfile.NamedTemporaryFile(suffix=".pt", delete=False).name  # noqa: SIM115
    stack_file = tempfile.NamedTemporaryFile(suffix=".txt", delete=False).name  # noqa: SIM115
    start = time.perf_counter()
    child = ctx.Process(target=_child, args=(model, example, target_flops, seq_len, out, path, stack_file,
                                             max(1.0, 0.9 * timeout)), daemon=True)
    child.start()
    phases: dict[str, float] = {}
    status, result = "timeout", None
    while time.perf_counter() - start < timeout:
        try:
            kind, value, _ = out.get(timeout=min(5.0, max(0.1, timeout - (time.perf_counter() - start))))
        except queue.Empty:
            if not child.is_alive():
                status, result = "failed", f"the child process ended without a result (exit code {child.exitcode})"
                break
            continue
        if kind == "phase":
            phases[value] = time.perf_counter() - start
        else:
            status, result = ("ok" if kind == "done" else "failed"), value
            break
    seconds = time.perf_counter() - start
    if child.is_alive():
        child.terminate()
    child.join(10)
    phase = max(phases, key=phases.get) if phases else "starting"
    row = info | {"status": status, "phase_reached": phase, "phase_started_s": phases, "seconds": seconds}
    pruned = None
    if status == "ok":
        row |= result
        pruned = torch.load(path, weights_only=False).eval()
    elif status == "failed":
        row["error"] = result
    else:
        row["error"] = f"did not finish within {timeout:.0f} s (still in phase {phase!r})"
        row["stack_at_timeout"] = _stack(stack_file)
    for f in (path, stack_file):
        Path(f).unlink(missing_ok=True)
    return pruned, row
