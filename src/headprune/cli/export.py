"""``headprune export``: a (pruned) model as an ONNX graph checked with onnxruntime, or as a GGUF file
(llama.cpp) checked by reading it back.

headprune export PRUNED_DIR --format onnx -o OUT
headprune export PRUNED_DIR --format gguf --outtype q8_0 -o OUT.gguf [--source-gguf ORIGINAL.gguf]
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..errors import ConfigError
from ..provenance import own_name
from .app import app, friendly

FORMATS = ("onnx", "gguf")


@app.command("export")
@friendly
def export(
    model_dir: Path = typer.Argument(..., help="A model directory (pruned by headprune or not)."),
    fmt: str = typer.Option("onnx", "--format", help="Export format: onnx or gguf."),
    output: Path = typer.Option(..., "-o", "--output", help="onnx: new directory (model.onnx, export.json, "
                                "tokenizer); gguf: new .gguf file (+ OUT.gguf.json, the report)."),
    outtype: str = typer.Option("f32", "--outtype", help="gguf: f32, f16, q8_0, q5_0, q5_1, q4_0 or q4_1."),
    source_gguf: Path = typer.Option(None, "--source-gguf", help="gguf: carry this GGUF file's tokenizer over "
                                     "(default: MODEL when it is a .gguf file, else the directory's tokenizer)."),
    opset: int = typer.Option(17, "--opset", help="ONNX opset version."),
    tolerance: float = typer.Option(1e-4, "--tolerance", help="Largest allowed difference onnxruntime vs PyTorch, "
                                    "relative to the largest output."),
):
    """Export to ONNX (dynamic batch and sequence axes, no cache; kept only if onnxruntime matches PyTorch)
    or to GGUF for llama.cpp (per-layer head and FFN counts; kept only if the file reads back as the model)."""
    from ..core import load_model, load_tokenizer

    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if not 0 < tolerance < 1:
        raise ConfigError(f"--tolerance {tolerance}; allowed: a number between 0 and 1")
    if fmt == "gguf":
        _export_gguf(model_dir, output, outtype, source_gguf, tolerance, load_model, load_tokenizer)
        return
    from ..core.store.checkpoint import check_output_dir
    from ..export.onnx import export_onnx

    if opset < 14:
        raise ConfigError(f"--opset {opset}; allowed: an integer >= 14")
    check_output_dir(output)
    model = load_model(model_dir)
    report = export_onnx(model, output, tokenizer=load_tokenizer(model_dir), opset=opset, tolerance=tolerance,
                         signature={"model": own_name(model_dir)})
    c = report["check"]
    typer.echo(f"exported {model_dir} -> {output / report['file']}: onnxruntime matches PyTorch on "
               f"{c['inputs']}, shape {c['shape']} (max difference {c['max_abs_diff']:.2g}, {c['relative']:.2g} relative; "
               f"allowed {c['tolerance']:g} relative)")


def _export_gguf(model_dir: Path, output: Path, outtype: str, source_gguf: Path | None, tolerance: float,
                 load_model, load_tokenizer) -> None:
    from ..export.gguf import OUTTYPES, export_gguf

    if outtype not in OUTTYPES:
        raise ConfigError(f"--outtype {outtype!r}; allowed: {', '.join(OUTTYPES)}")
    if source_gguf is None and str(model_dir).lower().endswith(".gguf"):
        source_gguf = model_dir
    tokenizer = load_tokenizer(model_dir) if source_gguf is None else None
    model = load_model(model_dir, dtype="float32")
    report = export_gguf(model, output, tokenizer=tokenizer, source_gguf=source_gguf, outtype=outtype,
                         tolerance=tolerance, signature={"model": own_name(model_dir)})
    c = report["check"]
    t = c["transformers"]
    typer.echo(f"exported {model_dir} -> {output} ({report['arch']}, {outtype}, {report['bytes'] / 2**20:.1f} MiB; "
               f"heads {report['head_count']}, kv heads {report['head_count_kv']}, ffn {report['feed_forward_length']}): "
               f"{c['tensors']['count']} tensors read back; logits of the file's weights within "
               f"{c['logits_relative']:.2g} of the model's (relative); transformers' GGUF reader: "
               + (f"matches ({t['relative']:.2g})" if t["checked"] else f"not checked ({t['reason']})"))
