"""Calibration blocks of ``benchmarks/llm_peers.py`` drawn from more than one text (``--calib-mix``), and the
held-out blocks each text keeps after them (issue #47).

Each text is cut into consecutive blocks (:class:`headprune.evaluation.lm.LanguageModelling`). The calibration
blocks are taken one of each text in turn (round-robin, in the order the texts are named; a text whose blocks
are used up is skipped), each text's from its start, so every batch of four mixes the texts. The held-out blocks
are, per text, the ``held / len(texts)`` blocks right after those it gave to calibration: no method reads them,
and they never overlap a calibration block (consecutive, non-overlapping blocks of one token stream).
"""

from __future__ import annotations

import torch


def mixed_blocks(texts: dict[str, torch.Tensor], n_calib: int, n_held: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(calibration blocks [n_calib, T] in round-robin order, held-out blocks [n_held, T], per text its counts)
    from ``texts``: name -> its consecutive blocks [N, T]."""
    k = len(texts)
    if n_held % k:
        raise SystemExit(f"--select-blocks {n_held}; allowed: a multiple of the {k} --calib-mix texts")
    held = n_held // k
    room = {name: blocks.shape[0] - held for name, blocks in texts.items()}  # blocks each can give calibration
    short = [f"{name} ({blocks.shape[0]} blocks)" for name, blocks in texts.items() if room[name] < 0]
    if short:
        raise SystemExit(f"--select-blocks {n_held}: {', '.join(short)} cannot hold {held} held-out blocks; allowed: "
                         "fewer held-out blocks or longer texts")
    taken = dict.fromkeys(texts, 0)
    order: list[tuple[str, int]] = []  # (text, its block index), in calibration order
    while len(order) < n_calib:
        ready = [name for name in texts if taken[name] < room[name]]
        if not ready:
            raise SystemExit(f"--calib-tokens: the texts {', '.join(texts)} give {sum(room.values())} calibration "
                             f"blocks besides their held-out ones, {n_calib} asked; allowed: fewer tokens")
        for name in ready[: n_calib - len(order)]:
            order.append((name, taken[name]))
            taken[name] += 1
    calib = torch.stack([texts[name][i] for name, i in order])  # [n_calib, T]
    held_out = torch.cat([texts[name][taken[name]:taken[name] + held] for name in texts])  # [n_held, T]
    counts = {name: {"calib_blocks": taken[name], "held_out_blocks": held, "blocks_in_text": texts[name].shape[0]}
              for name in texts}
    return calib, held_out, counts


def batches_of(blocks: torch.Tensor, size: int = 4) -> list[dict[str, torch.Tensor]]:
    """Model inputs with labels of ``blocks`` [N, T], ``size`` blocks a batch (as ``LanguageModelling.batches``)."""
    return [{"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x} for x in blocks.split(size)]
