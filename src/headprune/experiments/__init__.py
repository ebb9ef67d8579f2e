"""The paper's experiments (ablation sweeps, prefix cache, pruning curves, training dynamics), the
compression run and the demo, written as resumable run directories. Needs the ``study`` extra."""
