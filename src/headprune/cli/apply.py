"""``headprune apply MODEL plan.json -o OUT``: replay a compression's plan on the model it was made on.

headprune apply MODEL_DIR runs/compressed/plan.json -o OUT

The plan (:class:`headprune.compression.replay.Plan`: plan.json and the plan.safetensors beside it) says which heads
and neurons a ``compress`` run removed and holds every tensor its stages rewrote; applying it to the same model
directory, loaded with the same dtype, rebuilds the compressed model bit for bit. Another model (another config,
other weights, another dtype) is refused by its fingerprint before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import typer

from .app import app, friendly
from .options import DEVICE, DTYPE, device_dtype


@app.command("apply")
@friendly
def apply_command(
    model_dir: Path = typer.Argument(..., help="The model directory the plan was made on (compress's MODEL_DIR)."),
    plan_file: Path = typer.Argument(..., help="A plan.json written by headprune compress into its run directory "
                                   "(plan.safetensors beside it)."),
    output: Path = typer.Option(..., "-o", "--output", help="New directory: the pruned model (and its tokenizer)."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip the check that surgery is exact for this model's "
                                   "class (refused families): check the result yourself."),
    device: str = DEVICE,
    dtype: str = DTYPE,
):
    """Replay a compression plan (plan.json) on the model it was made on and save the pruned model."""
    from ..compression.replay import Plan, apply_plan
    from ..core.io import check_output_dir, load_model, load_tokenizer, save_pruned

    plan = Plan.load(plan_file)  # refused before any model is read
    check_output_dir(output)
    model = load_model(model_dir, **device_dtype(device, dtype))
    before = sum(p.numel() for p in model.parameters())
    apply_plan(model, plan, verify=not no_verify)  # another model: refused by its fingerprint, nothing written
    after = sum(p.numel() for p in model.parameters())
    save_pruned(model, output, tokenizer=load_tokenizer(model_dir))
    typer.echo(f"applied {plan_file} to {model_dir} -> {output}: {before:,} -> {after:,} parameters "
               f"({after / before:.1%})")
