"""Save and load compiled programs: a directory with

    graph.ir              the optimised Graph as text
    weights.safetensors   state inputs (parameters, buffers), large constants, example inputs
    meta.json             format version, input/output slots, output structure, sha256 of both

written atomically (temporary directory + rename) and verified on load; the loaded
program needs none of the model's Python code.

Example::

    >>> sampan.jit.save(model, "m.sampan", (x,))
    >>> m = sampan.jit.load("m.sampan"); y = m(x)
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid

import numpy as np

from .. import dtypes as _dt
from ..errors import SampanError
from ..tensor import Tensor, wrap

FORMAT = "sampan.jit"
VERSION = 1
_FILES = ("graph.ir", "weights.safetensors")


class LoadError(SampanError):
    """A saved program is missing, damaged or of an unknown format."""


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _enc(a):
    a = np.ascontiguousarray(a)
    if a.dtype == _dt.bfloat16 or a.dtype == np.float16:
        return a.view(np.uint16)
    return a


def _dec(a, name):
    d = _dt.as_dtype(name)
    return a.view(d) if a.dtype != d else a


def _tree_json(tree, consts):
    kind = tree[0]
    if kind == "T":
        return {"t": tree[1]}
    if kind in ("tuple", "list"):
        return {kind: [_tree_json(t, consts) for t in tree[1]]}
    if kind == "dict":
        return {"dict": [[k, _tree_json(t, consts)] for k, t in tree[1]]}
    if kind == "C":
        consts.append(tree[1]._data)
        return {"const": len(consts) - 1}
    v = tree[1]
    return {"static": v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)}


def _tree_py(j, leaves, consts):
    if "t" in j:
        return leaves[j["t"]]
    if "tuple" in j:
        return tuple(_tree_py(x, leaves, consts) for x in j["tuple"])
    if "list" in j:
        return [_tree_py(x, leaves, consts) for x in j["list"]]
    if "dict" in j:
        return {k: _tree_py(x, leaves, consts) for k, x in j["dict"]}
    if "const" in j:
        return wrap(consts[j["const"]].copy())
    return j["static"]


def save(fn_or_layer, path, example_inputs, passes="inference") -> str:
    """Trace `fn_or_layer(*example_inputs)`, optimise, and write a model directory."""
    from safetensors.numpy import save_file
    from ..passes import PassManager, pipeline
    from .api import JitFunction, _flatten, trace
    fn, state = fn_or_layer, []
    if isinstance(fn, JitFunction):
        state, fn = fn._state(), fn.fn
    elif hasattr(fn, "named_parameters"):
        layer = fn
        state = list(layer.named_parameters())
        if hasattr(layer, "named_buffers"):
            state += [(n, b) for n, b in layer.named_buffers() if b is not None]
    example_inputs = tuple(example_inputs)
    leaves = []
    _flatten((example_inputs, {}), leaves)
    g, slots, out_slots, out_tree, _ = trace(fn, example_inputs, {}, state)
    names = pipeline(passes) if isinstance(passes, str) else list(passes)
    # state the program reads but never writes is fixed in a saved program: passes that
    # know it (freeze_state, in the "inference" pipeline) may fold it into constants
    written = {id(ref) for kind, ref in out_slots if kind == "state"}
    g.meta["frozen"] = {i: ref._data for i, (kind, ref) in enumerate(slots)
                        if kind == "state" and id(ref) not in written}
    g = PassManager([p for p in names if p != "plan_memory"]).run(g)

    arrays, dtypes = {}, {}

    def put(key, a):
        arrays[key] = _enc(a)
        dtypes[key] = _dt.dtype_name(a.dtype)
    ins = []
    for i, ((kind, ref), v) in enumerate(zip(slots, g.inputs)):
        if kind == "arg":
            ins.append({"kind": "arg", "index": ref})
            continue
        key = f"input.{i}" + (f".{v.name}" if v.name else "")
        if kind == "state":
            a = ref._data
        elif kind == "grad":
            a = (leaves[ref[1]] if isinstance(ref, tuple) else ref).grad._data
        elif kind == "feed":  # a value supplied per call (e.g. a learning rate): frozen
            a = np.asarray(ref())
        else:
            a = np.array([ref.seed, ref.counter], np.int64)
        put(key, a)
        ins.append({"kind": kind, "key": key})
    text = str(g)  # names large constants
    for c in g.consts:
        if c.name is not None and f"ref={c.name!r}" in text:
            put(f"const.{c.name}", c.const)
    for i, t in enumerate(leaves):
        put(f"example.{i}", t._data)
    out_consts = []
    meta = {
        "format": FORMAT, "version": VERSION, "graph_name": g.name,
        "inputs": ins, "n_args": len(leaves),
        "outputs": [k for k, _ in out_slots],
        "out_tree": _tree_json(out_tree, out_consts), "dtypes": dtypes,
    }
    for i, a in enumerate(out_consts):
        put(f"outconst.{i}", a)
    meta["n_outconst"] = len(out_consts)

    path = os.fspath(path)
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    os.makedirs(tmp)
    try:
        with open(os.path.join(tmp, "graph.ir"), "w") as f:
            f.write(text)
        save_file(arrays, os.path.join(tmp, "weights.safetensors"))
        meta["sha256"] = {n: _sha256(os.path.join(tmp, n)) for n in _FILES}
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        for n in _FILES + ("meta.json",):
            with open(os.path.join(tmp, n), "rb") as f:
                os.fsync(f.fileno())
        old = None
        if os.path.exists(path):
            old = f"{path}.old-{uuid.uuid4().hex[:8]}"
            os.replace(path, old)
        os.replace(tmp, path)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


class Loaded:
    """A loaded program: call it like the original function (tensors in, tensors out).

    State outputs (e.g. a saved training step's parameters) update `self.state`."""

    def __init__(self, path, graph, meta, arrays, debug=False):
        from ..passes import PassManager
        from ..runtime import compile_graph
        self.path = path
        self.meta = meta
        self.graph = graph
        self.arrays = arrays
        g = PassManager(["plan_memory"]).run(graph)
        self.compiled = compile_graph(g, debug=debug)
        self.code = self.compiled.code
        self.out_consts = [arrays[f"outconst.{i}"] for i in range(meta.get("n_outconst", 0))]

    @property
    def example_inputs(self):
        return tuple(wrap(self.arrays[f"example.{i}"]) for i in range(self.meta["n_args"]))

    def input_arrays(self, args):
        from .api import _flatten
        leaves = []
        _flatten((tuple(args), {}), leaves)
        if len(leaves) != self.meta["n_args"]:
            raise SampanError(f"saved program {self.path}: got {len(leaves)} tensor inputs; "
                              f"expected {self.meta['n_args']}")
        out = []
        for spec, v in zip(self.meta["inputs"], self.graph.inputs):
            if spec["kind"] == "arg":
                a = leaves[spec["index"]]._data
                if tuple(a.shape) != tuple(v.shape) or a.dtype != v.dtype:
                    raise SampanError(
                        f"saved program {self.path}: input {spec['index']} is "
                        f"{a.dtype}{list(a.shape)}; expected {v.type_str()}")
                out.append(a)
            else:
                out.append(self.arrays[spec["key"]])
        return out

    def __call__(self, *args):
        args = tuple(a if isinstance(a, Tensor) else Tensor(a) for a in args)
        outs = self.compiled(*self.input_arrays(args))
        leaves = []
        for kind, a in zip(self.meta["outputs"], outs):
            if kind == "out":
                leaves.append(wrap(a))
        return _tree_py(self.meta["out_tree"], leaves, self.out_consts)


def read(path):
    """Read and verify a saved program: (graph, meta, arrays). Raises LoadError."""
    from safetensors.numpy import load_file
    from ..ir import ParseError, VerifyError, parse, verify
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise LoadError(f"sampan.jit.load: {path} is not a saved program directory")
    mpath = os.path.join(path, "meta.json")
    try:
        with open(mpath) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise LoadError(f"sampan.jit.load: {mpath} is missing (incomplete or damaged save)") \
            from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LoadError(f"sampan.jit.load: {mpath} is damaged (not valid JSON: {e})") from None
    if meta.get("format") != FORMAT:
        raise LoadError(f"sampan.jit.load: {path} is not a sampan.jit program "
                        f"(format {meta.get('format')!r})")
    if meta.get("version", 0) > VERSION:
        raise LoadError(f"sampan.jit.load: {path} has format version {meta['version']}; this "
                        f"sampan reads up to version {VERSION}: upgrade sampan")
    for n in _FILES:
        p = os.path.join(path, n)
        if not os.path.exists(p):
            raise LoadError(f"sampan.jit.load: {p} is missing")
        if _sha256(p) != meta.get("sha256", {}).get(n):
            raise LoadError(f"sampan.jit.load: {p} is damaged: its sha256 checksum does not "
                            "match the one recorded when it was saved")
    try:
        raw = load_file(os.path.join(path, "weights.safetensors"))
    except Exception as e:
        raise LoadError(f"sampan.jit.load: weights of {path} cannot be read: {e}") from None
    arrays = {k: _dec(a, meta["dtypes"][k]) for k, a in raw.items()}
    consts = {k[len("const."):]: a for k, a in arrays.items() if k.startswith("const.")}
    with open(os.path.join(path, "graph.ir")) as f:
        text = f.read()
    try:
        g = parse(text, consts)
        verify(g)
    except (ParseError, VerifyError) as e:
        raise LoadError(f"sampan.jit.load: graph of {path} is invalid: {e}") from None
    return g, meta, arrays


def load(path, debug: bool = False) -> Loaded:
    """Load a program written by `save`; verifies checksums, format version and the IR."""
    g, meta, arrays = read(path)
    return Loaded(os.fspath(path), g, meta, arrays, debug=debug)
