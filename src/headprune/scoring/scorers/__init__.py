"""The built-in scorers, one module each; :mod:`headprune.scoring.registry` registers them by name."""

from .fisher import FisherScorer
from .fluctuation import FluctuationScorer
from .ih import IhScorer
from .seeded import RandomScorer

BUILT_IN = (IhScorer(), FisherScorer(), RandomScorer(), FluctuationScorer(), FluctuationScorer(standardise=False))

__all__ = ["FisherScorer", "FluctuationScorer", "IhScorer", "RandomScorer", "BUILT_IN"]
