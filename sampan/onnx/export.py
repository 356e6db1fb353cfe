"""Export: a sampan program as an ONNX model.

`export(fn_or_layer, example_inputs, path)` traces the call with `sampan.jit` (a Layer in
eval mode, under no_grad), runs the "inference" pipeline (weights frozen into constants,
folded, fused), and hands the optimised Graph to `graph_to_model`, which walks it node by
node through each op's ONNX mapping in the op table (`OPS[op].onnx`: an ONNX op type, or
a lowering in `sampan/onnx/lower/`). Constants and weights become initializers; symbolic
dims (`dynamic_axes`) become `dim_param`s, and attributes that depend on them become
shape tensors computed from the inputs (Shape → Mul → Concat). The model is checked
(`onnx.checker.check_model(full_check=True)`, strict shape inference) before it is
written, atomically; one whose initializers pass 2 GB keeps them in a `.data` file.

Example::

    >>> sampan.onnx.export(mlp, (x,), "mlp.onnx", dynamic_axes={"x": {0: "batch"}})
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile

import numpy as np

from ..errors import SampanError
from ..ops.registry import Spec
from . import lower  # noqa: F401 - registers the lowerings in the op table
from .errors import OnnxError
from .export_control import _clean, _const_name, _dims, lower_nodes, node_protos
from .lower.context import Ctx, onnx_dtype
from .lower.peephole import fold_patterns

MIN_OPSET = 17
EXTERNAL_DATA_BYTES = 2 << 30      # protobuf's limit: larger models keep weights outside


# ---------------------------------------------------------------------- opsets
def max_opset() -> int:
    """The newest opset the installed onnx knows."""
    import onnx
    return onnx.defs.onnx_opset_version()


_ORT_OPSET = []


def default_opset() -> int:
    """The newest opset the installed onnxruntime runs: the highest `since_version` of the
    default-domain kernels its CPU provider registers (onnxruntime documents no API for it;
    its kernel registry is what it runs), capped by onnx's own; onnx's if no onnxruntime."""
    if not _ORT_OPSET:
        best = max_opset()
        try:
            from onnxruntime.capi import onnxruntime_pybind11_state as C
            vs = [k.version_range[0] for k in C.get_all_opkernel_def()
                  if k.domain in ("", "ai.onnx") and k.provider == "CPUExecutionProvider"]
            if vs:
                best = min(best, max(vs))
        except Exception:  # noqa: BLE001 - no (or an unusual) onnxruntime: onnx's newest
            pass
        _ORT_OPSET.append(best)
    return _ORT_OPSET[0]


def check_opset(opset) -> int:
    hi = max_opset()
    if opset is None:
        return default_opset()
    if type(opset) is not int or not MIN_OPSET <= opset <= hi:
        raise OnnxError(f"sampan.onnx.export: opset {opset!r} is not supported; expected an "
                        f"int from {MIN_OPSET} to {hi} (the newest the installed onnx knows)")
    return opset


# ---------------------------------------------------------------------- Graph -> ModelProto
def graph_to_model(g, args: dict, state: dict, outputs=None, *, opset=None,
                   output_names=None, name="sampan"):
    """The ONNX ModelProto of Graph `g`.

    `args` maps input positions of `g` to ONNX input names (the model's inputs), `state`
    input positions to (name, array) (initializers); `outputs` lists which of g.outputs
    the model returns (default: all), named by `output_names` (default "output", or
    "output_<i>")."""
    from onnx import helper, numpy_helper
    opset = check_opset(opset)
    outputs = list(range(len(g.outputs))) if outputs is None else list(outputs)
    dims = {}
    for p, nm in args.items():
        for d, s in enumerate(g.inputs[p].shape):
            if isinstance(s, str) and re.fullmatch(r"[A-Za-z_]\w*", s) and s not in dims:
                dims[s] = (nm, d)
    ctx = Ctx(opset, dims)
    names = {}
    read = {v.id for n in g.nodes for v in n.inputs} | {g.outputs[i].id for i in outputs}
    graph_inputs = []
    for p, v in enumerate(g.inputs):
        if v.id not in read:
            continue        # an unread input (state freeze_state made a constant)
        if p in args:
            names[v.id] = args[p]
            graph_inputs.append(helper.make_tensor_value_info(
                args[p], onnx_dtype(v.dtype), _dims(v.shape)))
        elif p in state:
            nm, arr = state[p]
            names[v.id] = nm
            ctx.inits[nm] = np.asarray(arr)
        else:
            raise OnnxError(f"sampan.onnx.export: graph input {p} ({v.type_str()}) is neither "
                            "an argument nor a weight")
        ctx.specs[names[v.id]] = Spec(v.shape, v.dtype)
        ctx.used.add(names[v.id])
    for c in g.consts:
        if c.id in read:
            nm = ctx.const(c.const, _const_name(c.name), exact=bool(c.name))
            names[c.id] = nm
            ctx.specs.setdefault(nm, Spec(c.shape, c.dtype))
    lower_nodes(ctx, g, names)
    out_names = _out_names(output_names, len(outputs))
    clash = set(out_names) & (set(args.values()) | set(ctx.inits) | {
        o for _, _, outs, _ in ctx.nodes for o in outs})
    if clash:
        raise OnnxError(f"sampan.onnx.export: output names {sorted(clash)} are already the "
                        "names of inputs or weights; choose others with output_names=")
    # names a subgraph reads from the enclosing graph stay as they are (kept, not renamed)
    fold_patterns(ctx, {names[g.outputs[i].id] for i in outputs} | ctx.outer_reads)
    needed = {i for _, ins, _, _ in ctx.nodes for i in ins} | {names[g.outputs[i].id]
                                                               for i in outputs}
    needed |= ctx.outer_reads
    ctx.inits = {nm: a for nm, a in ctx.inits.items() if nm in needed}
    graph_outputs = []
    taken = {}
    for i, nm in zip(outputs, out_names):
        v = g.outputs[i]
        src = names[v.id]
        if not _rename(ctx, src, nm, taken):
            ctx.nodes.append(("Identity", [src], [nm], {}))
        taken[src] = nm
        graph_outputs.append(helper.make_tensor_value_info(nm, onnx_dtype(v.dtype),
                                                           _dims(v.shape)))
    nodes = node_protos(ctx.nodes)
    # np.array, not ascontiguousarray: a 0-d array stays 0-d
    inits = [numpy_helper.from_array(np.array(a, order="C"), nm) for nm, a in ctx.inits.items()]
    graph = helper.make_graph(nodes, name, graph_inputs, graph_outputs, inits)
    oid = helper.make_opsetid("", opset)
    from .. import __version__
    return helper.make_model(graph, opset_imports=[oid], producer_name="sampan",
                             producer_version=__version__,
                             ir_version=helper.find_min_ir_version_for([oid]))


def _rename(ctx, src, new, taken) -> bool:
    """Rename the node output `src` to graph output name `new` (no Identity needed) when a
    node made it, it is not already a graph output under another name and no subgraph
    reads it."""
    if src in taken or src in ctx.outer_reads or not any(
            src in outs for _, _, outs, _ in ctx.nodes):
        return False
    for _, ins, outs, _ in ctx.nodes:
        outs[:] = [new if o == src else o for o in outs]
        ins[:] = [new if i == src else i for i in ins]
    return True


def _out_names(names, n):
    if names is None:
        return ["output"] if n == 1 else [f"output_{i}" for i in range(n)]
    names = list(names)
    if len(names) != n or len(set(names)) != n:
        raise OnnxError(f"sampan.onnx.export: output_names has {len(names)} names; the "
                        f"program has {n} outputs (names must differ)")
    return names


# ---------------------------------------------------------------------- tracing
def _trace(fn_or_layer, example_inputs, dynamic):
    """(optimised Graph, input slots, output slots) of the call, as `sampan.jit.save`
    traces it (`sampan.jit.capture`); an ONNX model cannot check size guards per call,
    so one that some size breaks is refused."""
    from ..autograd import no_grad
    from ..jit.capture import capture
    with no_grad():
        c = capture(fn_or_layer, example_inputs, "inference", dynamic,
                    what="exported program", unguarded=True)
    return c.graph, c.slots, c.out_slots


def _input_names(input_names, params, n, example_inputs):
    if input_names is not None:
        names = list(input_names)
        if len(names) != n or len(set(names)) != n:
            raise OnnxError(f"sampan.onnx.export: input_names has {len(names)} names; the "
                            f"call has {n} tensor inputs (names must differ)")
        return names
    if n == len(example_inputs) and len(params) >= n and params[0] != "args":
        return [str(p) for p in params[:n]]
    return [f"input_{i}" for i in range(n)]


def _dynamic_from_axes(dynamic_axes, in_names, params, output_names):
    """PyTorch's dynamic_axes ({input name: {dim: symbol}} or {name: [dims]}) as jit's
    dynamic= (keyed by position). Entries for outputs are accepted and need nothing: an
    output's dims follow from the inputs' symbols."""
    if dynamic_axes is None:
        return None
    if not isinstance(dynamic_axes, dict):
        raise OnnxError(f"sampan.onnx.export: dynamic_axes must be a dict {{input name: "
                        f"{{dim: symbol}}}}; got {dynamic_axes!r}")
    outs = set(output_names or ())
    out = {}
    for key, spec in dynamic_axes.items():
        if isinstance(spec, (list, tuple)):
            spec = {d: f"{_clean(key)}_dim{d}" for d in spec}
        if key in in_names:
            out[in_names.index(key)] = spec
        elif key in params and params.index(key) < len(in_names):
            out[params.index(key)] = spec
        elif not (key in outs or (output_names is None and str(key).startswith("output"))):
            raise OnnxError(f"sampan.onnx.export: dynamic_axes names {key!r}, which is no "
                            f"input (inputs: {in_names}) or output")
    return out or None


def export(fn_or_layer, example_inputs, path, *, opset=None, input_names=None,
           output_names=None, dynamic_axes=None, external_data_threshold=EXTERNAL_DATA_BYTES):
    """Trace `fn_or_layer(*example_inputs)` and write it to `path` as an ONNX model.

    `opset` defaults to the newest that the installed onnxruntime runs; `dynamic_axes`
    marks symbolic dims as in PyTorch (``{"x": {0: "batch"}}``); a model whose weights
    pass `external_data_threshold` bytes keeps them in `<path>.data`. Returns the
    ModelProto written.

    Example::

        >>> sampan.onnx.export(sampan.nn.Linear(4, 2), (sampan.randn(3, 4),), "lin.onnx")
    """
    model = to_model(fn_or_layer, example_inputs, opset=opset, input_names=input_names,
                     output_names=output_names, dynamic_axes=dynamic_axes)
    save_model(model, path, external_data_threshold)
    return model


def to_model(fn_or_layer, example_inputs, *, opset=None, input_names=None,
             output_names=None, dynamic_axes=None):
    """The ONNX ModelProto `export` writes (not checked, not written)."""
    from ..tensor import Tensor
    opset = check_opset(opset)
    if isinstance(example_inputs, Tensor) or not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    from ..nn.layer import Layer
    # every layer in eval mode for the trace, each put back in its own mode after it
    modes = [(m, m.training) for m in Layer.layers(fn_or_layer)] \
        if isinstance(fn_or_layer, Layer) else []
    for m, _ in modes:
        m.__dict__["training"] = False
    try:
        params0 = _params_of(fn_or_layer)
        n_leaves = _count_leaves(example_inputs)
        in_names = _input_names(input_names, params0, n_leaves, example_inputs)
        dynamic = _dynamic_from_axes(dynamic_axes, in_names, params0, output_names)
        g, slots, out_slots = _trace(fn_or_layer, example_inputs, dynamic)
    finally:
        for m, mode in modes:
            m.__dict__["training"] = mode
    args, state = {}, {}
    read = {v.id for n in g.nodes for v in n.inputs} | {v.id for v in g.outputs}
    for p, (kind, ref) in enumerate(slots):
        if kind not in ("arg", "state") and g.inputs[p].id not in read:
            continue      # e.g. a weight's .grad the trace lifted but the program never reads
        if kind == "arg":
            args[p] = in_names[ref]
        elif kind == "state":
            state[p] = (_clean(g.inputs[p].name or f"state_{p}"), ref._data)
        else:
            raise OnnxError(f"sampan.onnx.export: the program reads a {kind!r} input; only "
                            "arguments and weights can be exported")
    outs = [i for i, (kind, _) in enumerate(out_slots) if kind == "out"]
    return graph_to_model(g, args, state, outs, opset=opset, output_names=output_names)


def _params_of(fn):
    from ..jit.capture import unwrap
    return unwrap(fn)[2]


def _count_leaves(example_inputs):
    from ..jit.pytree import leaves_of
    return len(leaves_of((example_inputs, {})))


# ---------------------------------------------------------------------- checking, writing
def check(model, path=None):
    """Run onnx's full checker and strict shape inference; OnnxError on a failure."""
    import onnx
    try:
        onnx.checker.check_model(path if path is not None else model, full_check=True)
        if path is None:
            onnx.shape_inference.infer_shapes(model, strict_mode=True)
        else:     # a model with external data: inferred from the file, written beside it
            onnx.shape_inference.infer_shapes_path(path, path + ".shapes", strict_mode=True)
            os.remove(path + ".shapes")
    except Exception as e:  # noqa: BLE001 - any checker failure is an exporter bug
        raise OnnxError(f"sampan.onnx.export: the model written does not pass onnx's "
                        f"checker: {e}") from None


def save_model(model, path, external_data_threshold=EXTERNAL_DATA_BYTES):
    """Check `model` and write it to `path` atomically (a temporary folder beside it, then
    renames); initializers over `external_data_threshold` bytes in all go to
    `<name>.data` beside it."""
    import onnx
    path = os.fspath(path)
    size = sum(t.ByteSize() for t in model.graph.initializer)
    external = size > external_data_threshold
    if not external:
        check(model)
    folder, base = os.path.split(os.path.abspath(path))
    tmp = tempfile.mkdtemp(prefix=f".{base}.tmp-", dir=folder)
    try:
        p = os.path.join(tmp, base)
        if external:
            onnx.save_model(model, p, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=base + ".data", size_threshold=0)
            check(None, p)
            os.replace(os.path.join(tmp, base + ".data"), os.path.join(folder, base + ".data"))
        else:
            onnx.save_model(model, p)
        os.replace(p, path)
    except SampanError:
        raise
    except OSError as e:
        raise OnnxError(f"sampan.onnx.export: cannot write {path}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


# ---------------------------------------------------------------------- saved programs
def saved_to_model(program_dir, *, opset=None, input_names=None, output_names=None):
    """The ModelProto of a program written by `sampan.jit.save` (its Graph as saved, with
    its weights as initializers; symbolic dims it was saved with become dim_params)."""
    from ..jit.program import SavedProgram
    prog = SavedProgram.read(program_dir)
    g, meta = prog.graph, prog.meta
    n_args = prog.n_args
    names = _input_names(input_names, [], n_args, ()) if input_names is not None else \
        [f"input_{i}" for i in range(n_args)]
    args, state = {}, {}
    for p, (spec, a) in enumerate(zip(meta["inputs"], prog.fixed_inputs())):
        if spec["kind"] == "arg":
            args[p] = names[spec["index"]]
        else:      # weights, frozen feeds, generator states: fixed in a saved program
            state[p] = (_clean(g.inputs[p].name or spec["key"]), a)
    return graph_to_model(g, args, state, prog.out_positions, opset=opset,
                          output_names=output_names, name=str(meta.get("graph_name") or "sampan"))
