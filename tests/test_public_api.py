"""The public names, pinned: ``headprune.__all__`` and the command line's commands and flags.

A rename shows up here first, and this list changes with it (pre-1.0: no compatibility shims; CHANGELOG.md
lists what was renamed or removed).
"""

from __future__ import annotations

import inspect

import typer

import headprune
from headprune.cli import app

PUBLIC = [
    "__version__", "core", "scoring", "selection", "compression",
    "ConfigError", "DataError", "HeadpruneError", "MaskError", "PlanError", "SiteError", "UnsupportedModelError",
    "MissingDependencyError",
    "Site", "find_sites", "FFN", "find_ffns",
    "mask_heads", "unmask_heads", "is_masked", "masked", "ones_mask", "mask_from_heads", "masked_neurons",
    "head_importance", "importance_sums", "mask_gradients", "normalize_per_site", "fisher_information", "Fisher",
    "fluctuation_scores",
    "select_heads", "Budget", "HeadRule", "kv_groups", "lowest_heads",
    "DroppedHeads", "KeptHeads", "prune_heads", "replay_kept_heads", "kept_heads", "original_heads", "fold_scales",
    "prune_neurons", "kept_neurons", "save_pruned", "load_pruned", "load_model",
    "compress", "PruneSettings", "CompressResult", "score_heads", "Scores", "plan_heads", "CompressPlan",
    "text_batches",
]
DEPRECATED: list[str] = []  # none since 0.3.0 (the former names are gone, not kept)

TASK = ["--task", "--data", "--data2", "--split", "--text-column", "--text-pair-column", "--label-column",
        "--source-column", "--target-column", "--label-map", "--limit", "--batch-size", "--metric", "--beams",
        "--device", "--dtype", "--no-prefix-token"]
SWEEP = ["--sites", "--alpha", "--resamples", "--seed", "--correction", "--prefix-cache"]
COMMANDS = {
    "ablate": [*TASK, *SWEEP, "--output", "--fresh", "--quiet"],
    "apply": ["--device", "--dtype", "--no-verify", "--output"],
    "all-but-one": [*TASK, *SWEEP, "--choose-data", "--choose-data2", "--choose-split", "--calib-limit", "--output",
                    "--fresh", "--quiet"],
    "bench": ["--batch-sizes", "--decode", "--decode-batch", "--decode-new", "--decode-prompt", "--device", "--dtype",
              "--gqa", "--masked", "--min-repeat-s", "--no-memory", "--onnx", "--output", "--prune-fraction",
              "--prune-order", "--repeats", "--seed", "--seq-len", "--tgt-len", "--threads", "--no-verify",
              "--warmup", "--quiet"],
    "compress": [*TASK, "--calib-data", "--calib-data2", "--calib-split", "--calib-limit", "--allow-same-data",
                 "--units", "--share", "--n-keep", "--price", "--scores", "--compensate", "--gqa", "--same-per-site",
                 "--min-per-site", "--seq-len", "--tgt-len", "--damping", "--max-scale", "--target", "--no-guard",
                 "--val-share", "--bench-batch", "--bench-repeats", "--no-bench", "--seed", "--val-data", "--val-data2",
                 "--val-split", "--val-limit", "--fit-limit", "--distill-epochs", "--distill-lr", "--output", "--quiet",
                 "--no-verify", "--config", "--multiple-of", "--low-memory", "--steps",
                 "--step-standin", "--step-damping", "--score-batches", "--recover-tokens"],
    "cross-domain": [*TASK, *SWEEP, "--data-b", "--data2-b", "--split-b", "--names", "--output", "--fresh", "--quiet"],
    "curve": [*TASK, "--calib-data", "--calib-data2", "--calib-split", "--calib-limit", "--gqa", "--kind",
              "--min-per-site", "--oracle-from", "--orders", "--seeds", "--step", "--output", "--fresh", "--quiet"],
    "demo": ["--check", "--fresh", "--output", "--quick", "--quiet"],
    "dynamics": [*TASK, "--calib-data", "--calib-data2", "--calib-limit", "--calib-split", "--kind", "--step", "--output",
                 "--fresh", "--quiet"],
    "evaluate": [*TASK, "--block-size", "--heads-off", "--json", "--max-length", "--max-new-tokens", "--quiet"],
    "export": ["--format", "--opset", "--output", "--outtype", "--source-gguf", "--tolerance"],
    "lm-eval": ["--batch-size", "--defaults", "--include-path", "--limit", "--num-fewshot", "--output", "--tasks"],
    "importance": [*TASK, "--absolute", "--block-size", "--calib-limit", "--checkpoint-blocks", "--max-length",
                   "--normalize", "--scores", "--output", "--fresh", "--quiet"],
    "prune": ["--device", "--drop", "--dtype", "--output", "--no-verify", "--quiet"],
    "recover": ["--batch-size", "--block-size", "--checkpoint-every", "--data", "--device", "--dtype", "--eval-every",
                "--fresh", "--held-out-blocks", "--hidden-weight", "--lr", "--lr-grid", "--lr-steps", "--output",
                "--quiet", "--seed", "--teacher", "--tokens"],
    "report": [],
    "sites": ["--device", "--dtype", "--json", "--quiet"],
    "train classifier": ["--batch-size", "--data", "--epochs", "--eval-data", "--eval-limit", "--eval-split",
                         "--label-column", "--label-map", "--limit", "--lr", "--max-length", "--output", "--seed",
                         "--split", "--text-column", "--text-pair-column", "--threads", "--quiet"],
    "train translation": ["--batch-size", "--d-model", "--data", "--data2", "--epochs", "--eval-data", "--eval-data2",
                          "--eval-limit", "--eval-split", "--ffn-dim", "--heads", "--layers", "--limit", "--lr",
                          "--max-length", "--output", "--preset", "--seed", "--source-column", "--split",
                          "--target-column", "--threads", "--vocab-size", "--warmup-steps", "--quiet"],
}


def _flags(command, prefix: str = "") -> dict[str, list[str]]:
    """{command path: its long flags}, read from click's command objects (what the parser accepts)."""
    if hasattr(command, "commands"):
        out = {}
        for name, sub in command.commands.items():
            out |= _flags(sub, f"{prefix} {name}".strip())
        return out
    return {prefix: sorted(o for p in command.params for o in getattr(p, "opts", []) if o.startswith("--"))}


def test_public_names_are_pinned():
    assert headprune.__all__ == PUBLIC
    assert all(hasattr(headprune, n) for n in PUBLIC + DEPRECATED)
    assert not set(DEPRECATED) & set(headprune.__all__)


def test_exported_functions_return_exported_types():
    """What an exported function returns is exported too (or is a plain builtin / torch type)."""
    names = set(headprune.__all__)
    for fn, returned in [(headprune.compress, ("CompressResult",)), (headprune.score_heads, ("Scores",)),
                         (headprune.plan_heads, ("CompressPlan",)), (headprune.fisher_information, ("Fisher",)),
                         (headprune.find_sites, ("Site",)), (headprune.find_ffns, ("FFN",)),
                         (headprune.prune_heads, ("KeptHeads",))]:
        annotation = str(inspect.signature(fn).return_annotation)
        for name in returned:
            assert name in annotation and name in names, (fn.__name__, annotation)


def test_commands_and_flags_are_pinned():
    got = _flags(typer.main.get_command(app))
    assert sorted(got) == sorted(COMMANDS)
    for name, flags in COMMANDS.items():
        assert got[name] == sorted(flags), name
