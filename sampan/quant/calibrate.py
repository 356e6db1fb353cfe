"""Calibration: run a float program (or Layer) over a data loader and observe the inputs of
every matmul and conv2d, giving each one per-tensor int8 parameters.

The whole calibration set is read and checked first (dtype, shape against the program's
inputs, no NaN or infinity), so a bad batch is refused before any statistic is taken.

Example::

    >>> cal = sampan.quant.calibrate("mlp.sampan", [x0, x1], observer="percentile")
    >>> cal.acts          # {value id of each matmul/conv input: (scale, zero point)}
"""
from __future__ import annotations

import os

import numpy as np

from ..errors import SampanError
from ..jit.program import SavedProgram
from ..passes.quantize import anchors  # the rewrite's own rule (re-exported here)
from .observers import Observer


class QuantError(SampanError):
    """Quantisation was asked of something it cannot take (bad calibration data, a
    model without the parts to quantise, an unknown option)."""


class Calibration:
    """Per-tensor activation parameters: `acts` maps an IR value id (program) or a layer
    name (Layer) to (scale, zero point); `observer` names how they were found."""

    def __init__(self, acts, observer):
        self.acts = acts
        self.observer = observer

    def __repr__(self):
        return f"<Calibration {self.observer}: {len(self.acts)} activations>"


# ---------------------------------------------------------------------- the data
def _array(x):
    return np.asarray(getattr(x, "_data", x) if hasattr(x, "_data") else x)


def check_batches(data_loader, specs, what):
    """The calibration set as a list of tuples of arrays, each checked against `specs`
    ((shape, dtype) per input; str dims take any size). Raises QuantError."""
    if data_loader is None:
        raise QuantError(f"sampan.quant.calibrate({what}): got no calibration data; expected "
                         "an iterable of batches")
    out = []
    for b, item in enumerate(data_loader):
        arrs = list(item) if isinstance(item, (tuple, list)) else [item]
        if len(arrs) < len(specs):
            raise QuantError(f"sampan.quant.calibrate({what}): batch {b} has {len(arrs)} "
                             f"arrays; expected {len(specs)} (one per model input)")
        arrs = [_array(a) for a in arrs[:len(specs)]]
        for i, (a, (shape, dtype)) in enumerate(zip(arrs, specs)):
            ok = a.ndim == len(shape) and all(isinstance(d, str) or d == n
                                              for d, n in zip(shape, a.shape))
            if not ok or a.dtype != dtype:
                want = "[" + ",".join(map(str, shape)) + "]"
                raise QuantError(f"sampan.quant.calibrate({what}): batch {b} input {i} is "
                                 f"{a.dtype}{list(a.shape)}; the model expects {dtype}{want}")
            if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
                bad = int(np.sum(~np.isfinite(a)))
                raise QuantError(f"sampan.quant.calibrate({what}): batch {b} input {i} has "
                                 f"{bad} NaN or infinite values; calibration data must be "
                                 "finite (no statistics were taken)")
        out.append(tuple(arrs))
    if not out:
        raise QuantError(f"sampan.quant.calibrate({what}): the calibration set is empty")
    return out


# ---------------------------------------------------------------------- programs
def run_values(g, feeds, values):
    """Run graph `g` on `feeds` (one array per graph input) and return the arrays of
    `values` (graph values), compiled once per size (symbolic dims allowed)."""
    from ..jit import dynamic as _dyn
    h = g.copy()
    ids = {v.id: v for v in h.values()}
    h.outputs = [ids[v.id] for v in values]
    key = tuple(a.shape for a in feeds)
    cache = _CACHE.setdefault(id(g), {})
    prog = cache.get(key)
    if prog is None:
        from ..passes import PassManager
        from ..runtime import compile_graph
        if _dyn.symbols_of(h):
            prog = _dyn.SymbolicProgram(h, list(range(len(h.inputs))), release=True,
                                        label="calibration")
        else:
            prog = compile_graph(PassManager(["plan_memory"]).run(h))
        cache[key] = prog
    return prog(*feeds)


_CACHE: dict = {}


def calibrate_graph(g, feeds_of_batches, observer="minmax"):
    """Calibration of graph `g` on a list of per-input feed tuples (already checked)."""
    found = anchors(g)
    if not found:
        raise QuantError("sampan.quant.calibrate: the program has no matmul or conv2d with a "
                         "constant float32 weight to quantise")
    xs = list({n.inputs[0].id: n.inputs[0] for n, _ in found}.values())
    obs = {v.id: Observer(observer) for v in xs}
    try:
        for feeds in feeds_of_batches:
            for v, a in zip(xs, run_values(g, feeds, xs)):
                obs[v.id].update(a)
    finally:
        _CACHE.pop(id(g), None)
    return Calibration({k: o.qparams() for k, o in obs.items()}, observer)


class Program(SavedProgram):
    """A saved program's graph, meta.json and arrays (a `sampan.jit.SavedProgram`)."""

    def __init__(self, graph, meta, arrays, path):
        super().__init__(path, graph, meta, arrays)

    def arg_specs(self):
        return [(v.shape, v.dtype) for spec, v in zip(self.meta["inputs"], self.graph.inputs)
                if spec["kind"] == "arg"]

    def feeds(self, args):
        """One array per graph input: the call's arguments, the stored state."""
        return [args[spec["index"]] if a is None else a
                for spec, a in zip(self.meta["inputs"], self.fixed_inputs())]


def load_program(src) -> Program:
    """A Program from a saved directory, a `sampan.jit.load`ed program or a Graph (whose
    inputs are all arguments)."""
    from ..ir.graph import Graph
    if isinstance(src, Program):
        return src
    if isinstance(src, SavedProgram):       # a sampan.jit.load()ed program too
        return Program(src.graph, src.meta, src.arrays, src.path)
    if isinstance(src, Graph):
        meta = {"format": "sampan.jit", "version": 2, "graph_name": src.name,
                "inputs": [{"kind": "arg", "index": i} for i in range(len(src.inputs))],
                "n_args": len(src.inputs), "outputs": ["out"] * len(src.outputs),
                "out_tree": ({"t": 0} if len(src.outputs) == 1 else
                             {"tuple": [{"t": i} for i in range(len(src.outputs))]}),
                "n_outconst": 0}
        return Program(src, meta, {}, "<graph>")
    if isinstance(src, (str, os.PathLike)):
        p = SavedProgram.read(src)
        return Program(p.graph, p.meta, p.arrays, p.path)
    raise QuantError(f"sampan.quant: got a {type(src).__name__}; expected a saved program "
                     "directory, a sampan.jit.load()ed program or a Graph")


def calibrate(program_or_layer, data_loader, observer="minmax"):
    """Observe the inputs of every matmul/conv2d (Linear/Conv2d of a Layer) over
    `data_loader` and give each per-tensor int8 parameters.

    `program_or_layer`: a saved program directory, a `sampan.jit.load`ed program, a Graph
    (inputs in order, each batch one array per input), or a Layer. `observer`: "minmax",
    "percentile", "kl" or "mse". Returns a `Calibration`.

    Example: ``cal = sampan.quant.calibrate("m.sampan", batches, observer="kl")``"""
    from ..ir.graph import Graph
    Observer(observer)          # an unknown observer name fails here
    if isinstance(program_or_layer, Graph):
        g = program_or_layer
        specs = [(v.shape, v.dtype) for v in g.inputs]
        return calibrate_graph(g, check_batches(data_loader, specs, "graph"), observer)
    if hasattr(program_or_layer, "named_layers"):
        return _calibrate_layer(program_or_layer, data_loader, observer)
    prog = load_program(program_or_layer)
    batches = check_batches(data_loader, prog.arg_specs(), prog.path)
    return calibrate_graph(prog.graph, [prog.feeds(b) for b in batches], observer)


def _calibrate_layer(layer, data_loader, observer):
    from ..autograd import no_grad
    from ..nn import Conv2d, Linear
    targets = [(n, m) for n, m in layer.named_layers() if isinstance(m, (Linear, Conv2d))]
    if not targets:
        raise QuantError(f"sampan.quant.calibrate: {type(layer).__name__} has no Linear or "
                         "Conv2d layer to quantise")
    batches = list(data_loader) if data_loader is not None else None
    spec = _spec_of(batches[0]) if batches else ((), np.dtype(np.float32))
    data = check_batches(batches, [spec], type(layer).__name__)
    obs = {n: Observer(observer) for n, _ in targets}
    hooks = [m.register_forward_pre_hook(lambda mod, args, n=n: obs[n].update(_array(args[0])))
             for n, m in targets]
    was = layer.training
    layer.eval()
    try:
        with no_grad():
            for (x,) in data:
                layer(x)
    finally:
        for h in hooks:
            h.remove()
        layer.train(was)
    return Calibration({n: o.qparams() for n, o in obs.items()}, observer)


def _spec_of(item):
    a = _array(item[0] if isinstance(item, (tuple, list)) else item)
    return (("batch",) + tuple(a.shape[1:]), a.dtype)
