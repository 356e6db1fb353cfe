"""The onnxruntime provider: `engine` nodes (subgraphs the `onnxruntime_offload` pass
or the partition pass cut out, see `sampan/ops/engine.py`) run as onnxruntime sessions.

Here live the engine runner (`OrtRunner`, registered as engine "onnxruntime"), the ONNX
model of an engine body (`build_model`, built by `sampan/onnx/engine.py`, which registers
itself: the IR and the exporter sit on floors above this one), the session cache
(`runner_for`, keyed by what a session was built from, so clones of a predictor share
sessions; onnxruntime's `run` is thread-safe) and the binder of one engine node
(`bind_engine`: one session per node and input shapes, the node's constants as
initializers).

Putting "onnxruntime" first in a predictor's provider list (`Config.set_providers`)
offloads every node onnxruntime supports; the partition pass gives it the engine nodes.

Example::

    >>> from sampan.backends import get_provider
    >>> get_provider("onnxruntime").supports(engine_node)
    True
"""
from __future__ import annotations

import threading
import warnings

import numpy as np

from ...errors import SampanError
from ...ops.engine import ENGINES, EngineError, register_engine, set_runner_for
from ...ops.registry import OPS
from ..provider import Provider


class OrtRunner:
    """One onnxruntime InferenceSession: `run(list of arrays) -> list of arrays`."""

    def __init__(self, model_bytes, n_inputs, threads=None):
        import onnxruntime as ort
        so = ort.SessionOptions()
        if threads:
            so.intra_op_num_threads = int(threads)
        so.log_severity_level = 3          # warnings about unused initializers are noise
        self.session = ort.InferenceSession(model_bytes, so,
                                            providers=["CPUExecutionProvider"])
        self.in_names = [i.name for i in self.session.get_inputs()]
        self.out_names = [o.name for o in self.session.get_outputs()]
        self._run = self.session.run

    def run(self, arrays):
        return self._run(self.out_names, dict(zip(self.in_names, arrays)))




# ------------------------------------------------------------------ subgraph -> model
# Building the ONNX model of a body needs the IR and the ONNX exporter, both on floors
# above the providers: `sampan.onnx` registers the builder (`sampan/onnx/engine.py`) when
# it is imported, which `import sampan` does.
_BUILDER: dict = {"model": None, "subgraph": None, "opset": None}


def set_model_builder(model, subgraph, opset=None) -> None:
    """Register `model(inputs, body, outputs, opset=None) -> ModelProto`,
    `subgraph(inputs, body, outputs) -> (Graph, {input position: name})` and
    `opset(opset) -> int` (the opset a model gets: None the default, else checked)
    (`sampan.onnx` does this on import)."""
    _BUILDER["model"], _BUILDER["subgraph"] = model, subgraph
    _BUILDER["opset"] = opset


def _builder(what):
    fn = _BUILDER[what]
    if fn is None:
        raise EngineError("engine: no ONNX model builder registered (import sampan.onnx)")
    return fn


def subgraph(inputs, body, outputs):
    """A Graph of the body. `inputs`: per input an ndarray (becomes a named constant, an
    initializer of the model) or a (shape, dtype) pair (a graph input). Returns (graph,
    {graph input position: ONNX input name})."""
    return _builder("subgraph")(inputs, body, outputs)


def build_model(inputs, body, outputs, opset=None):
    """The ONNX ModelProto of an engine body (see `subgraph` for `inputs`)."""
    return _builder("model")(inputs, body, outputs, opset=opset)


def check_opset(opset=None) -> int:
    """The ONNX opset an engine model is built for: `opset` checked against what the
    installed onnx knows, or the default for None."""
    return _builder("opset")(opset)


_CACHE: dict = {}              # key -> (runner, the constant arrays, kept alive for the key)
_CACHE_MAX = 256
_LOCK = threading.Lock()


def runner_for(engine, inputs, body, outputs, threads=None):
    """The cached runner of a body for these inputs (arrays by identity, specs by value)."""
    key = (engine, body, outputs, threads,
           tuple(("w", id(x)) if isinstance(x, np.ndarray) else
                 (tuple(x[0]), np.dtype(x[1]).str) for x in inputs))
    hit = _CACHE.get(key)
    if hit is not None:
        return hit[0]
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            return hit[0]
        try:
            model = build_model(inputs, body, outputs)
            runner = ENGINES[engine](model.SerializeToString(),
                                     sum(not isinstance(x, np.ndarray) for x in inputs),
                                     threads)
        except SampanError as e:
            raise EngineError(f"engine {engine!r}: cannot build the subgraph of "
                              f"{[b[0] for b in body]}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the runtime refused the model: say which
            raise EngineError(f"engine {engine!r}: {type(e).__name__} building a session "
                              f"for the subgraph of {[b[0] for b in body]}: {e}") from None
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = (runner, [x for x in inputs if isinstance(x, np.ndarray)])
        return runner


def clear_cache() -> None:
    """Drop every cached session (they are rebuilt on the next call)."""
    with _LOCK:
        _CACHE.clear()


# ---------------------------------------------------------------------- runtime binder
def bind_engine(node, inplace=None):
    """The compiled kernel of one engine node: its session is built here, once per node
    and input shapes (cached; clones and recompiles for a seen shape reuse it)."""
    from ..._threads import get_num_threads
    a = node.attrs
    ins = [v.const if v.is_const else (tuple(v.shape), v.dtype) for v in node.inputs]
    for v in node.inputs:
        if not v.is_const and not all(isinstance(d, int) for d in v.shape):
            raise EngineError(f"engine node at {node.loc or '?'}: input {v.type_str()} has "
                            "symbolic dims; compile the graph for concrete sizes")
    try:
        run = runner_for(a["engine"], ins, a["body"], a["outputs"], get_num_threads()).run
    except EngineError as e:   # the group lowered node by node, but not as a whole
        warnings.warn(f"engine node at {node.loc or '?'}: {e}; its "
                      f"{len(a['body'])} ops run their op-table kernels instead",
                      RuntimeWarning, stacklevel=2)
        run = _interpreter(node)
    feed = [i for i, v in enumerate(node.inputs) if not v.is_const]
    single = len(node.outputs) == 1
    dts = [v.dtype for v in node.outputs]

    def kernel(*arrays, out=None):
        res = run([arrays[i] for i in feed])
        res = [r if r.dtype == dt else r.astype(dt) for r, dt in zip(res, dts)]
        if out is not None:
            for j, b in enumerate(out):
                if b is not None:
                    np.copyto(b, res[j])
                    res[j] = b
        return res[0] if single else tuple(res)
    return kernel


def _interpreter(node):
    """The body run with the op table's numpy kernels (the fallback of `bind_engine`)."""
    body, outputs = node.attrs["body"], node.attrs["outputs"]
    feed = [i for i, v in enumerate(node.inputs) if not v.is_const]
    consts = {i: v.const for i, v in enumerate(node.inputs) if v.is_const}

    def run(arrays):
        vals = [consts[i] if i in consts else None for i in range(len(node.inputs))]
        for i, x in zip(feed, arrays):
            vals[i] = x
        for op_name, idx, attrs, _ in body:
            op = OPS[op_name]
            r = op.kernel(*[vals[k] for k in idx], **dict(attrs))
            vals.extend([np.asarray(x) for x in r] if op.n_out != 1 else [np.asarray(r)])
        return [vals[k] for k in outputs]
    return run


register_engine("onnxruntime", OrtRunner)
set_runner_for(runner_for)


class OnnxruntimeProvider(Provider):
    """Engine nodes as onnxruntime sessions (see the module doc)."""

    name = "onnxruntime"
    kernels = {"engine": bind_engine}
    node_kernels = ("engine",)

    def available(self) -> bool:
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            return False
        return True

    def supports(self, node) -> bool:
        return node.op == "engine"

    def bind(self, node, inplace=None):
        return bind_engine(node, inplace=inplace)


PROVIDER = OnnxruntimeProvider()

__all__ = ["ENGINES", "EngineError", "OrtRunner", "PROVIDER", "bind_engine", "build_model",
           "check_opset", "clear_cache", "register_engine", "runner_for", "set_model_builder",
           "subgraph"]
