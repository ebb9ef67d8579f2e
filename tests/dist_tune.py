"""Run by tests/test_distributed.py under torchrun: mask tuning's least squares summed across ranks."""

import json
import sys

from headprune.compression.tuning import tune_scales
from headprune.distributed import init_from_env, is_main, sharded
from test_distributed import tune_case

with sharded(init_from_env()):
    model, batches, drop = tune_case()
    result = tune_scales(model, batches, drop)
    if is_main():
        json.dump({k: v.tolist() for k, v in result.scales.items()}, open(sys.argv[1], "w"))
