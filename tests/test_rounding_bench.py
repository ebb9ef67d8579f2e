"""``benchmarks/rounding.py``: the 50% configuration as shipped and three variants that compute the same quantities
with other rounding; each row says whether its units and weights equal the shipped pass's to the bit."""

from __future__ import annotations

import json
import math

import torch

from scripts import benchmark_script


def test_quick_rows_and_the_patches_are_undone(tmp_path):
    bench = benchmark_script("rounding")
    from headprune.compression import blockwise
    from headprune.core.cut import obs

    before = (blockwise._AttentionReplay.hooks, obs._State.__init__, obs._inverse_covariance)
    out = bench.main(["--quick", "--output", str(tmp_path / "r.json")])
    assert (blockwise._AttentionReplay.hooks, obs._State.__init__, obs._inverse_covariance) == before
    rows = {r["method"]: r for r in out["rows"]}
    assert list(rows) == ["shipped", "sites run, not replayed", "float32 greedy", "float32 inverse"]
    assert rows["shipped"]["tensors_not_bit_equal"] == 0 and rows["shipped"]["same_units"]
    assert all(math.isfinite(r["held_out_perplexity"]) and r["tensors"] > 0 for r in rows.values())
    assert json.loads((tmp_path / "r.json").read_text())["rows"] == json.loads(json.dumps(out["rows"]))
    again = bench.main(["--quick", "--output", str(tmp_path / "r.json")])  # resumes: no row run twice
    assert json.loads(json.dumps(again["rows"])) == json.loads(json.dumps(out["rows"]))  # its seconds too


def test_the_float32_greedy_patch_really_runs_the_greedy_in_float32():
    """A reference outside the benchmark's comparison: the patched greedy's state dtype, read from inside."""
    bench = benchmark_script("rounding")
    from headprune.core.cut import obs

    seen = []
    real = obs._State.remove

    def remove(self, original):
        seen.append(self.hinv.dtype)
        return real(self, original)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 6, generator=g, dtype=torch.float64)
    w = torch.randn(3, 6, generator=g, dtype=torch.float64)
    obs._State.remove = remove
    try:
        obs.greedy_removal(w, x.mean(0), x.T @ x / 50, [(range(6), 2)], 1, 0.01)
        with bench._float32_greedy():
            obs.greedy_removal(w, x.mean(0), x.T @ x / 50, [(range(6), 2)], 1, 0.01)
    finally:
        obs._State.remove = real
    assert torch.float64 in seen and torch.float32 in seen and seen[0] == torch.float64 and seen[-1] == torch.float32


def test_the_float32_inverse_patch_inverts_in_float32():
    """Against numpy's float64 inverse of the same ridged covariance: the patched inverse is float64 in dtype but off
    by float32 rounding, the shipped one by float64 rounding."""
    import numpy as np

    bench = benchmark_script("rounding")
    from headprune.core.cut import obs

    g = torch.Generator().manual_seed(0)
    x = torch.randn(200, 40, generator=g, dtype=torch.float64)
    mean, second = x.mean(0), x.T @ x / 200
    want = np.linalg.inv(obs.ridged_covariance(mean, second, 0.01).numpy())
    shipped = obs._inverse_covariance(mean, second, 0.01).numpy()
    with bench._float32_inverse():
        patched = obs._inverse_covariance(mean, second, 0.01)
    assert patched.dtype == torch.float64
    scale = np.abs(want).max()
    assert np.abs(shipped - want).max() <= 1e-12 * scale
    assert 1e-9 * scale < np.abs(patched.numpy() - want).max() <= 1e-4 * scale
