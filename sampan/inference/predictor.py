"""`create_predictor(config)`: a loaded, optimised, compiled program behind named input and
output handles (Paddle Inference's ZeroCopyTensor shape).

Feeding: `copy_from_cpu(a)` copies into the handle's own array (reused while the shape
stays); `share_external_data(a)` hands the caller's array itself to the program (zero
copy: a change to it shows in the next `run`). Outputs: `copy_to_cpu()` gives a copy;
`share_external_data(out)` makes every `run` write the result into `out`.

The call path is short by design (batch-1 latency is what serving pays per request):
the program's argument list is built once and each handle writes its slot in place; a
feed is checked when it is given (dtype, rank, fixed dims), so `run` does no checking
beyond one dictionary look-up of the input shapes when the program has symbolic dims,
and the verifier runs once, at `create_predictor`. A program with symbolic dims (batch,
sequence) is compiled once per set of input shapes and cached.

Clones share the optimised graph and its weight arrays (never copied) and compile their
own executors, whose planned buffers are their own: one predictor per thread.

Example::

    >>> p = create_predictor(Config("mlp.sampan"))
    >>> p.get_input_handle("x").copy_from_cpu(x); p.run()
    >>> y = p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()
"""
from __future__ import annotations

import os

import threading

import numpy as np

from .. import _recorder as _rec
from ..tensor import Tensor
from ._build import optimise
from .config import Config, InferenceError

_COMPILE = threading.Lock()   # codegen and numba compilation: one at a time
MAX_CACHED = 64               # executors kept per predictor (one per input-shape set)


def create_predictor(config: Config) -> "Predictor":
    """Load `config.model_dir` (checksums, format and IR verified: a missing, truncated or
    tampered program fails here with `sampan.jit.LoadError`), run the configured passes
    and compile. Example: ``p = create_predictor(Config("m.sampan"))``"""
    if not isinstance(config, Config):
        raise InferenceError(f"create_predictor: expected a sampan.inference.Config; got "
                             f"{type(config).__name__}")
    from .. import _threads
    from ..jit.program import SavedProgram
    config = config.copy()              # later edits to the caller's config change nothing
    if config.num_threads() is not None:
        _threads.set_num_threads(config.num_threads())
    return Predictor(_Program(config, SavedProgram.read(config.model_dir)))


def _int8_options(config, graph, meta, arrays) -> dict:
    """The `quantize` pass's calibration for set_precision("int8"): a `calibrate` option
    over the configured calibration batches (checked here), unless the program is int8
    already, is quantised weight-only, or the options were set on the pass builder."""
    from ..passes.quantize import is_quantized
    from .steps import QUANTIZE
    b = config.pass_builder()
    data, observer, weight_only = config.int8_options()
    if (config.precision() != "int8" or QUANTIZE not in b.enabled_passes()
            or config.int8_dynamic()
            or is_quantized(graph) or b.get_option(QUANTIZE, "acts") is not None
            or b.get_option(QUANTIZE, "calibrate") is not None):
        return {}
    if data is None:
        if weight_only:
            return {}
        raise InferenceError("create_predictor: precision 'int8' needs calibration_data "
                             "(Config.set_precision('int8', calibration_data=batches)) or "
                             "weight_only=True, or a program quantised already by "
                             "sampan.quant.quantize_program")
    from ..quant.program import Program, calibrator
    # checked even when weight-only (a bad set is an error), used only to calibrate
    cal = calibrator(Program(graph, meta, arrays, config.model_dir), data, observer)
    return {} if weight_only else {QUANTIZE: {"calibrate": cal}}


class _Program:
    """What clones share: the optimised graph, the weights, the names and slots."""

    def __init__(self, config, prog):
        from ..jit import dynamic as _dyn
        self.config = config
        self.path = config.model_dir
        self.meta = prog.meta
        self.arrays = prog.arrays
        self.symbolic = prog.symbolic
        # the size conditions the program was traced under (sampan/jit/dynamic.py)
        self.guards = prog.guards      # (meta.json's guards: checked by the read)
        self.graph, self.passes_run, self.plan = optimise(
            prog.graph, config, self.symbolic,
            _int8_options(config, prog.graph, prog.meta, prog.arrays), prog.example_sizes)
        self.arg_pos = prog.arg_positions
        self.input_names = prog.input_names
        self.base_args = prog.fixed_inputs()
        leaves = prog.output_leaves()
        self.output_names = [name for _, name in leaves]
        self.out_pos = [p for p, _ in leaves]
        self.dims = _dyn.input_dims(self.graph, self.arg_pos) if self.symbolic else {}
        unbound = _dyn.symbols_of(self.graph) - {s for d in self.dims.values()
                                                 for s in d.values()}
        if unbound:
            raise InferenceError(f"create_predictor: {self.path}: symbols {sorted(unbound)} "
                                 "are no input's dim, so no feed can give their size")

    def compile(self, sizes):
        from ..jit import dynamic as _dyn
        from ..passes import PassManager
        from ..runtime import compile_graph
        bad = _dyn.failing_guard(self.guards, sizes) if self.guards else None
        if bad is not None:
            raise _dyn.guard_error(bad, sizes, f"model {self.path}")
        g = _dyn.concrete(self.graph, sizes) if sizes else self.graph
        with _COMPILE:
            if self.plan:
                g = PassManager(["plan_memory"]).run(g)
            # numba runtime: kernels chosen once for the concrete shapes (see
            # runtime/specialize.py); the numpy runtime keeps the op-table kernels
            # on a profiler timeline the program is the model file that ran
            return compile_graph(g, name="predictor_fn",
                                 specialize="numba" in self.config.get_providers(),
                                 program="predictor:" + os.path.basename(
                                     os.path.normpath(str(self.path))))


def _spec(v):
    """`float32[batch, 8]`: the model's type of a value, symbols by name."""
    return f"{v.dtype}[{', '.join(str(d) for d in v.shape)}]"


def _got(a):
    return f"{a.dtype}{list(a.shape)}"


class InputHandle:
    """One named input of a Predictor. Example: ``h.copy_from_cpu(np.zeros((1, 8)))``"""

    def __init__(self, predictor, name, slot, value):
        self.name = name
        self._p = predictor
        self._slot = slot
        self._value = value
        self._dtype = value.dtype
        self._want = tuple(value.shape)
        self._arr = None          # what the program reads
        self._ok = self._want     # the shape checked last
        self._own = None          # the handle's array for copy_from_cpu

    def type(self):
        """The numpy dtype the model expects."""
        return self._dtype

    def shape(self) -> list:
        """The fed array's shape; before a feed, the model's (symbols by name)."""
        return list(self._arr.shape if self._arr is not None else self._want)

    def _expects(self):
        syms = [d for d in self._want if isinstance(d, str)]
        note = f" ({', '.join(syms)}: any size of at least 1)" if syms else ""
        return f"{self._dtype}[{', '.join(str(d) for d in self._want)}]{note}"

    def _fail(self, what, got):
        return InferenceError(f"input '{self.name}' of {self._p._prog.path}: {what} {got}; "
                              f"the model expects {self._expects()}")

    def _check_shape(self, shape):
        want = self._want
        if len(shape) != len(want) or any(
                (n != w) if not isinstance(w, str) else (n < 1) for n, w in zip(shape, want)):
            raise self._fail("got shape", list(shape))

    def _check(self, a):
        if a.dtype != self._dtype:
            raise self._fail("got", _got(a))
        if a.shape != self._ok:         # a new shape: check it, find its executor at run
            self._check_shape(a.shape)
            self._ok = a.shape
            self._p._fn = self._p._static_fn

    def reshape(self, shape) -> None:
        """Give the input this shape (checked against the model) for the next
        `copy_from_cpu`, which then needs an array of that shape."""
        shape = tuple(int(d) for d in shape)
        self._check_shape(shape)
        if self._own is None or self._own.shape != shape:
            self._own = np.empty(shape, self._dtype)
        self._arr = None
        self._ok = shape
        self._p._args[self._slot] = None
        self._p._ready = False
        self._p._fn = self._p._static_fn

    def copy_from_cpu(self, data) -> None:
        """Copy `data` (an array of the model's dtype) into the handle's own array."""
        # the per-call path (a server's every request): a numpy array needs no
        # conversion, and `own[...] = a` costs half of np.copyto's dispatch
        a = data if type(data) is np.ndarray else (
            data._data if isinstance(data, Tensor) else np.asarray(data))
        if a.dtype != self._dtype or a.shape != self._ok:
            self._check(a)
        own = self._own
        if own is None or own.shape != a.shape:
            own = self._own = np.empty(a.shape, self._dtype)
        own[...] = a
        if self._arr is not own:
            self._arr = own
            self._p._args[self._slot] = own

    def share_external_data(self, data) -> None:
        """Let the program read `data` itself (no copy): a C-contiguous numpy array of the
        model's dtype, which the caller keeps alive and may change between runs."""
        a = data._data if isinstance(data, Tensor) else data
        if not isinstance(a, np.ndarray):
            raise self._fail("share_external_data needs a numpy array; got",
                             type(data).__name__)
        self._check(a)
        if not a.flags.c_contiguous:
            raise self._fail("share_external_data needs a C-contiguous array; got a strided",
                             _got(a))
        self._arr = a
        self._p._args[self._slot] = a

    def __repr__(self):
        return f"InputHandle({self.name!r}, {self._expects()})"


class OutputHandle:
    """One named output of a Predictor. Example: ``y = h.copy_to_cpu()``"""

    def __init__(self, predictor, name, value):
        self.name = name
        self._p = predictor
        self._value = value
        self._arr = None
        self._ext = None

    def type(self):
        return self._value.dtype

    def shape(self) -> list:
        """The last run's shape; before a run, the model's (symbols by name)."""
        return list(self._arr.shape if self._arr is not None else self._value.shape)

    def copy_to_cpu(self) -> np.ndarray:
        """A copy of the last run's result."""
        if self._arr is None:
            raise InferenceError(f"output '{self.name}': call run() before copy_to_cpu()")
        return self._arr.copy()

    def share_external_data(self, out) -> None:
        """Make every `run` write this output into `out` (a writable numpy array of the
        output's dtype and the run's shape); None stops it."""
        if out is not None:
            if not isinstance(out, np.ndarray) or out.dtype != self._value.dtype \
                    or not out.flags.writeable:
                got = _got(out) if isinstance(out, np.ndarray) else type(out).__name__
                raise InferenceError(f"output '{self.name}': share_external_data needs a "
                                     f"writable {self._value.dtype} numpy array; got {got}")
        self._ext = out
        self._arr = out if out is not None else None

    def _put(self, a):
        ext = self._ext
        if ext is None:
            self._arr = a
            return
        if ext.shape != a.shape:
            raise InferenceError(f"output '{self.name}': the buffer given to "
                                 f"share_external_data is {_got(ext)}; this run's output is "
                                 f"{_got(a)}")
        np.copyto(ext, a)

    def __repr__(self):
        return f"OutputHandle({self.name!r}, {_spec(self._value)})"


class Predictor:
    """A compiled saved program with named handles; made by `create_predictor`.

    Example::

        >>> h = p.get_input_handle("x"); h.share_external_data(x)   # zero copy
        >>> p.run(); y = p.get_output_handle("output_0").copy_to_cpu()
    """

    def __init__(self, prog: _Program):
        self._prog = prog
        g = prog.graph
        self._args = list(prog.base_args)
        self._in = [InputHandle(self, n, p, g.inputs[p])
                    for n, p in zip(prog.input_names, prog.arg_pos)]
        self._in_by_name = {h.name: h for h in self._in}
        self._out = [OutputHandle(self, n, g.outputs[p])
                     for n, p in zip(prog.output_names, prog.out_pos)]
        self._out_by_name = {h.name: h for h in self._out}
        self._out_pairs = list(zip(self._out, prog.out_pos))
        self._cache = {}             # input shapes -> executor
        self._compiled = {}          # executor -> its Compiled (the profiling variant)
        self._key_sizes = {}         # input shapes -> symbol sizes
        self._ready = False          # every input fed once
        self._sizes = []             # the symbol sizes compiled, in order
        self._last = None
        self._static_fn = None       # the executor of a program without symbolic dims
        if not prog.symbolic:
            self._last = prog.compile({})
            self._static_fn = self._keep(self._last)
            self._sizes.append({})
        self._fn = self._static_fn   # the executor for the fed shapes, once known

    # ---------------------------------------------------------------- names, handles
    def get_input_names(self) -> list:
        return list(self._prog.input_names)

    def get_output_names(self) -> list:
        return list(self._prog.output_names)

    def get_input_positions(self) -> list:
        """The position in `graph.inputs` of each input, in `get_input_names()` order
        (which graph input a fed name becomes; the other inputs are the weights).

        Example: ``dict(zip(p.get_input_names(), p.get_input_positions()))``"""
        return list(self._prog.arg_pos)

    def get_input_handle(self, name: str) -> InputHandle:
        h = self._in_by_name.get(name)
        if h is None:
            raise InferenceError(f"get_input_handle: the model has no input {name!r}; its "
                                 f"inputs: {self._prog.input_names}")
        return h

    def get_output_handle(self, name: str) -> OutputHandle:
        h = self._out_by_name.get(name)
        if h is None:
            raise InferenceError(f"get_output_handle: the model has no output {name!r}; its "
                                 f"outputs: {self._prog.output_names}")
        return h

    # ---------------------------------------------------------------- running
    def run(self, inputs=None):
        """Run the program on the fed inputs; the results go to the output handles.

        `inputs` (optional): arrays in `get_input_names()` order, copied in first; the
        outputs are then also returned, as copies, in `get_output_names()` order."""
        if inputs is not None:
            if len(inputs) != len(self._in):
                raise InferenceError(f"run: got {len(inputs)} inputs; the model takes "
                                     f"{len(self._in)}: {self._prog.input_names}")
            for h, a in zip(self._in, inputs):
                h.copy_from_cpu(a)
        if not self._ready:
            if any(h._arr is None for h in self._in):
                raise self._unfed()
            self._ready = True
        fn = self._fn
        if fn is None:
            key = tuple([h._arr.shape for h in self._in])
            fn = self._cache.get(key)
            if fn is None:
                fn = self._compile_for(key)
            self._fn = fn
        if _rec.ACTIVE:         # under sampan.profiler: one "kernel" event per node
            outs = self._compiled[fn].profiled(*self._args)
        else:
            outs = fn(*self._args)
        for h, p in self._out_pairs:
            h._put(outs[p])
        if inputs is not None:
            return [h.copy_to_cpu() for h in self._out]
        return None

    def _unfed(self):
        miss = [h.name for h in self._in if h._arr is None]
        return InferenceError(f"run: input(s) {miss} have no data; feed them with "
                              "copy_from_cpu or share_external_data")

    def _compile_for(self, key):
        from ..jit import dynamic as _dyn
        prog = self._prog
        sizes, where = {}, {}
        for h, p in zip(self._in, prog.arg_pos):
            for d, s in prog.dims.get(p, {}).items():
                n = h._arr.shape[d]
                if s in sizes and sizes[s] != n:
                    raise InferenceError(
                        f"input '{h.name}' of {prog.path}: dim {d} is {n}, but '{s}' is "
                        f"{sizes[s]} from {where[s]}; the model expects "
                        f"{h._expects()}, and inputs that share '{s}' must agree")
                sizes[s], where[s] = n, f"dim {d} of input '{h.name}'"
        for h in self._in:
            if not _dyn.fits(h._arr.shape, h._want, sizes):
                raise h._fail("got shape", f"{list(h._arr.shape)} with "
                              + ", ".join(f"{s}={n}" for s, n in sorted(sizes.items())))
        compiled = prog.compile(sizes)
        if len(self._cache) >= MAX_CACHED:
            self._key_sizes.pop(next(iter(self._cache)))
            self._compiled.pop(self._cache.pop(next(iter(self._cache))), None)
        self._cache[key] = fn = self._keep(compiled)
        self._key_sizes[key] = sizes
        self._sizes.append(sizes)
        self._last = compiled
        return fn

    def _keep(self, compiled):
        self._compiled[compiled.fn] = compiled
        return compiled.fn

    # ---------------------------------------------------------------- the rest
    def clone(self) -> "Predictor":
        """A predictor over the same graph and weight arrays (shared, not copied) with
        its own handles and executors, for use from another thread."""
        c = Predictor(self._prog)
        for key, sizes in self._key_sizes.items():
            c._last = compiled = self._prog.compile(sizes)
            c._cache[key] = c._keep(compiled)
            c._key_sizes[key] = sizes
            c._sizes.append(sizes)
        return c

    def weights(self) -> dict:
        """The weight arrays the program reads, by name (shared with clones). Treat them
        as read-only: executors keep copies made from them when compiled (the small-GEMM
        path's packed weights, backends/numba/gemv.py), which an in-place edit misses."""
        g = self._prog.graph
        read = {v.id for n in g.nodes for v in n.inputs} | {v.id for v in g.outputs}
        out = {v.name: v.const for v in g.consts if v.name is not None}
        for spec, a, v in zip(self._prog.meta["inputs"], self._prog.base_args, g.inputs):
            if a is not None and v.id in read:      # state the passes did not freeze
                out[spec["key"]] = a
        return out

    def compiled_sizes(self) -> list:
        """The symbol sizes this predictor compiled for, in order ([{}] without symbols)."""
        return [dict(s) for s in self._sizes]

    @property
    def graph(self):
        """The optimised graph (symbolic dims kept)."""
        return self._prog.graph

    @property
    def passes_run(self) -> list:
        """The steps `create_predictor` ran, in order."""
        return list(self._prog.passes_run)

    def get_providers(self) -> list:
        """The kernel providers this predictor binds, in order of preference (its
        Config's `set_providers` list), as onnxruntime's `session.get_providers()`.
        Which node went to which is `node.meta["provider"]` in `graph`."""
        return self._prog.config.get_providers()

    @property
    def code(self) -> str:
        """The generated source of the executor compiled last."""
        return self._last.code if self._last is not None else "# not compiled yet"

    def __repr__(self):
        return (f"Predictor({self._prog.path!r}, inputs={self._prog.input_names}, "
                f"outputs={self._prog.output_names}, providers={self._prog.config.get_providers()!r})")
