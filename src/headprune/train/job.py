"""What a training call is made of: the task's model, data and loss, handed to :func:`.loop.fit`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass
class Job:
    """What differs between the tasks; `fit` does the rest."""

    task: str
    model: Any
    tokenizer: Any
    settings: Any
    output_dir: Path
    info: dict
    resume: tuple[int, dict] | None
    batches: Callable[[int], list[list[int]]]  # epoch -> batches of example indices
    loss: Callable[[Any, list[int]], tuple[torch.Tensor, int, int]]  # -> (mean loss, weight, n examples)
    lr_factor: Callable[[int], float]  # 1-based global step -> multiplier of settings.lr
    evaluate: Callable[[Any], dict] | None
    stop_after_epoch: int | None
