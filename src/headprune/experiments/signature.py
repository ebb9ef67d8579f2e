"""The first difference between two run signatures, in the words of the command line.

``difference_message(old, new)`` -> ``"--metric was 'accuracy', now 'f1'"`` (plus how many other
entries differ), or "" when the signatures are equal. Keys are named by the flag that sets them where
one does; content hashes by what they hash.
"""

from __future__ import annotations

import json
import re

TOP = {"model": "the model directory", "task": "--task", "data": "--data", "split": "the --data file name",
       "data_split": "--split", "n": "the number of examples", "seed": "--seed", "method": "the command",
       "choose_data": "--choose-data", "choose_n": "the number of --choose-data examples",
       "choose_split": "--choose-split", "data_b": "--data-b", "n_b": "the number of --data-b examples",
       "split_b": "--split-b", "importance_data": "--calib-data", "importance_split": "--calib-split",
       "importance_n": "the number of --calib-data examples", "oracle_from": "--oracle-from",
       "oracle_sha256": "the contents of --oracle-from's ablation.csv", "calib_data": "--calib-data", "calib_limit": "--calib-limit",
       "model_sha256": "the model's files (weights, config, tokenizer; sha256)",
       "statistics": "the significance tests (headprune.evaluation.significance.STATISTICS)"}
SETTINGS = {"alpha": "--alpha", "n_resamples": "--resamples", "seed": "--seed", "sites": "--sites",
            "fractions": "--step", "orders": "--orders", "seeds": "--seeds", "kinds": "--kind",
            "min_per_site": "--min-per-site", "datasets": "--names", "epochs": "the checkpoints' epochs",
            "prefix_cache": "--prefix-cache", "correction": "--correction", "oracle_sweep": "the oracle's sweep",
            "interval_test": "the curve points' test"}
OPTIONS = {"beams": "--beams", "num_beams": "--beams"}
HASH = re.compile(r"^[0-9a-f]{40,64}$")


def differences(old, new, path: tuple = ()) -> list[tuple[tuple, object, object]]:
    """(path, old value, new value) of every entry that differs, dicts compared key by key."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in list(old) + [k for k in new if k not in old]:
            out += differences(old.get(key), new.get(key), (*path, key))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new) and \
            any(isinstance(v, dict) for v in old):
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in differences(a, b, (*path, i))]
    return [] if old == new else [(path, old, new)]


def describe(path: tuple) -> str:
    """What a signature entry is, as a user names it (a flag, or what a hash covers)."""
    head, last = path[0], path[-1]
    if head == "data_sha256":
        return f"the contents of {last} (sha256)" if len(path) > 1 else "the data's contents (sha256)"
    if head == "code":
        return f"the code ({last})" if len(path) > 1 else "the code"
    if head == "evaluation" and len(path) > 2:
        return OPTIONS.get(last, "--" + str(last).replace("_", "-")) + " (as the evaluator used it)"
    if head == "options" and len(path) > 1:
        return OPTIONS.get(last, "--" + str(last).replace("_", "-"))
    if head == "settings" and len(path) > 1:
        return SETTINGS.get(last, ".".join(map(str, path)))
    if len(path) == 1:
        return TOP.get(head, head)
    return ".".join(map(str, path))


def show(value) -> str:
    if isinstance(value, str) and HASH.match(value):
        return value[:12]
    if value is None:
        return "unset"
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def difference_message(old: dict, new: dict) -> str:
    found = sorted(differences(old, new), key=lambda d: not describe(d[0]).startswith("--"))  # flags first
    if not found:
        return ""
    path, a, b = found[0]
    message = f"{describe(path)} was {show(a)}, now {show(b)}"
    others = list(dict.fromkeys(describe(p) for p, _, _ in found[1:]))
    if others:
        message += f" (also differs: {', '.join(others[:4])}{' ...' if len(others) > 4 else ''})"
    return message
