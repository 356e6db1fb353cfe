"""The ONNX model of an `engine` node's body: what the onnxruntime provider runs.

An engine body is a list of op-table entries over the node's inputs (see
`sampan/ops/engine.py`); turning it into a model needs the IR and the exporter, both on
floors above the providers. So this module builds it and registers the builder with
`sampan.backends.onnxruntime` (`set_model_builder`) when `sampan.onnx` is imported, which
`import sampan` does.
"""
from __future__ import annotations

import numpy as np

from ..backends.onnxruntime import EngineError, set_model_builder
from ..ir.graph import Graph
from .export import check_opset, graph_to_model


def subgraph(inputs, body, outputs):
    """A Graph of the body. `inputs`: per input an ndarray (becomes a named constant, an
    initializer of the model) or a (shape, dtype) pair (a graph input). Returns (graph,
    {graph input position: ONNX input name})."""
    g = Graph("engine")
    vals, args = [], {}
    for i, x in enumerate(inputs):
        if isinstance(x, np.ndarray):
            vals.append(g.add_const(x, name=f"w{i}"))
        else:
            args[len(g.inputs)] = f"x{i}"
            vals.append(g.add_input(x[0], x[1], name=f"x{i}"))
    for e in body:
        op, idx, attrs, n_out = e
        n = g.add_node(op, [vals[k] for k in idx], dict(attrs))
        if len(n.outputs) != n_out:
            raise EngineError(f"engine: body entry {op!r} has {len(n.outputs)} outputs; the "
                              f"node says {n_out}")
        vals.extend(n.outputs)
    g.outputs = [vals[k] for k in outputs]
    return g, args


def build_model(inputs, body, outputs, opset=None):
    """The ONNX ModelProto of an engine body (see `subgraph` for `inputs`)."""
    g, args = subgraph(inputs, body, outputs)
    return graph_to_model(g, args, {}, opset=opset,
                          output_names=[f"y{k}" for k in range(len(outputs))],
                          name="sampan_engine")


set_model_builder(build_model, subgraph, check_opset)
