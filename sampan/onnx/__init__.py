"""ONNX interchange: write sampan programs as ONNX models, read ONNX models back.

Example::

    >>> sampan.onnx.export(model, (x,), "model.onnx", dynamic_axes={"x": {0: "batch"}})
"""
from __future__ import annotations

from .errors import OnnxError
from .export import export  # export: writes a traced program as an ONNX model

__all__ = ["OnnxError", "export"]
