"""External data of an ONNX model: every tensor that keeps its bytes in a file beside the
model (initializers, Constant and other attributes, sparse tensors, subgraphs, functions)
is read through `read_external_data`, the one path they all take. A location must be a
relative path inside the model's folder (or the `base_dir=` given for a model passed as
bytes or a ModelProto): no `..`, no absolute path, no symbolic link on the way, a regular
file at the end. Nothing is ever resolved against the working directory."""
from __future__ import annotations

import os
import re

from .ops import OnnxError


def all_tensors(model):
    """(TensorProto, where) for every tensor a model holds: initializers, sparse
    initializers, node attributes (tensor, tensors, sparse tensor(s)), in the main graph,
    every subgraph of every node (If, Loop, Scan, modifier graphs) and every function."""
    def sparse(sp, where):
        yield sp.values, where + " (values)"
        yield sp.indices, where + " (indices)"

    def graph(g, where):
        for t in g.initializer:
            yield t, f"initializer {t.name!r}{where}"
        for sp in g.sparse_initializer:
            yield from sparse(sp, f"sparse initializer {sp.values.name!r}{where}")
        yield from nodes(g.node, where)

    def nodes(ns, where):
        for k, n in enumerate(ns):
            node = f"node {n.name or k!r} ({n.op_type}){where}"
            for a in n.attribute:
                what = f"attribute {a.name!r} of {node}"
                if a.HasField("t"):
                    yield a.t, what
                for t in a.tensors:
                    yield t, what
                if a.HasField("sparse_tensor"):
                    yield from sparse(a.sparse_tensor, what)
                for sp in a.sparse_tensors:
                    yield from sparse(sp, what)
                inner = f" in subgraph {a.name!r} of {node}"
                if a.HasField("g"):
                    yield from graph(a.g, inner)
                for g in a.graphs:
                    yield from graph(g, inner)

    yield from graph(model.graph, "")
    for f in model.functions:
        yield from nodes(f.node, f" in function {f.name!r}")


def external_tensors(model):
    import onnx
    for t, where in all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            yield t, where


def read_external_data(model, base_dir, path):
    """Read every external tensor of `model` in (the one path they all take): its location
    must be a relative path inside `base_dir` with no `..`, no symbolic link on the way and a
    regular file at the end; onnx's reader then checks offset and length against the
    file. Nothing is ever resolved against the working directory."""
    from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_tensor
    src = path if path is not None else "the model"
    for t, where in external_tensors(model):
        try:
            loc = ExternalDataInfo(t).location
        except ValueError as e:
            raise OnnxError(f"sampan.onnx: {where} of {src}: bad external data: {e}") from None
        if base_dir is None:
            raise OnnxError(
                f"sampan.onnx: {where} keeps its data in an external file ({loc!r}), but the "
                "model was given as bytes or a ModelProto, so there is no folder to find it "
                "in; pass base_dir= (the folder the data files are in) or load the model "
                "from its path")
        full = external_path(base_dir, loc, f"{where} of {src}")
        try:
            load_external_data_for_tensor(t, base_dir)
        except Exception as e:  # noqa: BLE001 - onnx's own refusals, restated
            raise OnnxError(f"sampan.onnx: {where} of {src}: external data {full} cannot be "
                            f"read: {e}") from None


def external_path(base_dir, loc, what):
    """`loc` resolved inside `base_dir`, or an OnnxError saying why it may not be read."""
    def refuse(why):
        return OnnxError(f"sampan.onnx: {what}: external data location {loc!r} {why}; "
                         f"external data must be a file inside the model's folder {base_dir}")

    if not loc:
        raise refuse("is empty")
    if os.path.isabs(loc) or loc.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", loc):
        raise refuse("is an absolute path")
    parts = re.split(r"[/\\]", loc)
    if ".." in parts:
        raise refuse("leaves the folder (..)")
    base = os.path.abspath(base_dir)
    cur = base
    for p in parts:
        if p in ("", "."):
            continue
        cur = os.path.join(cur, p)
        if os.path.islink(cur):
            raise refuse(f"goes through a symbolic link ({cur})")
    if not os.path.isfile(cur):
        raise refuse("is not a regular file" if os.path.exists(cur) else "does not exist")
    real = os.path.realpath(cur)
    if os.path.commonpath([real, os.path.realpath(base)]) != os.path.realpath(base):
        raise refuse("resolves outside the folder")
    return cur
