"""The error sampan's ONNX export and import raise."""
from __future__ import annotations

from ..errors import SampanError


class OnnxError(SampanError):
    """A program cannot be written as ONNX, or an ONNX model cannot be read."""
