"""``headprune export``: a (pruned) model directory as an ONNX graph, checked with onnxruntime.

headprune export PRUNED_DIR --format onnx -o OUT
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import ConfigError
from .app import app, friendly

FORMATS = ("onnx",)


@app.command("export")
@friendly
def export(
    model_dir: Path = typer.Argument(..., help="A model directory (pruned by headprune or not)."),
    fmt: str = typer.Option("onnx", "--format", help="Export format: onnx."),
    output: Path = typer.Option(..., "-o", "--output", help="New directory: model.onnx, export.json, tokenizer."),
    opset: int = typer.Option(17, "--opset", help="ONNX opset version."),
    tolerance: float = typer.Option(1e-4, "--tolerance", help="Largest allowed difference onnxruntime vs PyTorch, "
                                    "relative to the largest output."),
):
    """Export to ONNX (dynamic batch and sequence axes, no cache); kept only if onnxruntime matches PyTorch."""
    from ..core.checkpoint import check_output_dir
    from ..core.io import load_model, load_tokenizer
    from ..export.onnx import export_onnx

    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if not 0 < tolerance < 1:
        raise ConfigError(f"--tolerance {tolerance}; allowed: a number between 0 and 1")
    if opset < 14:
        raise ConfigError(f"--opset {opset}; allowed: an integer >= 14")
    check_output_dir(output)
    model = load_model(model_dir)
    report = export_onnx(model, output, tokenizer=load_tokenizer(model_dir), opset=opset, tolerance=tolerance,
                         signature={"model": str(model_dir)})
    c = report["check"]
    typer.echo(f"exported {model_dir} -> {output / report['file']}: onnxruntime matches PyTorch on "
               f"{c['inputs']}, shape {c['shape']} (max difference {c['max_abs_diff']:.2g}, {c['relative']:.2g} relative; "
               f"allowed {c['tolerance']:g} relative)")
