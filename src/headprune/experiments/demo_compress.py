"""Act two of the demo: the same model made smaller -- 20% of its non-embedding parameters removed.

Act one (:mod:`.demo`) is the paper's heads-only study, which on SmolLM2 removes a few heads. Act two
compresses the unpruned model to 80% of its non-embedding parameters (every parameter but the input and
output embeddings) two ways, on the same calibration text:

- headprune: ``compress(model, batches, PruneSettings(...))`` with the configuration the peer table selects
  at 20% (``headprune-fisher+linear`` in ``benchmarks/peers/headprune_rows.py``: Fisher scores of heads and
  FFN neurons under one parameter budget, each removed feature replaced by its least-squares affine
  prediction from the kept ones, damping 0.3), the budget converted as that file does, every width it changes
  a multiple of 32 (Q8_0's block, as the README's llama.cpp table prunes: the GGUF file shrinks with the model);
- FLAP (An et al. 2024, :mod:`headprune.peers.flap`), under the same exactly priced budget.

Then the held-out perplexities side by side, each with a paired bootstrap interval of its ratio to the
unpruned model's over the held-out blocks (:func:`headprune.evaluation.significance.perplexity_ratio`);
a short recovery of headprune's model by distillation from the unpruned one
(:func:`headprune.compression.recover.recover`); both models as Q8_0 GGUF files (and llama.cpp's speed where
``llama-cpp-python`` is installed); one summary table and a figure of perplexity against parameters removed.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from ..compression import PruneSettings, compress
from ..compression.compensations import Linear
from ..compression.recover import RecoverHooks, RecoverSettings, recover, split_blocks
from ..core.model.unit_cost import unit_costs
from ..evaluation.lm import LanguageModelling, lm_blocks
from ..evaluation.significance import perplexity_ratio
from ..peers.flap import apply_flap, flap
from ..peers.ledger import nonembedding_params

HEADPRUNE = "headprune-fisher+linear"  # benchmarks/peers/headprune_rows.py: the peer table's choice at 20%
HEADPRUNE_FIELDS = {"units": "both", "price": "params", "scores": "fisher", "compensate": [Linear(damping=0.3)]}
# Every width the plan changes a multiple of 32, Q8_0's block (as the README's llama.cpp table prunes): an FFN width
# off the block leaves its down projection in F16 in the GGUF, and the file barely shrinks (a first run: 28 of 30
# down projections, 0.96x the unpruned Q8_0 file at 20% removed).
ALIGN = 32


@dataclass(frozen=True)
class ActTwo:
    """How much act two reads (a field of :class:`~.demo.DemoSettings`, set per mode)."""

    # Time (one `headprune demo` on SmolLM2, 2 cores shared with other jobs, load ~7, about 3x a quiet machine):
    # both methods at 10% and 20% with their evaluations 295 s, recovery on 4,096 tokens 424 s (43.44 against 44.23
    # before), the GGUF step 39 s. Hence 2,048 tokens: act two about 3 min on a quiet machine, 10% included.
    budgets: tuple[float, ...] = (0.1, 0.2)  # shares of non-embedding parameters removed; the last is the headline
    recover_tokens: int = 2048  # distillation tokens (block_size x recover_batch per step)
    recover_batch: int = 4
    recover_lr: float = 1e-4  # fixed: lr="auto" would train a copy per candidate first
    recover_held: int = 2  # calibration-half blocks recovery evaluates, never trains on
    n_resamples: int = 1000  # paired bootstrap of the perplexity ratios
    multiple_of: int = ALIGN  # widths on Q8_0's block; 1 for the tiny random model (its widths are a block or two)


def compress_settings(model: nn.Module, budget: float, multiple_of: int = ALIGN) -> PruneSettings:
    """:data:`HEADPRUNE`'s PruneSettings removing ``budget`` of ``model``'s non-embedding parameters (widths on
    :data:`ALIGN`): PruneSettings' ``share`` is the share of the pool's parameters kept, so
    ``1 - ceil(budget x non-embedding) / pool``."""
    target = math.ceil(budget * nonembedding_params(model))
    return PruneSettings(share=1 - target / unit_costs(model, "params").total(), multiple_of=multiple_of,
                         **HEADPRUNE_FIELDS)


def compare_methods(original: nn.Module, calib: LanguageModelling, held_out: LanguageModelling, a: ActTwo, *,
                    progress: bool) -> dict:
    """Step 9: each budget of ``a`` met by headprune and by FLAP on ``calib``; held-out perplexities with their
    ratios to the unpruned model's. Returns {"unpruned": row, "rows": [row per method and budget], "models":
    {method: the model at the last budget}, "evals": their EvalResults, "headprune_vs_flap": ratio}."""
    total = nonembedding_params(original)
    base = held_out.evaluate(original, progress=progress)
    unpruned = {"method": "unpruned", "budget": 0.0, "removed_share": 0.0, "nonembedding_params": total,
                "perplexity": base.score, "seconds": 0.0}
    rows, models, evals = [], {}, {}
    for budget in a.budgets:
        for method in (HEADPRUNE, "flap"):
            start = time.perf_counter()
            if method == "flap":
                model = apply_flap(copy.deepcopy(original), flap(original, calib.batches(), budget))
            else:
                model = compress(original, calib.batches(), compress_settings(original, budget, a.multiple_of),
                                 progress=progress).model
            seconds = time.perf_counter() - start
            result = held_out.evaluate(model, progress=progress)
            kept = nonembedding_params(model)
            rows.append({"method": method, "budget": budget, "removed_share": 1 - kept / total,
                         "nonembedding_params": kept, "perplexity": result.score, "seconds": seconds,
                         "ratio": perplexity_ratio(base, result, n_resamples=a.n_resamples)})
            print(f"      {method:<24} {budget:.0%}: {1 - kept / total:.1%} removed, held-out perplexity "
                  f"{result.score:.2f} (x{rows[-1]['ratio']['ratio']:.3f} the unpruned), {seconds:.0f} s")
            if budget == a.budgets[-1]:
                models[method], evals[method] = model, result
    versus = perplexity_ratio(evals["flap"], evals[HEADPRUNE], n_resamples=a.n_resamples)
    return {"unpruned": unpruned, "base_eval": base, "rows": rows, "models": models, "evals": evals,
            "headprune_vs_flap": versus}


def recovery(student: nn.Module, teacher: nn.Module, blocks: torch.Tensor, held_out: LanguageModelling, base,
             a: ActTwo, *, progress: bool) -> dict:
    """Step 10: ``student`` (headprune's model) distilled in place from ``teacher`` (the unpruned one) on
    ``blocks`` ([N, T] token ids of the calibration half; the last ``a.recover_held`` only evaluated by
    :func:`~headprune.compression.recover.recover`), then its perplexity on ``held_out``, against ``base``'s."""
    settings = RecoverSettings(tokens=a.recover_tokens, block_size=blocks.shape[1], batch_size=a.recover_batch,
                               lr=a.recover_lr, held_out_blocks=a.recover_held)
    train, held = split_blocks(blocks, settings)
    hooks = RecoverHooks(report=(lambda line: print(f"      {line}")) if progress else None)
    result = recover(student, teacher, train, held, settings, hooks=hooks)
    after = held_out.evaluate(student, progress=progress)
    log = result.log
    out = {"tokens": log["tokens"], "steps": log["steps"], "lr": a.recover_lr, "seconds": result.seconds,
           "minutes": result.seconds / 60, "perplexity": after.score, "train_blocks": int(train.shape[0]),
           "ratio": perplexity_ratio(base, after, n_resamples=a.n_resamples)}
    print(f"      {out['tokens']:,} tokens in {out['minutes']:.1f} min: held-out perplexity {after.score:.2f} "
          f"(x{out['ratio']['ratio']:.3f} the unpruned)")
    return out


def recovery_blocks(tokenizer, texts: list[str], block_size: int, a: ActTwo) -> torch.Tensor:
    """[N, block_size] blocks of the calibration half for :func:`recovery`: one pass of its steps (at most 64
    blocks: later passes repeat them) and the held-out ones."""
    steps = a.recover_tokens // (block_size * a.recover_batch)
    return lm_blocks(tokenizer, texts, block_size, max_blocks=min(steps * a.recover_batch, 64) + a.recover_held)


def summary_rows(found: dict, recovered: dict, gguf: dict) -> list[list[str]]:
    """The summary table of act two: a header, then the unpruned model, headprune, headprune recovered, FLAP."""
    last = {r["method"]: r for r in found["rows"] if r["budget"] == found["rows"][-1]["budget"]}

    def ci(r: dict) -> str:
        return f"x{r['ratio']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"

    def mib(name: str) -> str:
        return f"{gguf[name]['mib']:.1f}" if name in gguf else "-"

    speed = gguf.get("llama_cpp")
    gen = (f"x{speed['generate']['speedup']['median']:.2f}" if isinstance(speed, dict) and speed["generate"]["reliable"]
           else "-")
    u, h, f = found["unpruned"], last[HEADPRUNE], last["flap"]
    return [
        ["model", "non-embedding params", "held-out perplexity", "vs unpruned [95% CI]", "Q8_0 MiB",
         "llama.cpp generation"],
        ["unpruned", f"{u['nonembedding_params']:,}", f"{u['perplexity']:.2f}", "x1", mib("original"),
         "x1" if gen != "-" else "-"],
        [f"headprune ({h['removed_share']:.0%} removed)", f"{h['nonembedding_params']:,}", f"{h['perplexity']:.2f}",
         ci(h["ratio"]), mib("pruned"), gen],
        [f"  + recovery ({recovered['tokens']:,} tokens, {recovered['minutes']:.1f} min)",
         f"{h['nonembedding_params']:,}", f"{recovered['perplexity']:.2f}", ci(recovered["ratio"]), mib("pruned"), gen],
        [f"FLAP ({f['removed_share']:.0%} removed)", f"{f['nonembedding_params']:,}", f"{f['perplexity']:.2f}",
         ci(f["ratio"]), "-", "-"],
    ]


def format_table(rows: list[list[str]]) -> str:
    """Rows as aligned text columns (the first column left-aligned, the others right-aligned)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in rows)
