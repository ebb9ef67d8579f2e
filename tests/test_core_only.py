"""The core works without the optional ``study`` dependencies (scipy, sacrebleu, matplotlib, datasets).

A fresh interpreter hides those packages before ``headprune`` is imported, then runs the README's
path end to end (sites, mask, I_h, surgery, save/load, compress) plus the CLI import, and checks
that none of the hidden packages was ever imported and that a study module says which extra to install.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

SCRIPT = textwrap.dedent(
    r'''
    import importlib.abc
    import sys

    BLOCKED = ("scipy", "sacrebleu", "matplotlib", "datasets")
    assert not [m for m in sys.modules if m.partition(".")[0] in BLOCKED], "imported before the block"


    class Hidden(importlib.abc.MetaPathFinder):
        """Wraps a finder so that it never finds a blocked package or its submodules. With every
        finder wrapped, ``import scipy`` raises ModuleNotFoundError and ``importlib.util.find_spec``
        answers None, exactly as when the package is not installed (transformers probes with
        find_spec, so a finder that raised from find_spec would not simulate "not installed")."""

        def __init__(self, inner):
            self.inner = inner

        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                return None
            find = getattr(self.inner, "find_spec", None)
            return None if find is None else find(name, path, target)

        def __getattr__(self, attr):  # invalidate_caches, find_distributions, ...
            return getattr(self.inner, attr)


    sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
    for name in BLOCKED:
        try:
            __import__(name)
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError(f"{name} still importable")
    import importlib.util

    assert importlib.util.find_spec("scipy") is None

    import tempfile

    import torch
    import transformers as T

    import headprune as hp
    import headprune.cli  # noqa: F401  (the CLI app must import without the extras)
    from headprune.extras import MissingDependencyError



    def tiny_bert():  # a config of its own: pruning records the kept heads in model.config
        torch.manual_seed(0)
        config = T.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=37, max_position_embeddings=64, num_labels=3, pad_token_id=0)
        return T.BertForSequenceClassification(config).eval()


    model = tiny_bert()
    g = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(3, 64, (4, 7), generator=g),
             "attention_mask": torch.ones(4, 7, dtype=torch.long),
             "labels": torch.randint(0, 3, (4,), generator=g)}
    inputs = {k: v for k, v in batch.items() if k != "labels"}

    sites = hp.find_sites(model)
    assert [s.name for s in sites] == ["encoder.0.self", "encoder.1.self"], sites
    assert all(s.num_heads == 4 and s.head_dim == 8 for s in sites), sites

    with torch.no_grad():
        full = model(**inputs).logits
        with hp.masked(model, hp.mask_from_heads(model, {"encoder.0.self": [1, 2]})):
            masked = model(**inputs).logits
    assert not hp.is_masked(model)
    assert not torch.equal(full, masked)

    scores = hp.head_importance(model, [batch])
    assert set(scores) == {"encoder.0.self", "encoder.1.self"}
    for s in scores.values():
        assert s.shape == (4,) and bool(torch.isfinite(s).all()) and abs(float(s.norm()) - 1) < 1e-5, s

    plan = hp.lowest_heads(scores, n_heads=3)
    hp.prune_heads(model, plan)
    assert sum(s.num_heads for s in hp.find_sites(model)) == 5
    with torch.no_grad():
        pruned = model(**inputs).logits
    with tempfile.TemporaryDirectory() as tmp:
        hp.save_pruned(model, tmp)
        loaded = hp.load_pruned(tmp).eval()
        with torch.no_grad():
            again = loaded(**inputs).logits
    assert hp.kept_heads(loaded) == hp.kept_heads(model)
    scale = float(pruned.abs().max())
    assert float((again - pruned).abs().max()) <= 1e-6 * max(scale, 1.0), (again, pruned)

    fresh = tiny_bert()
    result = hp.compress(fresh, [batch], hp.PruneSettings(share=0.5, price="count", compensate="none", seq_len=7))
    assert result.sizes["before"]["heads"] == 8 and result.sizes["after"]["heads"] == 4, result.sizes
    assert sum(s.num_heads for s in hp.find_sites(result.model)) == 4
    assert sum(s.num_heads for s in hp.find_sites(fresh)) == 8  # compress works on a copy

    try:
        import headprune.evaluation.significance  # noqa: F401
    except MissingDependencyError as e:
        assert "headprune[study]" in str(e), str(e)
        assert isinstance(e, ImportError) and isinstance(e, hp.HeadpruneError)
    else:
        raise AssertionError("headprune.evaluation.significance imported without scipy")

    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
    assert not leaked, leaked
    print("OK")
    '''
)


def test_core_runs_without_study_extras(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.stdout.strip().splitlines()[-1:] == ["OK"], f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
