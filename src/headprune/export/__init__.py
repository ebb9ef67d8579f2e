"""Pruned models for other runtimes: ONNX export checked against PyTorch, and onnxruntime timing."""

from .onnx import ExportError, export_onnx, onnx_session, time_onnx

__all__ = ["ExportError", "export_onnx", "onnx_session", "time_onnx"]
