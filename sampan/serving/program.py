"""Model kinds "program" and "onnxruntime": a saved sampan program (`sampan.jit.save`
output) behind the server.

A model directory of kind "program" is either the saved program itself (its
``graph.ir``/``meta.json``/... beside an optional ``config.json``) or a folder with a
``config.json`` whose ``"path"`` names the program (relative to the folder; default
``model.sampan``). It is run by a `sampan.inference` Predictor, one `clone()` per worker
thread. Config keys read here besides the generic ones (see `model.py`)::

    {"runtime": "numba",          # Predictor runtime: numba | numpy | onnxruntime
     "threads": 1,                # kernel/BLAS threads per run (process-wide for the
                                  # Predictor; onnxruntime's intra-op pool per session)
     "pad_batch": true,           # pad a batch to the next bucket size (below)
     "pad_step": 8,               # buckets every pad_step rows past 2 * pad_step
     "trim_to_mask": "attention_mask",   # cut padding columns (below); default none
     "trim_step": 8}              # ... to a multiple of trim_step columns

Trimming to the mask: clients of an encoder often pad every sentence to the tokenizer's
max_length (128) with mask 0. With ``trim_to_mask`` naming the mask input, a batch's
inputs are cut along axis 1 to its longest real row (the last column where any row's
mask is nonzero, rounded up to ``trim_step`` so a program compiles a few lengths), so
32 real tokens padded to 128 compute 32 columns, not 128. Only for a model whose answer
does not depend on masked columns (a BERT encoder with masked attention and mean
pooling over the mask); its outputs may have no dim of any size besides the batch. Each
(bucket, length) pair a program meets compiles once (0.1-0.3 s): a larger ``trim_step``
compiles fewer.

Threads: one a run by default. A server gets its parallelism from its worker threads
(``instance_count``) and from concurrent requests; a multi-threaded BLAS or onnxruntime
pool per run only adds threads that spin between calls and take the cores the event loop
and the other workers need (measured on a busy 2-core machine: a 64x784 @ 784x512
matmul took 70 ms with numpy's OpenBLAS at 2 threads, 0.6 ms at 1).

Batch buckets (`padding.py`): with ``pad_batch`` (the default for kind "program" when the
model batches) a batch is padded with zero rows up to the next bucket (a power of two up
to ``2 * pad_step``, then every ``pad_step`` rows, and the preferred batch sizes) and the
extra rows are dropped from the outputs, so a worker compiles a few executors of a
program with a symbolic batch dim, not one per size. Padded rows are computed like real
ones: with powers of two only, the MiniLM encoder's batches of ~20 requests at c=64 ran
as 32 rows (its batch-20 run 76 ms against 130 ms padded), while a new batch size costs
its first run ~0.1-0.3 s of compiling. The onnxruntime kind does not pad by default
(onnxruntime compiles nothing per shape).

Kind "onnxruntime" serves the same model through onnxruntime: an ``.onnx`` file in the
directory (``"onnx"`` in config.json names it; default the only ``*.onnx`` there) runs
in an `onnxruntime.InferenceSession` (one per worker thread); without one, the saved
program runs in a Predictor with ``Config.set_runtime("onnxruntime")``.
"""
from __future__ import annotations

import os

import numpy as np

from .model import (DATATYPES, ServedModel, ServingError, TensorSpec, datatype_of,
                    register_kind)
from .padding import bucket_of, buckets, pad_rows, preferred_sizes


def _program_path(name, directory, config):
    if os.path.exists(os.path.join(directory, "meta.json")):
        return directory
    rel = config.get("path", "model.sampan")
    if not isinstance(rel, str):
        raise ServingError(f"serving: model {name!r}: config.json 'path' must be a string; "
                           f"got {rel!r}")
    path = os.path.normpath(os.path.join(directory, rel))
    if not os.path.isdir(path):
        raise ServingError(f"serving: model {name!r}: {directory} holds no saved program "
                           f"(no meta.json there, and {path} is not a directory)")
    return path


def _threads(name, config):
    n = config.get("threads", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ServingError(f"serving: model {name!r}: threads must be a positive int; got "
                           f"{n!r}")
    return n


def _limit_blas(n):
    """Every BLAS library in the process to `n` threads. `Config.set_num_threads` sets
    one OpenBLAS (the first mapped; with scipy loaded that is scipy's, not numpy's), and
    numpy's own pool of 2 made a 64-row matmul take 70 ms instead of 0.6 on a busy
    2-core machine."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(n, user_api="blas")


def _dims(shape):
    return tuple(-1 if not isinstance(d, (int, np.integer)) or d < 0 else int(d)
                 for d in shape)


def _batchable(specs):
    """Every input has a first dim of any size (a symbolic batch dim)."""
    return bool(specs) and all(s.shape and s.shape[0] == -1 for s in specs)


def _max_batch(name, config, specs):
    mb = config.get("max_batch_size")
    if mb is None:
        return 64 if _batchable(specs) else 0
    if isinstance(mb, bool) or not isinstance(mb, int) or mb < 0:
        raise ServingError(f"serving: model {name!r}: max_batch_size must be an int >= 0; "
                           f"got {mb!r}")
    if mb > 0 and not _batchable(specs):
        raise ServingError(f"serving: model {name!r}: max_batch_size {mb} needs every input "
                           f"to have a symbolic first dim; inputs "
                           f"{[(s.name, list(s.shape)) for s in specs]}")
    return mb


def index_bounds(graph, names):
    """{input name: (n, where)}: the graph inputs (`names`: {Value id: name}) whose every
    value reaches an index of an `index_select`/`take_along_axis` over an axis of static
    size n, so a value outside [0, n) can only fail the run. `where` names the op and
    its source line. Example: an ``nn.Embedding(10, 4)`` over input "ids" gives
    ``{"ids": (10, "index_select at model.py:9")}``.

    The walk goes into the body of a `scan` of static length >= 1: the body runs on every
    slice of each xs, on every capture and on the initial carry, so their values reach
    the body's indexes too. It leaves `cond` branches (one of them runs) and `while_loop`
    bodies (they may run zero times) alone, and a scan of symbolic length (it may be 0)."""
    out: dict = {}
    _walk_bounds(graph, dict(names), out)
    return out


def _walk_bounds(graph, src, out):
    """`index_bounds` over one graph; `src`: Value id -> the program input whose values it
    holds (the caller's for a block's inputs)."""
    from ..ops.registry import OPS      # the op table says which ops index, which keep values
    for n in graph.nodes:
        op = OPS.get(n.op)
        if not n.inputs or op is None:
            continue
        first = src.get(n.inputs[0].id)
        if n.op == "scan" and n.blocks:
            length = n.attrs.get("length")
            if isinstance(length, int) and not isinstance(length, bool) and length >= 1:
                # the body's inputs match the node's 1:1 (carry, slices of xs, captures)
                body = n.blocks[0]
                _walk_bounds(body, {b.id: src[v.id] for v, b in zip(n.inputs, body.inputs)
                                    if v.id in src}, out)
        elif op.same_values and first is not None:
            src[n.outputs[0].id] = first
        elif n.op == "cast" and first is not None and np.can_cast(
                n.inputs[0].dtype, n.outputs[0].dtype, "safe"):
            src[n.outputs[0].id] = first
        elif op.indexes and len(n.inputs) > 1 and n.inputs[1].id in src:
            axis = n.attrs.get("axis", 0)
            shape = n.inputs[0].shape
            if not isinstance(axis, int) or not -len(shape) <= axis < len(shape):
                continue
            size = shape[axis]
            if not isinstance(size, int):
                continue                 # a symbolic size: no bound known here
            name = src[n.inputs[1].id]
            where = f"{n.op} at {n.loc}" if n.loc else n.op
            if name not in out or size < out[name][0]:
                out[name] = (size, where)


def _check_bounds(model, bounds, inputs):
    for name, (size, where) in bounds.items():
        a = inputs.get(name)
        if a is None or not a.size or a.dtype.kind not in "iu":
            continue
        lo, hi = a.min(), a.max()
        if lo < 0 or hi >= size:
            raise ServingError(f"model {model!r}: input {name!r} holds the value "
                               f"{int(lo) if lo < 0 else int(hi)}; its values index a "
                               f"table of {size} rows ({where}), so they must be in "
                               f"[0, {size})")


class _Padded(ServedModel):
    """Shared by both kinds: pads a batch to its bucket, runs `_run`, crops the rows."""

    _pad_default = True

    def _setup_buckets(self):
        pad = self.config.get("pad_batch", self._pad_default)
        step = self.config.get("pad_step", 8)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ServingError(f"serving: model {self.name!r}: pad_step must be a "
                               f"non-negative int (0: powers of two only); got {step!r}")
        extra = tuple(range(2 * step, self.max_batch_size, step)) if step else ()
        self._buckets = buckets(self.max_batch_size, preferred_sizes(self.config) + extra) \
            if (pad and self.max_batch_size > 0) else None
        self._trim = self._trim_spec()

    def _trim_spec(self):
        """(mask input name, step) from ``trim_to_mask``/``trim_step``, or None."""
        name = self.config.get("trim_to_mask")
        if name is None:
            return None
        specs = {s.name: s for s in self.inputs}
        if not isinstance(name, str) or name not in specs or len(specs[name].shape) < 2 \
                or specs[name].shape[1] != -1:
            raise ServingError(f"serving: model {self.name!r}: trim_to_mask must name an "
                               f"input with a dim of any size at axis 1; got {name!r} "
                               f"(inputs {[(s.name, list(s.shape)) for s in self.inputs]})")
        bad = [o.name for o in self.outputs if any(d < 0 for d in o.shape[1:])]
        if bad:
            raise ServingError(f"serving: model {self.name!r}: trim_to_mask cuts axis 1 "
                               f"of the inputs, so outputs may have no dim of any size "
                               f"besides the batch; {bad} have one")
        step = self.config.get("trim_step", 8)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise ServingError(f"serving: model {self.name!r}: trim_step must be a "
                               f"positive int; got {step!r}")
        return name, step

    def _trimmed(self, inputs):
        """`inputs` cut along axis 1 to the batch's longest real row (module doc)."""
        name, step = self._trim
        mask = inputs.get(name)
        if mask is None or mask.ndim < 2 or mask.shape[1] <= step:
            return inputs
        s = mask.shape[1]
        cols = np.flatnonzero(mask.reshape(mask.shape[0], s, -1).any(axis=(0, 2)))
        n = min(s, -(-(int(cols[-1]) + 1 if cols.size else 1) // step) * step)
        if n == s:
            return inputs
        return {k: np.ascontiguousarray(a[:, :n]) if a.ndim >= 2 and a.shape[1] == s else a
                for k, a in inputs.items()}

    def batch_sizes(self) -> list | None:
        return self._buckets

    def infer(self, inputs):
        if self._trim is not None:
            inputs = self._trimmed(inputs)
        bk = self._buckets
        if bk is None:
            return self._run(inputs)
        n = next(iter(inputs.values())).shape[0]
        size = bucket_of(bk, n)
        if size == n:
            return self._run(inputs)
        padded = {k: pad_rows(a, size) for k, a in inputs.items()}
        return {k: v[:n] for k, v in self._run(padded).items()}

    def warmup(self):
        """Run every bucket once on zeros (compiles their executors before traffic); not
        for a model with a dynamic dim besides the batch (a sequence length): which
        sizes its traffic brings is unknown, and zeros of size -1 cannot be made."""
        if any(d < 0 for s in self.inputs for d in s.shape[1:]):
            return
        for b in self._buckets or ():
            self._run({s.name: np.zeros((b,) + s.shape[1:], DATATYPES[s.datatype])
                       for s in self.inputs})


class ProgramModel(_Padded):
    """A saved program run by a Predictor (this object's own; `clone` makes another)."""

    def __init__(self, name, directory, config, runtime="numba", platform="sampan",
                 predictor=None):
        import sampan.inference as inf
        self.directory = directory
        self.runtime = runtime
        if predictor is None:
            path = _program_path(name, directory, config)
            cfg = inf.Config(path)
            cfg.set_runtime(config.get("runtime", runtime))
            cfg.set_num_threads(_threads(name, config))
            _limit_blas(_threads(name, config))
            try:
                predictor = inf.create_predictor(cfg)
            except ServingError:
                raise
            except Exception as e:
                raise ServingError(f"serving: model {name!r}: cannot load {path}: "
                                   f"{e}") from None
        p = predictor
        self._p = p
        self._hin = [p.get_input_handle(n) for n in p.get_input_names()]
        self._hout = [(n, p.get_output_handle(n)) for n in p.get_output_names()]
        ins = [TensorSpec(h.name, datatype_of(np.dtype(str(h.type()))), _dims(h.shape()))
               for h in self._hin]
        outs = [TensorSpec(n, datatype_of(np.dtype(str(h.type()))), _dims(h.shape()))
                for n, h in self._hout]
        super().__init__(name=name, inputs=ins, outputs=outs,
                         max_batch_size=_max_batch(name, config, ins),
                         platform=platform, config=config)
        self._setup_buckets()
        g = p.graph
        self._bounds = index_bounds(g, {g.inputs[pos].id: n for pos, n in zip(
            p.get_input_positions(), p.get_input_names())})

    def check(self, inputs):
        """Ids outside the tables the program indexes are refused (see `index_bounds`)."""
        if self._bounds:
            _check_bounds(self.name, self._bounds, inputs)

    def checks_values(self):
        return bool(self._bounds)

    def _run(self, inputs):
        for h in self._hin:   # not np.ascontiguousarray: it makes a 0-d input (1,)
            h.share_external_data(np.asarray(inputs[h.name], order="C"))
        self._p.run()
        return {n: h.copy_to_cpu() for n, h in self._hout}

    def clone(self):
        return ProgramModel(self.name, self.directory, self.config, self.runtime,
                            self.platform, predictor=self._p.clone())

    def metadata(self):
        return {"runtime": self._p._prog.config.runtime()}


_ORT_TYPES = {"tensor(float)": "FP32", "tensor(double)": "FP64", "tensor(float16)": "FP16",
              "tensor(int64)": "INT64", "tensor(int32)": "INT32", "tensor(int16)": "INT16",
              "tensor(int8)": "INT8", "tensor(uint8)": "UINT8", "tensor(bool)": "BOOL"}


class OrtModel(_Padded):
    """An ONNX file run by an onnxruntime InferenceSession (one per clone); batches are
    not padded unless ``pad_batch`` is set (onnxruntime compiles nothing per shape)."""
    _pad_default = False

    def __init__(self, name, onnx_path, config):
        import onnxruntime as ort
        self.onnx_path = onnx_path
        so = ort.SessionOptions()
        so.intra_op_num_threads = _threads(name, config)
        try:
            self._s = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise ServingError(f"serving: model {name!r}: onnxruntime cannot load "
                               f"{onnx_path}: {e}") from None

        def spec(a):
            if a.type not in _ORT_TYPES:
                raise ServingError(f"serving: model {name!r}: {a.name} has ONNX type "
                                   f"{a.type}, which the server does not serve")
            return TensorSpec(a.name, _ORT_TYPES[a.type], _dims(a.shape))
        ins = [spec(a) for a in self._s.get_inputs()]
        outs = [spec(a) for a in self._s.get_outputs()]
        self._onames = [s.name for s in outs]
        super().__init__(name=name, inputs=ins, outputs=outs,
                         max_batch_size=_max_batch(name, config, ins),
                         platform="onnxruntime_onnx", config=config)
        self._setup_buckets()

    def _run(self, inputs):
        res = self._s.run(self._onames, inputs)
        return dict(zip(self._onames, res))

    def clone(self):
        return OrtModel(self.name, self.onnx_path, self.config)

    def metadata(self):
        import onnxruntime as ort
        return {"onnxruntime": ort.__version__}


@register_kind("program")
def load_program(name, directory, config) -> ServedModel:
    return ProgramModel(name, directory, config)


@register_kind("onnxruntime")
def load_onnxruntime(name, directory, config) -> ServedModel:
    rel = config.get("onnx")
    if rel is None:
        found = sorted(f for f in os.listdir(directory) if f.endswith(".onnx"))
        if len(found) > 1:
            raise ServingError(f"serving: model {name!r}: {directory} holds several .onnx "
                               f"files {found}; name one with 'onnx' in config.json")
        rel = found[0] if found else None
    if rel is not None:
        path = os.path.join(directory, rel)
        if not os.path.isfile(path):
            raise ServingError(f"serving: model {name!r}: {path} is not a file")
        return OrtModel(name, path, config)
    return ProgramModel(name, directory, config, runtime="onnxruntime",
                        platform="sampan_onnxruntime")
