"""`sampan.onnx.backend`: sampan as an ONNX backend (`onnx.backend.base.Backend`).

`prepare(model)` imports a model with `sampan.onnx.to_layer` and returns a `SampanRep`
whose `run(inputs)` runs it eagerly (no autograd) and returns numpy arrays, one per graph
output, in a namedtuple keyed by output name. Inputs and outputs of the dtypes sampan
emulates (uint16/32/64, float8, float4, int4/int2: `sampan/onnx/emulate.py`) are numpy /
ml_dtypes arrays of the declared dtype. `run_model` and `run_node` are the one-off
forms; `supports_device("CPU")` is True (sampan's numpy backend).

`node_cases()` and `run_cases()` run the official node conformance suite (the cases that
`onnx.backend.test.loader.load_model_tests(kind="node")` generates) against any backend
with the onnx runner's comparison (output count, shapes, dtypes, each case's rtol/atol);
`tests/onnx/test_conformance.py` and `benchmarks/onnx_conformance.py` stand on them.

Example::

    >>> import sampan.onnx.backend as be
    >>> rep = be.prepare(onnx.load("model.onnx"))
    >>> (y,) = rep.run([x])                       # numpy in, numpy out
    >>> results = be.run_cases(be.node_cases())   # [CaseResult], one per node case
"""
from __future__ import annotations

import re
import time
import warnings
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from ..autograd import no_grad
from ..tensor import Tensor
from . import emulate
from .importer import to_layer
from .ops import OnnxError

__all__ = ["SampanBackend", "SampanRep", "CaseResult", "node_cases", "module_cases",
           "case_op_type",
           "run_cases", "per_op", "prepare", "run_model", "run_node", "supports_device"]


class SampanRep(BackendRep):
    """A prepared model: `run(inputs)` takes a list of arrays (graph-input order) or a
    dict keyed by input name, and returns the outputs as numpy arrays.

    sampan builds static graphs: axes, shapes, pads, `k` … must be known when the graph
    is built. A model that reads one from a graph input (the node suite does) fails
    that way when run as is; then `run` binds the values fed to those inputs as
    constants (integer inputs first, then every input of rank <= 1) and runs that model,
    one per distinct set of values (`specialized` tells whether the last run did)."""

    MAX_SPECIAL = 16        # specialised models kept per prepared model

    def __init__(self, layer, model=None):
        self.layer = layer
        self.model = model
        self.specialized = False
        self._special = {}
        self._outputs = namedtupledict("Outputs", layer.output_names)

    def run(self, inputs, **kwargs):
        names = self.layer.input_names
        if isinstance(inputs, dict):
            args = [inputs[n] for n in names if n in inputs]
            extra = sorted(set(inputs) - set(names))
            if extra:
                raise OnnxError(f"sampan.onnx.backend: the model has no input(s) {extra} "
                                f"(inputs: {', '.join(names)})")
        elif isinstance(inputs, (list, tuple)):
            args = list(inputs)
        else:
            args = [inputs]
        ts = [_tensor(names[k] if k < len(names) else f"#{k}", a) for k, a in enumerate(args)]
        raw = [a.numpy() if isinstance(a, Tensor) else a if a is None or isinstance(
            a, (list, tuple)) else np.asarray(a) for a in args]
        self.specialized = False
        try:
            with no_grad():
                outs = self.layer(*ts)
        except OnnxError as e:
            if _NEEDS_STATIC not in str(e) or self.model is None or len(ts) != len(names):
                raise
            outs = self._run_specialized(names, ts, raw, e)
            self.specialized = True
        outs = outs if isinstance(outs, tuple) else (outs,)
        # emulated dtypes (uint16/32/64, float8, int4 ...) come back as declared
        return self._outputs(*self.layer.declared(outs))

    def _run_specialized(self, names, ts, arrays, err):
        arr = [isinstance(a, np.ndarray) for a in arrays]
        stages = ([k for k, a in enumerate(arrays) if arr[k] and a.dtype.kind in "iub"],
                  [k for k, a in enumerate(arrays)
                   if arr[k] and (a.dtype.kind in "iub" or a.ndim <= 1)])
        for fold in stages:
            if not fold:
                continue
            key = tuple((k, arrays[k].dtype.str, arrays[k].shape, arrays[k].tobytes())
                        for k in fold)
            layer = self._special.get(key)
            if layer is None:
                layer = to_layer(_bind_inputs(self.model, {names[k]: arrays[k]
                                                           for k in fold}))
                layer.eval()
                if len(self._special) >= self.MAX_SPECIAL:
                    self._special.pop(next(iter(self._special)))
                self._special[key] = layer
            try:
                with no_grad():
                    return layer(*[t for k, t in enumerate(ts) if k not in fold])
            except OnnxError as e:
                if _NEEDS_STATIC not in str(e):
                    raise
        raise err


_NEEDS_STATIC = "must be known when the graph is built"


def _bind_inputs(model, values):
    """A copy of `model` whose inputs named in `values` are initializers holding them."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [i for i in m.graph.input if i.name not in values]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    for name, a in values.items():
        m.graph.initializer.append(onnx.numpy_helper.from_array(a, name))
    return m


def _tensor(name, a):
    if isinstance(a, Tensor):
        return a
    if a is None or isinstance(a, (list, tuple)):
        return a            # an optional's none, a sequence: the layer reads them
    a = np.asarray(a)
    if a.dtype in emulate.BY_STORAGE:     # carried in a sampan dtype (see emulate.py)
        return Tensor(emulate.to_carrier(a, what=f"input {name!r}"))
    try:
        return Tensor(a)
    except Exception:  # noqa: BLE001 - a dtype sampan has none of
        raise OnnxError(f"sampan.onnx.backend: input {name!r} has dtype {a.dtype}, which "
                        "sampan has no tensor type for (sampan has bool, uint8, int8, int16, "
                        "int32, int64, float16, bfloat16, float32, float64, and emulates "
                        "uint16/32/64, float8, float4, int4, int2)") from None


class SampanBackend(Backend):
    """The ONNX backend API over `sampan.onnx.to_layer`."""

    @classmethod
    def is_compatible(cls, model, device="CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model, device="CPU", **kwargs) -> SampanRep:
        """Import `model` (ModelProto, bytes or path) for repeated `run` calls; a model
        given as bytes or a ModelProto with external data needs `base_dir=` (the folder
        of its data files)."""
        if not cls.supports_device(device):
            raise OnnxError(f"sampan.onnx.backend: device {device!r} is not supported; "
                            "sampan's ONNX backend runs on CPU")
        from .importer import read_model
        model = read_model(model, kwargs.get("base_dir"))
        layer = to_layer(model)
        layer.eval()
        return SampanRep(layer, model)

    @classmethod
    def run_model(cls, model, inputs, device="CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device="CPU", outputs_info=None, **kwargs):
        """Run one NodeProto on numpy inputs (wrapped in a one-node model at
        `opset_version`, default the newest the importer reads)."""
        from .importer import MAX_OPSET
        opset = kwargs.get("opset_version") or min(MAX_OPSET, onnx.defs.onnx_opset_version())
        if isinstance(inputs, dict):
            inputs = [inputs[n] for n in node.input if n]
        vis, feeds = [], []
        for name, a in zip([n for n in node.input if n], inputs):
            a = np.asarray(a)
            vis.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
            feeds.append(a)
        ops = [helper.make_opsetid(node.domain, opset)]
        # output types: as given, else by onnx's shape inference
        inferred = onnx.shape_inference.infer_shapes(
            helper.make_model(helper.make_graph([node], "run_node", vis, []), opset_imports=ops))
        known = {v.name: v for v in inferred.graph.value_info}
        outs = []
        for k, name in enumerate(node.output):
            if outputs_info is not None and k < len(outputs_info):
                dt, shape = outputs_info[k]
                outs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape))
            elif name in known:
                outs.append(known[name])
            else:
                raise OnnxError(f"sampan.onnx.backend.run_node: the type of output {name!r} "
                                f"of {node.op_type} is not known; pass outputs_info")
        g = helper.make_graph([node], "run_node", vis, outs)
        return cls.prepare(helper.make_model(g, opset_imports=ops), device).run(feeds)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except Exception:  # noqa: BLE001 - a device string onnx cannot parse
            return False


prepare = SampanBackend.prepare
run_model = SampanBackend.run_model
run_node = SampanBackend.run_node
supports_device = SampanBackend.supports_device


# ---------------------------------------------------------------------- conformance
class CaseResult(NamedTuple):
    name: str           # "test_abs"
    op_type: str        # the op the case tests ("Abs"; expanded cases: their base op's)
    passed: bool
    error: str          # "" when passed: else the exception's type and first line
    seconds: float
    specialized: bool = False   # ran with inputs bound as constants (see SampanRep)


def node_cases():
    """The onnx package's node conformance cases (generated in memory: ~10 s)."""
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return load_model_tests(kind="node")


def module_cases(modules, op_types):
    """[(op type, case)] of the node cases that onnx's case modules `modules` (names in
    `onnx.backend.test.case.node`: "loop", "scan" ...) generate, for `op_types` only: a
    few op types' cases in under a second, where `node_cases` makes them all."""
    import importlib
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in modules:
            importlib.import_module(f"onnx.backend.test.case.node.{m}")
    from onnx.backend.test.case.node import _NodeTestCases
    by_name = {c.name: c for c in _NodeTestCases}
    return [(case_op_type(c, by_name), c) for c in _NodeTestCases
            if case_op_type(c, by_name) in set(op_types)]


_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


def case_op_type(case, by_name=None) -> str:
    """The op type a case tests: its node's op type; an `_expanded` case (the op's
    function body spelt out) counts under the op it expands."""
    nodes = case.model.graph.node
    if len(nodes) == 1:
        return nodes[0].op_type
    base = _EXPANDED.sub("", case.name)
    if by_name and base in by_name and len(by_name[base].model.graph.node) == 1:
        return by_name[base].model.graph.node[0].op_type
    return nodes[-1].op_type if nodes else "?"


def _first_line(e, n=200):
    msg = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {msg[:n]}"


def run_case(backend, case) -> tuple[bool, str, bool]:
    """Prepare and run one case on `backend`; (passed, error, specialized) by the onnx
    runner's rule."""
    from onnx.backend.test.runner import Runner
    special = False
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            rep = backend.prepare(case.model, "CPU")
            for inputs, refs in case.data_sets:
                ins = [onnx.numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto)
                       else a for a in inputs]
                refs = [onnx.numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto)
                        else a for a in refs]
                outs = list(rep.run(ins))
                special |= bool(getattr(rep, "specialized", False))
                _assert_similar(Runner, refs, outs, case)
    except Exception as e:  # noqa: BLE001 - every failure is a failed case, with its reason
        return False, _first_line(e), special
    return True, "", special


def _assert_similar(runner, refs, outs, case):
    """The onnx runner's comparison, output by output; a sequence output element by
    element (the runner's own recursion takes len() of a 0-d element and fails)."""
    if len(outs) != len(refs):
        raise AssertionError(f"{len(outs)} outputs; expected {len(refs)}")
    for r, o in zip(refs, outs):
        if isinstance(r, (list, tuple)) or isinstance(o, (list, tuple)):
            if not isinstance(r, (list, tuple)) or not isinstance(o, (list, tuple)):
                raise AssertionError(f"a {type(o).__name__} output; expected a "
                                     f"{type(r).__name__}")
            _assert_similar(runner, list(r), list(o), case)
        else:
            runner.assert_similar_outputs([r], [o], rtol=case.rtol, atol=case.atol,
                                          model_dir=case.name)


def run_cases(cases, backend=SampanBackend, progress=None) -> list[CaseResult]:
    """Run every case on `backend` (any `onnx.backend.base.Backend`: SampanBackend,
    `onnxruntime.backend`); `progress(i, n)` is called as cases finish."""
    by_name = {c.name: c for c in cases}
    res = []
    for i, c in enumerate(cases):
        t = time.perf_counter()
        ok, err, special = run_case(backend, c)
        res.append(CaseResult(c.name, case_op_type(c, by_name), ok, err,
                              time.perf_counter() - t, special))
        if progress is not None:
            progress(i + 1, len(cases))
    return res


def per_op(results) -> dict:
    """{op_type: (cases, passed)} over `results`, sorted by op type."""
    table: dict = {}
    for r in results:
        n, p = table.get(r.op_type, (0, 0))
        table[r.op_type] = (n + 1, p + int(r.passed))
    return dict(sorted(table.items()))
