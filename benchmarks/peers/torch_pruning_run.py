"""Torch-Pruning 1.6.1 (Fang et al., "DepGraph: Towards Any Structural Pruning", CVPR 2023; PyPI
``torch-pruning==1.6.1``) run with its own LLM recipe, ``examples/LLMs/prune_llm.py`` of github.com/VainF/Torch-Pruning
(read, not copied): ``BasePruner`` with ``GroupMagnitudeImportance(p=2, group_reduction="mean")``, no global
pruning, ``lm_head`` ignored, ``num_heads`` per q/k/v projection, ``prune_num_heads=True``,
``prune_head_dims=False``, ``round_to=4``, the same ratio for the hidden size and for heads; then the recipe's
attribute updates (``num_heads``, ``num_key_value_groups``, ``config.hidden_size`` / ``intermediate_size``).

This peer is *not* applied through headprune's surgery: the recipe also narrows the hidden size (embedding
columns, norms, every projection's input), which has no head/neuron plan. It runs as the recipe does, on a copy
of the model in a child process under a time limit, and reports what it reached: the phase (``grouping``: the
``BasePruner`` constructor tracing the dependency graph; ``pruning``; ``evaluating``), the seconds, and on
success the pruned model's parameters and the harness's perplexities. Its ratio is a width ratio; as width
pruning shrinks most matrices on both sides, ``ratio = 1 - sqrt(1 - budget)`` aims at the parameter budget,
and the parameters it actually leaves are reported (not matched).

The child is forked (the recipe's model is built in this process); a time-out ends the child alone.
"""

from __future__ import annotations

import faulthandler
import math
import multiprocessing as mp
import queue
import re
import tempfile
import time
import traceback
from pathlib import Path

import torch
from torch import nn

from .plan import nonembedding_params

VERSION = "1.6.1"


def width_ratio(budget: float) -> float:
    """The recipe's pruning ratio aimed at removing ``budget`` of the parameters (both sides of most matrices)."""
    return 1 - math.sqrt(1 - budget)


def run_recipe(model: nn.Module, example: torch.Tensor, ratio: float, report) -> nn.Module:
    """Prune ``model`` in place as ``prune_llm.py`` does; ``report(phase)`` is called as each phase starts."""
    import torch_pruning as tp

    config = model.config
    num_heads = {}
    for name, m in model.named_modules():
        if name.endswith("self_attn") and hasattr(m, "q_proj"):
            num_heads[m.q_proj] = config.num_attention_heads
            num_heads[m.k_proj] = config.num_key_value_heads
            num_heads[m.v_proj] = config.num_key_value_heads
    gqa = config.num_attention_heads != config.num_key_value_heads
    report("grouping")
    pruner = tp.pruner.BasePruner(
        model, example_inputs=example, importance=tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean"),
        global_pruning=False, output_transform=lambda x: x.logits, pruning_ratio=ratio,
        ignored_layers=[model.lm_head], num_heads=num_heads, prune_num_heads=True, prune_head_dims=False,
        head_pruning_ratio=ratio, out_channel_groups={}, round_to=4)
    report("pruning")
    for group in pruner.step(interactive=True):
        group.prune()
    config.hidden_size = model.lm_head.in_features
    for name, m in model.named_modules():
        if name.endswith("self_attn"):
            m.hidden_size = m.q_proj.out_features
            m.num_heads = m.hidden_size // m.head_dim
            config.num_attention_heads = m.num_heads
            if not gqa:
                m.num_key_value_heads = m.num_heads
                config.num_key_value_heads = m.num_heads
            if hasattr(m, "num_key_value_groups"):
                m.num_key_value_groups = m.num_heads // config.num_key_value_heads
        elif name.endswith("mlp") and hasattr(m, "gate_proj"):
            m.hidden_size = m.gate_proj.in_features
            config.intermediate_size = m.gate_proj.out_features
    return model


def _child(model, example, ratio, evaluate, out, stack_file, stack_after):
    def report(phase):
        out.put(("phase", phase, time.perf_counter()))

    stacks = open(stack_file, "w")  # noqa: SIM115 -- open until the child ends: faulthandler writes to it
    faulthandler.dump_traceback_later(stack_after, file=stacks)  # where the recipe is, should it not finish
    try:
        torch.set_num_threads(1)
        start = time.perf_counter()
        run_recipe(model, example, ratio, report)
        pruned_s = time.perf_counter() - start
        report("evaluating")
        result = {"prune_seconds": pruned_s, "nonembedding_params": nonembedding_params(model),
                  "params": sum(p.numel() for p in model.parameters()), "evaluation": evaluate(model)}
        out.put(("done", result, time.perf_counter()))
    except BaseException as e:  # the recipe's failure is the result
        out.put(("error", f"{type(e).__name__}: {e}", traceback.format_exc(limit=3)))


def torch_pruning_row(model: nn.Module, example: torch.Tensor, budget: float, evaluate, *, timeout: float) -> dict:
    """Run the recipe on ``model`` (unchanged here: the child prunes its own copy) within ``timeout`` seconds.
    ``evaluate(pruned) -> dict`` runs in the child. Returns ``status`` (ok | failed | timeout | unavailable),
    the phase reached, the seconds, and ``result`` on success."""
    try:
        import torch_pruning as tp
    except ImportError as e:
        return {"status": "unavailable", "reason": f"torch_pruning not importable: {e}"}
    found = getattr(tp, "__version__", "?")
    info = {"package": "torch-pruning", "version_installed": installed_version(), "module_version": found,
            "recipe": "examples/LLMs/prune_llm.py (v1.6.1)", "ratio": width_ratio(budget), "timeout_s": timeout}
    if next(model.parameters()).device.type != "cpu":
        return info | {"status": "unavailable", "reason": "the recipe runs in a forked child: CPU models only"}
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start = time.perf_counter()
    stack_file = tempfile.NamedTemporaryFile(suffix=".txt", delete=False).name  # noqa: SIM115
    child = ctx.Process(target=_child, args=(model, example, width_ratio(budget), evaluate, out, stack_file,
                                             max(1.0, 0.9 * timeout)), daemon=True)
    child.start()
    phases: dict[str, float] = {}
    status, result = "timeout", None
    while time.perf_counter() - start < timeout:
        try:
            kind, value, extra = out.get(timeout=min(5.0, max(0.1, timeout - (time.perf_counter() - start))))
        except queue.Empty:
            if not child.is_alive():
                status, result = "failed", "the child process ended without a result (exit code "  \
                    f"{child.exitcode})"
                break
            continue
        if kind == "phase":
            phases[value] = time.perf_counter() - start
        elif kind == "done":
            status, result = "ok", value
            break
        else:
            status, result = "failed", value
            break
    seconds = time.perf_counter() - start
    if child.is_alive():
        child.terminate()
    child.join(10)
    phase = max(phases, key=phases.get) if phases else "starting"
    row = info | {"status": status, "phase_reached": phase, "phase_started_s": phases, "seconds": seconds}
    if status == "ok":
        row["result"] = result
    elif status == "failed":
        row["error"] = result
    else:
        row["error"] = f"did not finish within {timeout:.0f} s (still in phase {phase!r})"
        row["stack_at_timeout"] = _stack(stack_file)
    Path(stack_file).unlink(missing_ok=True)
    return row


def _stack(path: str) -> list[str]:
    """The innermost frames faulthandler wrote of the thread running the recipe (file:line in function),
    innermost first, site-packages paths shortened."""
    sections, current = [], []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith(("Thread ", "Current thread ")):
            current = []
            sections.append(current)
        elif line.startswith("File ") and sections:
            current.append(line)
    main = next((f for f in sections if any("torch_pruning" in x for x in f)), sections[0] if sections else [])
    return [_short(f) for f in main[:8]]


def _short(frame: str) -> str:
    """A frame's file without this machine's folders: from ``site-packages/`` or the interpreter's ``lib/pythonX.Y/``
    on, or relative to the repository root."""
    if "site-packages/" in frame:
        return frame.replace(frame.split("site-packages/")[0], "")
    root = str(Path(__file__).resolve().parents[2]) + "/"
    if root in frame:
        return frame.replace(root, "")
    return re.sub(r'"/[^"]*?/(lib/python[\d.]+/)', r'"\1', frame)


def installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch-pruning")
    except PackageNotFoundError:
        return None
