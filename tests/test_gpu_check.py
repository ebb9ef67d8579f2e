"""``benchmarks/gpu_check.py`` without a CUDA device: a clear message, a non-zero exit, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_without_cuda_says_so_and_writes_nothing(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--output", str(out)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "no CUDA device" in run.stderr and str(out) in run.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
