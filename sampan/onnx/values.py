"""The import side's values other than tensors: ONNX sequences and optionals, which
exist only while a graph is built (a traced program holds their tensors, never them)."""
from __future__ import annotations


class Seq(list):
    """An ONNX sequence value while the graph is built: its tensors, in order. `elem`
    is the ONNX element type of an empty one (0 if unknown)."""

    def __init__(self, items=(), elem=0):
        super().__init__(items)
        self.elem = elem


class Opt:
    """An ONNX optional value while the graph is built: `value` (a Tensor or a Seq) or
    None for an empty optional."""

    __slots__ = ("value",)

    def __init__(self, value=None):
        self.value = value
