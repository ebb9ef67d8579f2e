"""``headprune importance``: one score per head (I_h or the Fisher diagonal) as JSON, CSV and heatmap."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import typer

from ..errors import ConfigError
from .app import app, echo_headline, friendly
from .options import (
    DATA,
    DATA2,
    FRESH,
    OUT,
    QUIET,
    TASK,
    TaskFlags,
    TaskSetup,
    with_flags,
)
from .study import MODEL, run_signature


@app.command("importance")
@friendly
@with_flags(flags=TaskFlags)
def importance(
    model_dir: Path = MODEL, task: str = TASK, data: str = DATA, data2: Path = DATA2,
    calib_limit: int = typer.Option(512, "--calib-limit", help="Score only the first N examples of --data (lm: N "
                                    "blocks), after --limit; so a large training file is not scored whole by accident."),
    absolute: str = typer.Option("example", "--absolute", help="example: |dL/dxi_h| per example, then the mean "
                                 "(paper 4.1); batch: |sum over a batch| (the bertology script's variant)."),
    normalize: str = typer.Option("l2", "--normalize", help="l2: divide each layer's scores by their l2 norm "
                                  "(paper 4.1); none: raw means."),
    scores: str = typer.Option("ih", "--scores", help="ih: the paper's I_h (the library's scores='ih'); fisher: the "
                               "diagonal of the empirical Fisher of the head mask, per example (Kwon et al. 2022)."),
    max_length: int = typer.Option(None, "--max-length", help="Truncate inputs (default 128; translation 256)."),
    block_size: int = typer.Option(128, "--block-size", help="LM: tokens per block."),
    checkpoint_blocks: bool = typer.Option(False, "--checkpoint-blocks", help="Keep one input per transformer "
                                           "block and recompute its activations in the backward pass: the same "
                                           "scores in much less memory (billion-parameter models), ~1.7x the time."),
    output: Path = OUT, fresh: bool = FRESH, quiet: bool = QUIET,
    *, flags: TaskFlags,
):
    """Score every head (paper 4.1): importance.json ({site: [score per head]} and the signature),
    importance.csv, a heatmap and report.html."""
    from ..experiments.importance_run import run_importance
    from ..experiments.rundir import RunOutput
    from ..scoring import checkpointed_blocks

    if calib_limit is not None and calib_limit < 1:
        raise ConfigError(f"--calib-limit {calib_limit}; allowed: an integer >= 1")
    if absolute not in ("example", "batch"):
        raise ConfigError(f"--absolute {absolute!r}; allowed: example, batch")
    if normalize not in ("l2", "none"):
        raise ConfigError(f"--normalize {normalize!r}; allowed: l2, none")
    if scores not in ("ih", "fisher"):
        raise ConfigError(f"--scores {scores!r}; allowed: ih, fisher")
    scores = "importance" if scores == "ih" else scores  # run_importance's name of I_h
    if scores == "fisher" and absolute != "example":
        raise ConfigError(f"--absolute {absolute!r} with --scores fisher; allowed: --absolute only with "
                          "--scores importance (the Fisher squares per-example gradients)")
    t = TaskSetup(model_dir, task, flags, quiet)
    ev = t.on(data, data2, max_length=max_length, block_size=block_size)
    n = len(ev) if calib_limit is None else min(calib_limit, len(ev))
    sig = {**run_signature(model_dir, task, data, data2, ev, 0, flags), "n": n, "calib_limit": calib_limit,
           "scores": scores, "absolute": absolute, "normalize": normalize,
           "max_length": max_length, "block_size": block_size}
    with checkpointed_blocks(t.model) if checkpoint_blocks else nullcontext():
        report = run_importance(t.model, lambda: ev.batches(limit=calib_limit),
                                RunOutput(output, sig, fresh=fresh, progress=not quiet), scores=scores,
                                absolute=absolute, normalize=None if normalize == "none" else normalize)
    echo_headline(output, report)
