"""`sampan.summary` (a model's layer tree with output shapes, parameters, FLOPs and
activation memory, like torchinfo / paddle.summary) and `sampan.flops` (the FLOPs of a
whole jitted program, counted from its graph).

Both read FLOPs from the op table (`OPS[name].flops`), never from a private list:
`summary` runs one eager forward with a dispatch mode (`sampan.ops.modes`) that counts
every op against the layers whose forward is running (forward pre-hooks and hooks on
every `Layer` keep that stack); `flops` traces the function with `sampan.jit`, runs the
pipeline's passes, and sums the formula over the optimised graph's nodes.

FLOPs count a multiply and an add as two (a GEMM of (M, K) @ (K, N) is 2·M·N·K) and one per
element of an elementwise op; torchinfo's "mult-adds" count a multiply-add as one and a bias
add as one, so for a Linear or Conv layer ``flops = 2 * mult_adds - bias_adds``.

Example::

    >>> s = sampan.summary(model, sampan.randn(32, 1, 8, 8))   # prints the table
    >>> s.total_params, s.total_flops
    >>> sampan.flops(model, sampan.randn(32, 1, 8, 8))
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import SampanError

__all__ = ["Summary", "SummaryRow", "flops", "graph_flops", "summary"]


@dataclass
class SummaryRow:
    """One layer of the tree. `params`/`trainable`/`flops`/`activation_bytes` include the
    layer's sub-layers; `own_params` are the parameters registered on the layer itself."""
    name: str                    # qualified name ("" for the root)
    type: str                    # class name
    depth: int                   # 0 for the root
    output_shapes: list = field(default_factory=list)   # of the last call
    params: int = 0
    trainable: int = 0
    own_params: int = 0
    flops: int = 0               # FLOPs of the ops its forward ran (all calls)
    activation_bytes: int = 0    # bytes of the op outputs its forward allocated (no views)
    output_bytes: int = 0        # bytes of what its forward returned (all calls)
    calls: int = 0

    @property
    def frozen(self) -> int:
        return self.params - self.trainable


class Summary:
    """What `sampan.summary` measured; ``str(s)`` is the table it prints."""

    def __init__(self, rows, all_rows, depth, total_params, trainable_params, total_flops,
                 activation_bytes, input_bytes, param_bytes):
        self.rows = rows                  # the rows shown (depth <= `depth`)
        self.all_rows = all_rows          # every layer of the tree
        self.depth = depth
        self.total_params = total_params
        self.trainable_params = trainable_params
        self.frozen_params = total_params - trainable_params
        self.total_flops = total_flops
        self.activation_bytes = activation_bytes
        self.input_bytes = input_bytes
        self.param_bytes = param_bytes    # {dtype name: bytes} over parameters and buffers

    @property
    def model_bytes(self) -> int:
        return sum(self.param_bytes.values())

    def row(self, name: str) -> SummaryRow:
        """The row of the layer with qualified name `name` ("" is the root)."""
        for r in self.all_rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def __repr__(self):
        return (f"<Summary {len(self.all_rows)} layers, {self.total_params:,} params, "
                f"{_si(self.total_flops)}FLOPs>")

    def __str__(self):
        head = ("Layer (type)", "Output shape", "Params", "Trainable", "FLOPs", "Activations")
        body = []
        for r in self.rows:
            label = ("  " * (r.depth - 1) + "└─" if r.depth else "") + (
                f"{r.name.rsplit('.', 1)[-1]} ({r.type})" if r.name else r.type)
            shapes = ", ".join(str(list(s)) for s in r.output_shapes) or "--"
            body.append((label, shapes, f"{r.params:,}" if r.params else "--",
                         f"{r.trainable:,}" if r.params else "--",
                         _si(r.flops) if r.flops else "--",
                         _bytes(r.activation_bytes) if r.activation_bytes else "--"))
        widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]

        def line(cells):
            return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(cells, widths)))
        rule = "=" * len(line(head))
        sizes = ", ".join(f"{k} {_bytes(v)}" for k, v in sorted(self.param_bytes.items()))
        total = self.input_bytes + self.activation_bytes + self.model_bytes
        out = [rule, line(head), rule] + [line(b) for b in body] + [rule]
        out += [f"Total params: {self.total_params:,}",
                f"Trainable params: {self.trainable_params:,}",
                f"Non-trainable params: {self.frozen_params:,}",
                f"Total FLOPs (forward): {_si(self.total_flops)}FLOPs ({self.total_flops:,})",
                rule,
                f"Input size: {_bytes(self.input_bytes)}",
                f"Forward activations: {_bytes(self.activation_bytes)}",
                f"Model size: {_bytes(self.model_bytes)}" + (f" ({sizes})" if sizes else ""),
                f"Estimated total: {_bytes(total)}",
                rule]
        return "\n".join(out)


def _si(n) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} "


def _bytes(n) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _tensors(obj, out):
    """Every Tensor in a (nested) output, in order."""
    from ..tensor import Tensor
    if isinstance(obj, Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            _tensors(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _tensors(x, out)
    return out


def op_flops(op, arrays, attrs) -> int:
    """FLOPs of one op application from the op table (0 where the op has no formula)."""
    if op.flops is None:
        return 0
    try:
        return int(op.flops(*arrays, **attrs))
    except Exception:  # noqa: BLE001 - a formula that cannot read these inputs: count 0
        return 0


def _as_inputs(example_inputs):
    """(args, kwargs) from a tensor, an array, a tuple/list of them, a dict of keyword
    inputs, or a shape (a tuple of ints: one float32 normal input of that shape)."""
    from ..tensor import Tensor
    from ..tensor import wrap as tensor

    def conv(x):
        return tensor(x) if isinstance(x, np.ndarray) else x
    if isinstance(example_inputs, dict):
        return (), {k: conv(v) for k, v in example_inputs.items()}
    if isinstance(example_inputs, (Tensor, np.ndarray)):
        return (conv(example_inputs),), {}
    if isinstance(example_inputs, (tuple, list)):
        if example_inputs and all(isinstance(d, int) for d in example_inputs):
            from .. import randn  # a shape, as torchinfo's input_size
            return (randn(*example_inputs),), {}
        return tuple(conv(x) for x in example_inputs), {}
    raise SampanError(f"sampan.summary: example_inputs is a {type(example_inputs).__name__}; "
                      "expected a Tensor, a tuple/list of inputs or a dict of keyword inputs")


def summary(layer, example_inputs, depth: int = 3, *, verbose: bool = True,
            grad: bool = False) -> Summary:
    """Run `layer` once on `example_inputs` and tabulate its layer tree: output shapes,
    parameter counts (trainable / frozen), FLOPs and activation memory per layer, the
    totals and the model's size in bytes per dtype. Prints the table unless
    ``verbose=False``; returns a `Summary`. `example_inputs` is a Tensor, a tuple/list of
    inputs, a dict of keyword inputs, or a shape such as ``(32, 1, 8, 8)``. Layers deeper than `depth` (the root is 0)
    are folded into their parents. The forward runs under ``no_grad`` unless
    ``grad=True``; buffers (BatchNorm statistics) are restored afterwards.

    Example::

        >>> s = sampan.summary(nn.Sequential(nn.Linear(4, 8), nn.ReLU()), sampan.randn(2, 4))
        >>> s.total_params
        40
    """
    from ..autograd import no_grad, set_grad_enabled
    from ..jit.api import JitFunction
    from ..ops import modes
    if isinstance(layer, JitFunction) and layer.layer is not None:
        layer = layer.layer                            # a sampan.jit(model): the model
    if not hasattr(layer, "named_layers"):
        raise SampanError(f"sampan.summary: expected a sampan.nn.Layer, got "
                          f"{type(layer).__name__}")
    args, kwargs = _as_inputs(example_inputs)
    named = list(layer.named_layers())
    rows = {id(m): SummaryRow(n, type(m).__name__, n.count(".") + 1 if n else 0)
            for n, m in named}
    for n, m in named:
        r = rows[id(m)]
        ps = m.parameters()
        r.params = sum(p.numel() for p in ps)
        r.trainable = sum(p.numel() for p in ps if p.requires_grad)
        r.own_params = sum(p.numel() for p in m.parameters(recurse=False))
    stack = []

    def pre(m, a):
        stack.append(rows[id(m)])

    def post(m, a, out):
        r = stack.pop()
        ts = _tensors(out, [])
        r.calls += 1
        r.output_shapes = [tuple(t.shape) for t in ts]
        r.output_bytes += sum(int(t._data.nbytes) for t in ts)

    def count(op, inputs, attrs, call_next):
        out = call_next(op, inputs, attrs)
        if stack and not op.view:
            n = op_flops(op, [t._data for t in inputs], attrs)
            b = sum(int(t._data.nbytes) for t in _tensors(out, []))
            for r in stack:
                r.flops += n
                r.activation_bytes += b
        return out

    handles = []
    for _, m in named:
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post))
    saved = [(b, b._data.copy()) for _, b in layer.named_buffers()]
    modes.push_mode(count)
    try:
        with no_grad() if not grad else set_grad_enabled(True):
            layer(*args, **kwargs)
    finally:
        modes.pop_mode(count)
        for h in handles:
            h.remove()
        for b, data in saved:   # a forward in training mode updates running statistics
            b._data[...] = data
    params, trainable, pbytes, seen = 0, 0, {}, set()
    for _, t in list(layer.named_parameters()) + list(layer.named_buffers()):
        if id(t) in seen:
            continue
        seen.add(id(t))
        key = str(t._data.dtype)
        pbytes[key] = pbytes.get(key, 0) + int(t._data.nbytes)
    for p in layer.parameters():
        params += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    root = rows[id(layer)]
    all_rows = [rows[id(m)] for _, m in named]
    s = Summary([r for r in all_rows if r.depth <= depth], all_rows, depth, params, trainable,
                root.flops, root.activation_bytes,
                sum(int(t._data.nbytes) for t in _tensors((args, kwargs), [])), pbytes)
    if verbose:
        print(s)
    return s


# ------------------------------------------------------------------------ whole programs
def graph_flops(graph) -> int:
    """Sum of the op table's FLOP formula over a Graph's nodes."""
    from ..ops.registry import OPS
    total = 0
    for node in graph.nodes:
        op = OPS.get(node.op)
        if op is not None:
            total += op_flops(op, node.inputs, node.attrs)
    return total


def flops(fn, *inputs, **kwargs) -> int:
    """FLOPs of the program `sampan.jit(fn)` runs for these inputs, counted from its
    optimised graph (traced and passed through the jit pipeline, not run: a training step
    changes no weights). `fn` is a function, a Layer or a `sampan.jit` function; a step
    that calls backward counts its gradient too.

    Example::

        >>> sampan.flops(nn.Linear(64, 10), sampan.randn(32, 64))   # 2*32*64*10 + 32*10
        41280
    """
    from ..jit import JitFunction, jit, trace
    from ..passes import PassManager
    jf = fn if isinstance(fn, JitFunction) else jit(fn)
    entry = jf.cached(inputs, kwargs)
    if entry is not None:
        return graph_flops(entry.graph)
    name = type(jf.layer).__name__ if jf.layer is not None else "main"
    g = trace(jf.fn, inputs, kwargs, jf.state_tensors(), name=name)[0]
    passes = [p for p in PassManager(jf.pipeline).passes if p != "plan_memory"]
    return graph_flops(PassManager(passes).run(g))
