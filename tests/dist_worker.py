"""Run by tests/test_distributed.py under torchrun (2 ranks): which rank computes which unit, sums reduced
across ranks, and mask tuning's least squares summed across ranks. Rank 0 writes what every rank saw."""

import json
import sys

import torch

from headprune.compression.tuning import tune_scales
from headprune.distributed import gather, init_from_env, map_units, rank_world, reduce_sums, shard, sharded
from test_distributed import tune_case

with sharded(init_from_env()):
    rank, world = rank_world()
    ran: list[str] = []

    def compute(key):
        ran.append(key)
        return [(key, {"square": int(key) ** 2, "rank": rank})]

    rows = map_units([str(i) for i in range(7)], compute)
    mine = list(shard(range(5)))  # batches 0..4: rank 1 gets 1 and 3
    sums = {"a": torch.tensor([float(sum(mine))], dtype=torch.float64)} if rank == 0 else {}  # rank 1: no "a"
    total, count = reduce_sums(sums, len(mine))
    model, batches, drop = tune_case()
    scales = {k: v.tolist() for k, v in tune_scales(model, batches, drop).scales.items()}
    report = {"rank": rank, "world": world, "ran": ran, "rows": rows, "a": total["a"].tolist(), "count": count,
              "scales": scales}
    everyone = gather(report)
    if rank == 0:
        json.dump(everyone, open(sys.argv[1], "w"))
