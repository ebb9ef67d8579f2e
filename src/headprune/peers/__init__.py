"""Other structured-pruning methods, re-implemented in the library so that headprune's own compression can be
put beside them on the same model and text (``headprune demo``): :mod:`.flap` (FLAP, An et al. 2024) on the
shared parameter budget of :mod:`.ledger` and the channel statistics of :mod:`.stats`. The peer benchmark
(``benchmarks/peers``) builds its plans from the same code."""
