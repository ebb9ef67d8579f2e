"""``headprune compress``: prune heads, FFN neurons or both to one budget and save the smaller model.

headprune compress MODEL_DIR --task classification --data dev.tsv --calib-data train.tsv --share 0.5 -o OUT

The command parses and calls: :class:`PruneFlags` are :class:`~headprune.compression.PruneSettings`'s fields,
one flag each, and the settings of the methods they name (``--damping``, ``--max-scale``, ``--target``,
``--distill-epochs``, ``--distill-lr``, ``--step-damping``: fields of the compensation objects), built once into
the settings; :class:`InputFlags` the calibration, validation and fit data;
:class:`BenchFlags` the speed measurement. :func:`headprune.experiments.compress.run_compress` then calls
:func:`headprune.compression.compress`, the library's one entry point, and writes the run directory.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import typer

from ..errors import ConfigError, DataError
from ..provenance import own_name
from .app import app, echo_headline, friendly
from .dataflags import ARGUMENT_FLAGS, DATA_FLAGS, PHRASES, in_cli_terms, split_option
from .identity import identity
from .options import (
    DATA,
    DATA2,
    GQA,
    MINSITE,
    QUIET,
    TASK,
    Flags,
    TaskFlags,
    TaskSetup,
    calib_limit_option,
    check_calib_limit,
    with_flags,
)

DEFAULT_SEQ_LEN = 128
# PruneSettings field, or a setting of the methods it names -> its flag (the one mapping from the library's words to
# the command line's)
SETTING_FLAGS = {"share": "--share", "n_keep": "--n-keep", "price": "--price", "scores": "--scores",
                 "compensate": "--compensate", "units": "--units", "target": "--target", "gqa": "--gqa",
                 "max_scale": "--max-scale", "val_share": "--val-share", "same_per_site": "--same-per-site",
                 "min_per_site": "--min-per-site", "seq_len": "--seq-len", "tgt_len": "--tgt-len",
                 "damping": "--damping", "epochs": "--distill-epochs", "lr": "--distill-lr",
                 "seed": "--seed", "guard": "--no-guard", "multiple_of": "--multiple-of",
                 "low_memory": "--low-memory", "steps": "--steps", "step_standin": "--step-standin",
                 "score_batches": "--score-batches"}
METHOD_FLAGS = ("damping", "max_scale", "target", "distill_epochs", "distill_lr", "step_damping")  # not fields of
# PruneSettings: settings of the methods --compensate and --step-standin name


def _option(default, flag: str, text: str):
    return dataclasses.field(default=typer.Option(default, flag, help=text))


@dataclasses.dataclass
class PruneFlags(Flags):
    """The fields of :class:`~headprune.compression.PruneSettings`, one flag each, and the settings of the methods
    they name (:data:`METHOD_FLAGS`)."""

    units: str = _option("heads", "--units", "What to prune: heads, neurons (FFN) or both, under one budget.")
    share: float = _option(None, "--share", "Budget: the share of the units' --price kept, in (0, 1]; required: "
                           "exactly one of --share, --n-keep.")
    n_keep: int = _option(None, "--n-keep", "Budget: the number of heads kept (or --share: one is required).")
    price: str = _option(None, "--price", "What --share measures: count (units), flops (at --seq-len; the default), "
                         "params, kv (KV-cache bytes per token; drops whole key/value groups) or latency (a table "
                         "timed once on this machine at --bench-batch, --seq-len).")
    scores: str = _option(None, "--scores", "How units are scored: ih (the paper's I_h), fisher (diagonal Fisher of "
                          "the mask; the default), random, fluctuation (FLAP: the variance of each unit's input times "
                          "its output weights, one forward pass, no labels; standardised per kind over all layers) or "
                          "fluctuation-raw (the same, not standardised: heads and neurons traded by price); or a name "
                          "added by headprune.scoring.registry.register_scorer.")
    compensate: str = _option(None, "--compensate", "How the loss of what is cut is made up for: none, rearrange "
                              "(Fisher swaps per site), tune (+ least-squares head scales folded into the weights; the "
                              "default for heads), reconstruct (least-squares refit of every pruned projection, kept "
                              "only if the validation loss drops; the default with neurons), bias (removed units held "
                              "at their calibration means, folded into the output projections' biases; the default "
                              "with --scores fluctuation*), linear (removed units replaced by their least-squares "
                              "affine prediction from the kept ones, folded into the kept columns and the biases; same "
                              "single pass), linear-seq (the same, fitted block after block on the pruned model's "
                              "inputs; decoder stacks), obs-seq (linear-seq, the units within each site and FFN first re-chosen by "
                              "their OBS error there: the scores set how many each loses), distill (the pruned model trained "
                              "towards the unpruned one's outputs, kept only if the validation loss drops; "
                              "--distill-epochs, --distill-lr); or a name added by "
                              "headprune.compression.register_compensation. Several: a "
                              "comma list, run in order (e.g. bias,reconstruct: the refit then fits the bias too).")
    gqa: str = dataclasses.field(default=GQA)
    same_per_site: bool = _option(False, "--same-per-site", "Keep the same number of heads in every site (with --gqa "
                                  "uniform or groups, a head budget): the saved model then has a stock config that "
                                  "plain from_pretrained loads.")
    min_per_site: int = dataclasses.field(default=MINSITE)
    seq_len: int = _option(None, "--seq-len", f"Tokens per example for FLOPs and timing (default {DEFAULT_SEQ_LEN}, at "
                           "most the model's positions).")
    tgt_len: int = _option(None, "--tgt-len", "Encoder-decoders: decoder tokens (default: --seq-len).")
    damping: float = _option(None, "--damping", "The damping of every method of --compensate and --step-standin that "
                             "has one: tune / reconstruct: ridge towards the unpruned solution (relative); linear, "
                             "linear-seq, obs-seq: ridge towards the mean stand-in (relative to the kept features' "
                             "mean variance) (default: each method's own, 1e-2).")
    max_scale: float = _option(None, "--max-scale", "tune: scales outside [-max, max] are refused (unit scales kept; "
                               "default 10).")
    target: str = _option(None, "--target", "tune / reconstruct: what each site reproduces: residual (the "
                          "stream after it, Kwon et al.; the default) or output (its projection's).")
    no_guard: bool = _option(False, "--no-guard", "Keep rearrangement, tuning and reconstruction even where they "
                             "raise the calibration / validation loss.")
    val_share: float = _option(0.25, "--val-share", "reconstruct without --val-data: the share of the calibration "
                               "batches held out (spread over their lengths) for the guard.")
    distill_epochs: int = _option(0, "--distill-epochs", "After the reconstruction, train the pruned model for N passes "
                                  "over the fit examples to match the unpruned model's outputs (no labels read; kept "
                                  "only if it lowers the validation loss): adds distill after --compensate's methods, "
                                  "or sets the epochs of a distill in it (default 0: off).")
    distill_lr: float = _option(None, "--distill-lr", "--distill-epochs: peak learning rate (AdamW, linear decay to 0; "
                                "default 2e-5).")
    seed: int = _option(0, "--seed", "Seed of --scores random and of the distillation order.")
    multiple_of: int = _option(1, "--multiple-of", "Every FFN width and attention width (heads x head_dim) pruning "
                               "changes is a multiple of N: 32 / 256 for llama.cpp's Q4_0 / Q8_0 and K-quant blocks, "
                               "64 / 128 for GPU tiles (the budget over heads and neurons; default 1: any width).")
    low_memory: bool = _option(False, "--low-memory", "For models near the machine's memory (neurons / both, or "
                               "--price params; compensate none, bias or linear): score with activation "
                               "checkpointing, solve linear stand-ins one block at a time, cut the loaded model in "
                               "place (no copy; needs --no-bench: no unpruned model is left to time).")
    steps: int = _option(1, "--steps", "Rounds of score, select, stand-in and cut, each taking an equal part of "
                         "the budget from the model the round before left, so later scores see what is gone (the "
                         "budget over heads and neurons; about N times the time; default 1).")
    step_standin: str = _option(None, "--step-standin", "With --steps: the stand-in every round folds (e.g. linear); "
                                "the rounds then only choose the units, and --compensate's stand-in runs once after "
                                "them on the loaded model (obs-seq: re-choosing which units of each site and FFN go; "
                                "default: none, every round folds --compensate's).")
    step_damping: float = _option(None, "--step-damping", "--step-standin's damping (default: --damping, else the "
                                  "stand-in's own).")
    score_batches: str = _option("0", "--score-batches", "Score on N of the calibration batches, spread over them, "
                                 "or on N1,N2,... in the rounds of --steps, one number each (the budget over heads "
                                 "and neurons; block-by-block stand-ins and refits read all; default 0: all).")
    config: Path = _option(None, "--config", "The settings from a TOML file instead of these flags: a [settings] "
                           "table of PruneSettings fields, as every compress run writes to compress.toml (rerun a "
                           "run with --config RUN/compress.toml; default: none, the flags).")

    def settings(self):
        """The one :class:`~headprune.compression.PruneSettings`, its errors naming these flags (or the file)."""
        from ..compression.settings import PruneSettings

        if self.config is not None:
            given = [f.default.param_decls[0] for f in dataclasses.fields(self)
                     if f.name != "config" and getattr(self, f.name) != f.default.default]
            if given:
                raise ConfigError(f"--config with {given[0]}; allowed: the settings in one place, the file or the "
                                  "flags")
            return PruneSettings.from_toml(self.config)
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("no_guard", "config", *METHOD_FLAGS)}
        compensate = self.compensate
        if compensate is not None and "," in compensate:  # several, run in order
            compensate = [c.strip() for c in compensate.split(",") if c.strip()]
        fields.update(price=self.price or "flops", scores=self.scores or "fisher", compensate=compensate,
                      score_batches=_counts("--score-batches", self.score_batches),
                      seq_len=DEFAULT_SEQ_LEN if self.seq_len is None else self.seq_len, guard=not self.no_guard)
        with in_setting_terms():
            return self._configured(PruneSettings(**fields))

    def _configured(self, settings):
        """``settings`` with its methods built from the method flags: each flag sets the field of that name of every
        method of --compensate (or its default) and --step-standin that has one; a flag no method has is refused."""
        from ..compression.compensation import get_compensations
        from ..compression.compensations import Distill
        from ..compression.settings import default_compensate
        from ..methods import settings_of, with_settings

        methods = list(settings.compensations)
        if self.distill_epochs or self.distill_lr is not None:
            if "distill" not in settings.compensation_names:
                if not self.distill_epochs:
                    raise ConfigError(f"--distill-lr {self.distill_lr} without --distill-epochs; allowed: with "
                                      "--distill-epochs N (N >= 1), or --compensate ...,distill")
                if self.compensate is None:  # distillation runs after the cut: the default of that pipeline first
                    methods = list(get_compensations(default_compensate(settings.scorer, pool=True)))
                methods.append(Distill())
            methods = [with_settings(m, {"epochs": self.distill_epochs or None, "lr": self.distill_lr}) for m in methods]
        knobs = {"damping": self.damping, "max_scale": self.max_scale, "target": self.target}
        methods = [with_settings(m, knobs) for m in methods]
        step = settings.round_standin
        if step is not None:
            with in_setting_terms({"damping": "--step-damping"} if self.step_damping is not None else None):
                step = with_settings(step, {"damping": self.damping if self.step_damping is None else
                                            self.step_damping})
        elif self.step_damping is not None:
            raise ConfigError(f"--step-damping {self.step_damping} without --step-standin; allowed: with it")
        has = set().union(*(settings_of(m) for m in (*methods, step) if m is not None))
        unread = [(SETTING_FLAGS[k], v) for k, v in knobs.items() if v is not None and k not in has]
        if self.step_damping is not None and "damping" not in settings_of(step):
            unread.append(("--step-damping", self.step_damping))
        if unread:
            flag, value = unread[0]
            given = f"--compensate {_names(methods)}" + (f" --step-standin {step.name}" if step is not None else "")
            raise ConfigError(f"{flag} {value} with {given}: no method given has that setting; allowed: leave it out")
        return replace(settings, compensate=methods, step_standin=step)


def _counts(flag: str, text: str) -> int | list[int]:
    """``N`` as an int, ``N1,N2,...`` as a list of ints (a word that is no integer refused, naming ``flag``)."""
    words = [w.strip() for w in str(text).split(",")]
    try:
        counts = [int(w) for w in words]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}; allowed: an integer >= 0, or integers >= 0 separated by commas") from None
    return counts[0] if len(counts) == 1 else counts


@dataclasses.dataclass
class InputFlags(Flags):
    """The data compression reads besides ``--data``: calibration, the guard's validation data, the refit's."""

    calib_data: str = _option(None, "--calib-data", "Calibration data for scores and tuning (default: --data, refused "
                              "unless --allow-same-data): must not overlap --data.")
    calib_data2: Path = _option(None, "--calib-data2", "Translation: target file of --calib-data (default: none).")
    calib_split: str = dataclasses.field(default=split_option("--calib-data", "; without --calib-data: this split of "
                                                                              "--data"))
    calib_limit: int = dataclasses.field(default=calib_limit_option("--calib-data", "for scores and tuning"))
    allow_same_data: bool = _option(False, "--allow-same-data", "Allow calibrating on the evaluation data.")
    val_data: str = _option(None, "--val-data", "reconstruct: validation data for its guard, disjoint from "
                            "--calib-data and --data (default: --val-share of the calibration batches, spread over "
                            "their lengths, is held out).")
    val_data2: Path = _option(None, "--val-data2", "Translation: target file of --val-data (default: none).")
    val_split: str = dataclasses.field(default=split_option("--val-data"))
    val_limit: int = _option(None, "--val-limit", "First N examples of --val-data (default: all).")
    fit_limit: int = _option(None, "--fit-limit", "reconstruct: fit on the first N examples of the calibration data "
                             "(labels unused; more than --calib-limit overfits less); needs --val-data (default: the "
                             "--calib-limit examples).")

    def check(self, settings, data: str, split, output: Path) -> tuple[str, str | None]:
        """Refuse, before any work, what compress cannot use; returns (calibration data, its split): ``--data``
        and ``--split`` without ``--calib-data``."""
        from ..evaluation.data import same_data

        if output.exists():
            raise ConfigError(f"--output {str(output)!r} already exists; choose a new directory")
        calib = self.calib_data or data
        calib_split = split if self.calib_split is None and self.calib_data is None else self.calib_split
        if same_data(data, calib) and calib_split == split and not self.allow_same_data:
            raise ConfigError(f"--calib-data {calib!r} is the evaluation data --data; calibrating on it overstates the "
                              "result; allowed: a disjoint file or split (e.g. a train split; --calib-split for a "
                              "datasets directory), or --allow-same-data")
        if self.calib_data2 is not None and self.calib_data is None:
            raise ConfigError("--calib-data2 needs --calib-data")
        check_calib_limit(self.calib_limit)
        from ..compression.entry import unused_inputs

        unused = unused_inputs(settings, val_batches=self.val_data is not None, fit_batches=self.fit_limit is not None)
        if unused:
            flag = {"val_batches": "--val-data", "fit_batches": "--fit-limit"}[unused[0]]
            raise ConfigError(f"{flag} with --compensate {_names(settings)}; allowed: only with "
                              "--compensate reconstruct (or --units neurons|both)")
        self._check_held_out(settings, data, split, calib, calib_split)
        for path in [p for p in (data, calib, self.val_data) if p is not None and not str(p).startswith("builtin:")]:
            if not Path(path).exists():
                raise ConfigError(f"data file {path!r} does not exist")
        return calib, calib_split

    def _check_held_out(self, settings, data: str, split, calib: str, calib_split) -> None:
        from ..evaluation.data import same_data

        val, fit = self.val_data, self.fit_limit
        if val is not None and same_data(val, data) and self.val_split == split:
            raise ConfigError(f"--val-data {val!r} is the evaluation data --data; allowed: a disjoint file or split")
        if val is not None and same_data(val, calib) and self.val_split == calib_split:
            raise ConfigError(f"--val-data {val!r} is the calibration data; allowed: a disjoint file or split "
                              "(or leave --val-data out: part of the calibration batches is held out)")
        for flag, value in (("--val-limit", self.val_limit), ("--fit-limit", fit)):
            if value is not None and (isinstance(value, bool) or value < 1):
                raise ConfigError(f"{flag} {value}; allowed: an integer >= 1")
        if fit is not None and val is None:
            raise ConfigError(f"--fit-limit {fit} without --val-data: the guard's validation part would be held out "
                              "of calibration examples the fit also reads; allowed: give --val-data (disjoint data)")
        if fit is not None and not settings.refits:
            raise ConfigError(f"--fit-limit with --compensate {_names(settings)}; allowed: only with a "
                              "reconstruction (--compensate reconstruct, bias,reconstruct or linear,reconstruct) or "
                              "--distill-epochs")


@dataclasses.dataclass
class BenchFlags(Flags):
    """The speed measurement after compression (and the latency price's timing)."""

    bench_batch: int = _option(16, "--bench-batch", "Batch size of the speed measurement.")
    bench_repeats: int = _option(5, "--bench-repeats", "Timed rounds of the speed measurement.")
    no_bench: bool = _option(False, "--no-bench", "Skip the speed measurement.")

    def check(self) -> None:
        if not self.no_bench and (self.bench_batch < 1 or self.bench_repeats < 1):
            raise ConfigError(f"--bench-batch {self.bench_batch} --bench-repeats {self.bench_repeats}; allowed: "
                              "integers >= 1")


def _names(settings) -> str:
    """The compensations of ``settings`` (or a list of compensations) as ``--compensate`` takes them."""
    names = [c.name for c in settings] if isinstance(settings, list) else settings.compensation_names
    return ",".join(names) or "none"


@contextmanager
def in_setting_terms(budget: dict[str, str] | None = None) -> Iterator[None]:
    """Errors raised inside the block name the flags of :data:`SETTING_FLAGS` (``share=0`` -> ``--share 0``);
    ``budget``: the flag each library budget came from (``--share 0.5`` reaches selection as ``flops=0.5``)."""
    try:
        yield
    except (DataError, ConfigError) as err:
        message = str(err)
        for phrase, cli in PHRASES:
            message = message.replace(phrase, cli)
        names = {**ARGUMENT_FLAGS, **DATA_FLAGS["--data"], **SETTING_FLAGS, **(budget or {})}
        alternatives = "|".join(sorted(names, key=len, reverse=True))
        message = re.sub(rf"\b({alternatives})=(?=[\s,;)]|$)", lambda m: names[m[1]], message)
        raise type(err)(re.sub(rf"\b({alternatives})=", lambda m: names[m[1]] + " ", message)) from err


@app.command("compress")
@friendly
@with_flags(flags=TaskFlags, prune=PruneFlags, inputs=InputFlags, bench=BenchFlags)
def compress_command(
    model_dir: Path = typer.Argument(..., help="A Hugging Face model directory (or one written by headprune), or a .gguf file."),
    task: str = TASK, data: str = DATA, data2: Path = DATA2,
    output: Path = typer.Option(..., "-o", "--output", help="New directory: the pruned model, compress.json, "
                                "report.html."),
    quiet: bool = QUIET,
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the check that surgery is exact for this model's "
                                   "class (refused families): check the result yourself."),
    recover_tokens: int = typer.Option(None, "--recover-tokens", help="--task lm: then distil the pruned model from "
                                       "this one for N tokens of the calibration text (headprune recover's defaults, "
                                       "windows of --seq-len), into OUT/recovered (default: none)."),
    *, flags: TaskFlags, prune: PruneFlags, inputs: InputFlags, bench: BenchFlags,
):
    """Prune heads, FFN neurons or both to one budget (a share of their count, FLOPs, parameters, KV cache or
    latency, or a count), compensate, and save the smaller model."""
    from ..compression.entry import check_model
    from ..experiments.compress import RunInputs, run_compress

    settings = prune.settings()
    calib, calib_split = inputs.check(settings, data, flags.split, output)
    recovery = _recovery(recover_tokens, task, settings.seq_len if prune.config else prune.seq_len)
    bench.check()
    if settings.low_memory and not bench.no_bench:
        raise ConfigError("--low-memory without --no-bench: the model is pruned in place, so no unpruned model is left "
                          "to time against; allowed: --low-memory --no-bench")
    t = TaskSetup(model_dir, task, flags, quiet)
    model, tok = t.model, t.tokenizer
    with in_setting_terms():  # a count above the model's heads: refused before any data is read
        check_model(model, settings)
    settings = with_seq_len(settings, settings.seq_len if prune.config else prune.seq_len, model)
    ev = t.on(data, data2)
    calib2 = inputs.calib_data2 if inputs.calib_data else data2
    calib_ev = t.on(calib, calib2, limit=inputs.calib_limit, flag="--calib-data", split=calib_split)
    run = RunInputs(signature=_signature(model_dir, task, data, data2, calib, calib_split, flags, inputs, ev, calib_ev),
                    bench_batch=None if bench.no_bench else bench.bench_batch, bench_repeats=bench.bench_repeats,
                    verify=not no_verify, progress=not quiet)
    _held_out_inputs(run, t, settings, inputs, calib, calib2, calib_split, bench)
    budget = {"flops": "--share", "keep": "--share", "kv": "--share", "n_keep": "--n-keep"}  # what --share became
    with in_cli_terms("--calib-data"), in_setting_terms(budget):  # e.g. too few calibration batches to hold out
        report, summary = run_compress(model, tok, ev, list(calib_ev.batches()), output, settings, run)
    echo_headline(output)
    typer.echo(f"compressed {model_dir} -> {output}: {summary}; report: {report}")
    if recovery is not None:
        _recover_after(model_dir, output, calib, recovery, flags.device, not quiet)


def _recovery(tokens: int | None, task: str, seq_len: int | None):
    """``--recover-tokens`` as :class:`RecoverSettings` (windows of ``--seq-len``), refused before any work."""
    from ..compression.recover import RecoverSettings

    if tokens is None:
        return None
    if task != "lm":
        raise ConfigError(f"--recover-tokens with --task {task}; allowed: only with --task lm")
    block = DEFAULT_SEQ_LEN if seq_len is None else seq_len
    per_step = block * RecoverSettings.batch_size
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < per_step:
        raise ConfigError(f"--recover-tokens {tokens}; allowed: an integer >= --seq-len x {RecoverSettings.batch_size}"
                          f" = {per_step} (one step)")
    return RecoverSettings(tokens=tokens, block_size=block, lr_steps=min(RecoverSettings.lr_steps, tokens // per_step))


def _recover_after(model_dir, output: Path, calib: str, recovery, device, lines: bool) -> None:
    """Recover the model just saved in ``output`` from ``model_dir`` on the calibration text, into OUT/recovered."""
    from ..experiments.recover import run_recover
    from .recover import in_flag_terms

    again = (f"headprune recover {output} --teacher {model_dir} --data {calib} --tokens {recovery.tokens} "
             f"--block-size {recovery.block_size} --lr-steps {recovery.lr_steps} -o {output / 'recovered'}")
    typer.echo(f"recovering (if stopped, resume with: {again})", err=True)
    with in_flag_terms():
        model, result = run_recover(output, model_dir, calib, output / "recovered", recovery, device=device,
                                    report=(lambda line: typer.echo(line, err=True)) if lines else None)
    last = result.log["evals"][-1]
    typer.echo(f"recovered -> {model}: held-out perplexity {result.log['evals'][0]['held_out_perplexity']:.4g} -> "
               f"{last['held_out_perplexity']:.4g}")


def _held_out_inputs(run, t: TaskSetup, settings, inputs: InputFlags, calib, calib2, calib_split, bench) -> None:
    """The inputs besides the calibration batches, where given: latency prices, fit and validation batches
    (InputFlags.check has refused those the settings cannot use)."""
    if settings.price == "latency":
        from ..bench.unit_latency import latency_prices, latency_table

        run.latency_table = latency_table(t.model, batch=bench.bench_batch, seq_len=settings.seq_len,
                                          tgt_len=settings.tgt_len, repeats=bench.bench_repeats)
        run.prices = latency_prices(t.model, run.latency_table)
    if inputs.fit_limit is not None:
        run.fit_batches = list(t.on(calib, calib2, limit=inputs.fit_limit, flag="--calib-data",
                                    split=calib_split).batches())
    if inputs.val_data is not None:
        run.val_batches = list(t.on(inputs.val_data, inputs.val_data2, limit=inputs.val_limit, flag="--val-data",
                                    split=inputs.val_split).batches())
    run.signature |= {"val_data": inputs.val_data or "held-out part of --calib-data", "val_split": inputs.val_split,
                      "val_limit": inputs.val_limit, "fit_limit": inputs.fit_limit}


def with_seq_len(settings, seq_len, model):
    """``settings`` with the default sequence length when ``--seq-len`` was not given: 128 tokens, or what the
    model's position table allows (``--limit`` stays the examples' count)."""
    from ..evaluation.build import position_limit

    if seq_len is not None:
        return settings
    positions = position_limit(model.config)
    return replace(settings, seq_len=min(DEFAULT_SEQ_LEN, positions or DEFAULT_SEQ_LEN))


def _signature(model_dir, task, data, data2, calib, calib_split, flags, inputs: InputFlags, ev, calib_ev) -> dict:
    """The run's identity: data and calibration data (names, sizes, contents' hashes), model and every task flag."""
    calib_data2 = inputs.calib_data2
    files = {"--data": data, "--data2": data2, "--calib-data": inputs.calib_data, "--calib-data2": calib_data2,
             "--val-data": inputs.val_data, "--val-data2": inputs.val_data2}
    return {"model": own_name(model_dir), "task": task, "data": [data] + ([str(data2)] if data2 else []),
            "split": Path(data).name, "n": len(ev),
            **{k: v for k, v in (("data_split", flags.split), ("calib_split", calib_split)) if v},
            "calib_data": [calib] + ([str(calib_data2 or data2)] if (calib_data2 or data2) else []),
            "calib_n": len(calib_ev), "calib_limit": inputs.calib_limit,
            **identity(flags, ev, model_dir, files)}
