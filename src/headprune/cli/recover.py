"""``headprune recover``: distil a pruned language model from the unpruned one, resumably.

headprune recover PRUNED_DIR --teacher MODEL_DIR --data text.txt --tokens 1000000 -o OUT

:class:`RecoverFlags` are :class:`~headprune.compression.recover.RecoverSettings`'s fields, one flag each;
:func:`headprune.experiments.recover.run_recover` does the rest. Rerunning the same command resumes
from the newest checkpoint in OUT.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from ..errors import ConfigError
from .app import app, friendly
from .options import DEVICE, FRESH, QUIET, Flags, with_flags

# RecoverSettings field -> its flag
SETTING_FLAGS = {"tokens": "--tokens", "block_size": "--block-size", "batch_size": "--batch-size", "lr": "--lr",
                 "lr_grid": "--lr-grid", "lr_steps": "--lr-steps", "held_out_blocks": "--held-out-blocks",
                 "eval_every": "--eval-every", "hidden_weight": "--hidden-weight", "dtype": "--dtype",
                 "seed": "--seed", "checkpoint_every": "--checkpoint-every"}


def _option(default, flag: str, text: str):
    return dataclasses.field(default=typer.Option(default, flag, help=text))


@dataclasses.dataclass
class RecoverFlags(Flags):
    """The fields of :class:`~headprune.compression.recover.RecoverSettings`, one flag each."""

    tokens: int = _option(..., "--tokens", "Training tokens (rounded down to whole steps of --block-size x "
                          "--batch-size).")
    block_size: int = _option(256, "--block-size", "Tokens per window.")
    batch_size: int = _option(4, "--batch-size", "Windows per step.")
    lr: str = _option("auto", "--lr", "Peak learning rate (AdamW, linear decay to 0), or auto: each value of "
                      "--lr-grid trains a copy for --lr-steps steps and the lowest held-out loss wins.")
    lr_grid: str = _option("1e-5,3e-5,1e-4,3e-4", "--lr-grid", "--lr auto: the values tried, comma-separated.")
    lr_steps: int = _option(4, "--lr-steps", "--lr auto: steps of each trial.")
    held_out_blocks: int = _option(8, "--held-out-blocks", "The last N windows of --data: never trained on; they "
                                   "choose --lr auto and give the held-out perplexity.")
    eval_every: int = _option(None, "--eval-every", "Held-out perplexity every N training tokens, recorded in "
                              "OUT/recover.json (default: at the start and the end only).")
    hidden_weight: float = _option(0.0, "--hidden-weight", "Add the hidden states' mismatch (relative squared "
                                   "error, layers of equal shape) with this weight to the KL (default 0: logits "
                                   "only).")
    dtype: str = _option("float32", "--dtype", "Compute dtype: float32 or bfloat16 (autocast; the trained weights "
                         "stay float32).")
    seed: int = _option(0, "--seed", "Seed of the order of the training windows.")
    checkpoint_every: float = _option(300.0, "--checkpoint-every", "Seconds between checkpoints in OUT (0: after "
                                      "every step); does not change the result.")

    def settings(self):
        """The one :class:`RecoverSettings`, its errors naming these flags."""
        from ..compression.recover import RecoverSettings

        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields.update(lr=_lr(self.lr), lr_grid=_numbers("--lr-grid", self.lr_grid))
        with in_flag_terms():
            return RecoverSettings(**fields)


def _lr(text: str) -> float | str:
    if text.strip() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"--lr {text!r}; allowed: a number > 0, or auto") from None


def _numbers(flag: str, text: str) -> tuple[float, ...]:
    try:
        return tuple(float(w) for w in text.split(",") if w.strip())
    except ValueError:
        raise ConfigError(f"{flag} {text!r}; allowed: numbers > 0 separated by commas") from None


@contextmanager
def in_flag_terms() -> Iterator[None]:
    """A settings error (``tokens=0; allowed: ... block_size x batch_size``) re-raised naming the flags."""
    try:
        yield
    except ConfigError as err:
        names = "|".join(sorted(SETTING_FLAGS, key=len, reverse=True))
        text = re.sub(rf"\b({names})=", lambda m: SETTING_FLAGS[m[1]] + " ", str(err))
        text = re.sub(rf"\b({'|'.join(n for n in SETTING_FLAGS if '_' in n)})\b", lambda m: SETTING_FLAGS[m[1]], text)
        raise ConfigError(text) from err


@app.command("recover")
@friendly
@with_flags(flags=RecoverFlags)
def recover_command(
    pruned_dir: Path = typer.Argument(..., help="The pruned model's directory (written by headprune compress or "
                                      "save_pruned)."),
    teacher: Path = typer.Option(..., "--teacher", help="The unpruned model's directory (the same vocabulary)."),
    data: str = typer.Option(..., "--data", help="Text file to train on (its last --held-out-blocks windows held "
                             "out), or 'builtin:pydoc'."),
    output: Path = typer.Option(..., "-o", "--output", help="Run directory: checkpoints, recover.json, and the "
                                "recovered model in OUT/model (rerun the same command to resume)."),
    device: str = DEVICE, fresh: bool = FRESH, quiet: bool = QUIET,
    *, flags: RecoverFlags,
):
    """Distil a pruned language model from the unpruned one (KL on the next-token distribution), with
    checkpoints, exact resume and held-out perplexity."""
    from ..experiments.recover import run_recover

    settings = flags.settings()
    with in_flag_terms():
        model, result = run_recover(pruned_dir, teacher, data, output, settings, device=device, fresh=fresh,
                                    report=None if quiet else (lambda line: typer.echo(line, err=True)))
    if result is None:
        typer.echo(f"{output} already holds the finished recovery: {model}")
        return
    log = result.log
    first, last = log["evals"][0], log["evals"][-1]
    typer.echo(f"recovered {pruned_dir} -> {model}: held-out perplexity {first['held_out_perplexity']:.4g} -> "
               f"{last['held_out_perplexity']:.4g} (unpruned {log['teacher_held_out']['held_out_perplexity']:.4g}), "
               f"{log['tokens']:,} tokens at lr {log['lr']:g}; log: {output / 'recover.json'}")
