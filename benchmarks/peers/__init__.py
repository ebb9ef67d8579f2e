"""Peer methods for LLM structured pruning, re-implemented from their papers and public code, for
``benchmarks/llm_peers.py``: each returns headprune's own plan
(:class:`headprune.compression.replay.Plan`, made by :func:`~peers.plan.peer_plan`: query heads dropped per
attention site, neurons dropped per FFN, for FLAP the compensation biases, for SlimGPT / OSSCAR the refit
weights) that ``headprune.compression.replay.apply_plan`` replays with headprune's own surgery, as
``headprune apply`` replays a compression, so every method shares one mechanism and one parameter count.

    flap           FLAP (An et al., AAAI 2024): fluctuation scores, adaptive widths, bias compensation
    wanda_sp       structured Wanda (FLAP's baseline): |W| x ||X||, the same share removed in every layer
    llm_pruner     LLM-Pruner (Ma et al., NeurIPS 2023): first-order Taylor of the coupled group, no LoRA
    slimgpt        SlimGPT (Ling et al., NeurIPS 2024): sequential group OBS removal, incremental ratios
    osscar         OSSCAR (Meng et al., ICML 2024): greedy Schur-complement removal, swap local search, refit
    obs            the second-order math both share, and their layer-by-layer driver
    sleb           SLEB (Song et al., ICML 2024): whole blocks by the calibration perplexity after removal
    shortgpt       ShortGPT (Men et al., 2024): whole blocks by Block Influence
    torch_pruning  Torch-Pruning 1.6.1's own LLM recipe, run as it is (its own surgery), under a time limit
    headprune_rows headprune through its public API: a list of PruneSettings configurations

Budgets are a share of the model's non-embedding parameters removed (:mod:`peers.plan`).

For encoders, ``benchmarks/encoder_peers.py`` (MiniLM on SST-2 at a share of the prunable FLOPs kept):

    kwon           Kwon et al. (NeurIPS 2022): mask Fisher, FLOPs-constrained search, rearrangement, mask tuning
    tp_encoder     Torch-Pruning 1.6.1's BERT recipe, bisected to the FLOPs target, in a child process
    encoder_report the generated block of docs/peers.md for the encoder rows
"""
