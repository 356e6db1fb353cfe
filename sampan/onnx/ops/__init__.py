"""The import table: one handler per ONNX op type (and opset range), building sampan ops.

A handler is ``fn(ctx, node, *inputs) -> Tensor | tuple[Tensor, ...]``:

- `node.op_type`, `node.name`, `node.attrs` (attribute values decoded to Python: ints,
  floats, str, lists, numpy arrays for tensors; `node.attr(name, default)` reads one),
  `node.n_outputs` (how many outputs the model uses);
- `inputs`: sampan Tensors, None for an omitted optional input (empty name); a sequence
  is a `Seq` (a list of Tensors), an optional an `Opt` (sampan/onnx/values.py);
- a graph attribute (If's branches, a Loop's or Scan's body) is read with
  `subgraph_attr(ctx, node, name)` and run with `run_subgraph(ctx, sub, args)`
  (sampan/onnx/subgraph.py), in a scope over the node's own;
- `ctx.opset` (the model's opset for the node's domain), `ctx.static(t, what)` (the numpy
  value of an input that must be known when the graph is built: shapes, axes, pads …;
  raises `OnnxError` naming the node when it is computed from data), `ctx.is_static(t)`,
  `ctx.make_static(array)` (a tensor whose value is known: Shape's output, say).

Nodes whose inputs are all static run once at import (constant folding), so shape
arithmetic (Shape -> Gather -> Concat -> Reshape) gives static values. Register with::

    @onnx_op("Relu", since=6)
    def relu(ctx, node, x):
        return sampan.relu(x)

`since` is the first opset at which the handler's semantics hold; a later registration of
the same op type with a higher `since` takes over from there (the ONNX versioning rule).
Category modules (`elementwise.py`, `nn.py` …) are imported by `load_all()`.
"""
from __future__ import annotations

import importlib
import pkgutil

from ..errors import OnnxError  # noqa: F401 - one error class for import and export


# (domain, op_type) -> [(since, fn)] sorted by since
HANDLERS: dict = {}

DOMAINS = ("", "ai.onnx")     # the default domain has two spellings


def onnx_op(*op_types, since=1, domain=""):
    """Register a handler for `op_types` from opset `since` on."""
    def deco(fn):
        for t in op_types:
            lst = HANDLERS.setdefault((domain, t), [])
            if any(s == since for s, _ in lst):
                raise ValueError(f"ONNX handler {t} since {since} is registered twice")
            lst.append((since, fn))
            lst.sort(key=lambda p: p[0])
        return fn
    return deco


def supported() -> list[str]:
    """The op types the importer knows, sorted."""
    load_all()
    return sorted(t for d, t in HANDLERS if d == "")


def lookup(domain, op_type, opset, node_name=""):
    """The handler for `op_type` at `opset`, or an OnnxError naming what is supported."""
    load_all()
    dom = "" if domain in DOMAINS else domain
    lst = HANDLERS.get((dom, op_type))
    where = f"node {node_name!r} ({op_type})" if node_name else op_type
    if not lst:
        raise OnnxError(f"sampan.onnx: {where} of domain {domain or 'ai.onnx'!r} at opset "
                        f"{opset} is not supported; supported op types: "
                        f"{', '.join(supported())}")
    fn = None
    for since, f in lst:
        if since <= opset:
            fn = f
    if fn is None:
        raise OnnxError(f"sampan.onnx: {where} at opset {opset} is not supported: the first "
                        f"version handled is opset {lst[0][0]}")
    return fn


_LOADED = False


def load_all():
    """Import every category module so the table is complete."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
