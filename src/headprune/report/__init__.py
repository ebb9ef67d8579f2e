"""Figures and the one-file HTML report of a run directory."""

from .html import build_report

__all__ = ["build_report"]
