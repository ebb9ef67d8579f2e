"""Several processes on torch.distributed (launched by ``torchrun`` or ``accelerate launch``), no pool of
our own.

Inside :func:`sharded` (the CLI enters it when launched with ``WORLD_SIZE`` > 1), library calls split their
work across the ranks of the initialised process group and return what one process would:

- scores (I_h, Fisher) are data-parallel sums: each rank takes every ``world``-th batch, and the float64
  sums and example counts are all-reduced (:func:`reduce_sums`);
- evaluation: each rank evaluates every ``world``-th batch; the per-example arrays are all-reduced;
- sweeps (one-head ablation, all-but-one, curves) split their units: each unit runs exactly once, on one
  rank, in full (data sharding is off inside a unit, :func:`local`), and the rows are gathered after each
  round, so rank 0 appends them to the run directory as they finish and a rerun resumes.

Outside :func:`sharded`, or in one process, nothing changes: users who shard data themselves reduce the
sums and counts the library returns (:func:`headprune.importance_sums`, :class:`headprune.Fisher`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar

import numpy as np
import torch
import torch.distributed as dist

# Whether library work inside a `sharded()` block is split across ranks: per thread / task (a context variable)
_SHARDED: ContextVar[bool] = ContextVar("headprune_sharded", default=False)


def _group_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_world() -> tuple[int, int]:
    """(rank, world size) of the work split in force: (0, 1) outside :func:`sharded` or in a unit."""
    return _group_size() if _SHARDED.get() else (0, 1)


def is_main() -> bool:
    """True on the process that writes files: rank 0 inside :func:`sharded`, every process outside it."""
    return rank_world()[0] == 0


def spread() -> bool:
    """Whether work is split across several processes now."""
    return rank_world()[1] > 1


@contextmanager
def sharded(enabled: bool = True) -> Iterator[None]:
    """Split library work across the ranks of the initialised process group inside the block."""
    token = _SHARDED.set(enabled)
    try:
        yield
    finally:
        _SHARDED.reset(token)


def local() -> AbstractContextManager[None]:
    """Inside a sweep unit: everything runs on this rank alone, over all the data."""
    return sharded(False)


def init_from_env() -> bool:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1): NCCL with CUDA, else gloo."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not dist.is_available():
        return False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return True


def shard(items: Iterable) -> Iterator:
    """Every ``world``-th item, starting at this rank (all items in one process)."""
    rank, world = rank_world()
    for i, item in enumerate(items):
        if i % world == rank:
            yield item


def _comm_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def reduce_sums(totals: Mapping[str, torch.Tensor], count: int) -> tuple[dict[str, torch.Tensor], int]:
    """Sums and a count added up over the ranks (float64, one all-reduce); unchanged in one process.
    A rank that saw no batch contributes zeros of the shapes the others report."""
    if not spread():
        return dict(totals), count
    shapes: dict[str, tuple] = {}
    for part in gather({k: tuple(v.shape) for k, v in totals.items()}):
        shapes.update(part)
    names = sorted(shapes)
    device = _comm_device()
    flat = torch.cat([totals[n].to(device, torch.float64).flatten() if n in totals
                      else torch.zeros(int(np.prod(shapes[n])), dtype=torch.float64, device=device) for n in names]
                     + [torch.tensor([float(count)], dtype=torch.float64, device=device)])
    dist.all_reduce(flat)
    out, at = {}, 0
    for n in names:
        size = int(np.prod(shapes[n]))
        out[n] = flat[at: at + size].view(shapes[n]).cpu()
        at += size
    return out, int(round(float(flat[-1])))


def reduce_arrays(*arrays: np.ndarray) -> list[np.ndarray]:
    """Per-example arrays each rank filled at its own examples (zeros elsewhere), added up over the ranks."""
    if not spread():
        return list(arrays)
    device = _comm_device()
    out = []
    for a in arrays:
        t = torch.as_tensor(np.ascontiguousarray(a), dtype=torch.float64).to(device)
        dist.all_reduce(t)
        out.append(t.cpu().numpy().astype(a.dtype))
    return out


def gather(obj) -> list:
    """``obj`` from every rank, in rank order (``[obj]`` in one process)."""
    _, world = rank_world()
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for every rank (inside :func:`sharded`; nothing otherwise)."""
    if spread():
        dist.barrier()


def map_units(keys: Sequence[str], compute: Callable[[str], list[tuple[str, dict]]], run=None) -> dict[str, dict]:
    """{unit key: row} of every unit: those ``run`` holds, then the rest computed by ``compute(key)`` (which
    returns (key, row) pairs: the unit's own, or several for a unit that is a sequence of steps), each on one
    rank in rounds of ``world`` units; after each round every rank gets the rows and rank 0 appends them to
    ``run``. In one process: the plain loop."""
    rows = {k: _strip(run.get(k)) for k in keys if run is not None and run.done(k)}
    todo = [k for k in keys if k not in rows]
    rank, world = rank_world()
    for start in range(0, len(todo), world):
        chunk = todo[start: start + world]
        with local():
            mine = compute(chunk[rank]) if rank < len(chunk) else []
        for pairs in gather(mine) if world > 1 else [mine]:
            for key, row in pairs:
                if run is not None and not run.done(key):
                    run.add(key, row)
                rows[key] = row
    return rows


def _strip(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "unit"}
