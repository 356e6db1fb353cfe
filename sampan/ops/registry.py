"""The op table: every operation is one `OpDef` registered here.

An OpDef carries everything the rest of sampan reads about an op: its shape/dtype
rule (usable without running a kernel, so tracing never computes), its kernel per
backend, its gradient rule written with other ops (so gradients are traceable and
differentiable again), its fusion kind with a scalar expression for generated
kernels, its FLOP formula, its ONNX mapping and its test samples.

`apply(op, inputs, attrs)` is the single dispatch point of eager execution and
tracing.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import SampanError, SampanIndexError, ShapeError, op_error


@dataclass(frozen=True)
class Spec:
    """Shape and dtype of a value; shapes may hold symbolic dims (str)."""
    shape: tuple
    dtype: np.dtype

    def __repr__(self):
        from ..dtypes import short_name
        return f"{short_name(self.dtype)}[{','.join(map(str, self.shape))}]"


NOT_DIFFERENTIABLE = "not differentiable"
AMP_POLICIES = ("follow", "lower", "float32")
NO_ONNX = "none"


@dataclass
class OpDef:
    """One row of the op table. See module docstring."""
    name: str
    shape_rule: Callable[..., Any]
    kernels: dict = field(default_factory=dict)
    grad: Any = None                 # callable(g, y, *inputs, **attrs) or NOT_DIFFERENTIABLE
    kind: str = "opaque"             # "elementwise" | "reduction" | "opaque"
    scalar: str | None = None        # scalar expression for kernel generation, e.g. "a + b"
    flops: Callable[..., int] | None = None
    onnx: Any = None                 # ONNX mapping (op type name / callable) or NO_ONNX
    samples: Callable[..., list] | None = None
    n_out: int = 1
    view: bool = False               # output aliases the first input (shares its version counter)
    # for a view op: unview(x, v, **attrs) -> x with its viewed part replaced by v, written
    # with ops; an in-place write through the view is recorded on x's history with it
    unview: Callable[..., Any] | None = None
    # inputs the gradient rule reads (None: all); or per input, the inputs that input's
    # gradient reads, e.g. mul's ((1,), (0,)): a * 2 with only `a` needing a gradient reads
    # the constant, so modifying `a` in place afterwards is fine
    saves: tuple | None = None
    save_output: bool = False        # gradient rule reads the output
    nondiff_inputs: tuple = ()       # inputs that never get gradients (indices, masks …)
    random: bool = False
    keeps_float: bool = True         # float inputs give a float output (False: e.g. cast)
    # whether the fusion pass may put this elementwise op in a generated kernel: "always",
    # "float32" (only float32/bfloat16 outputs with fast math: its scalar form calls
    # mathlib's float32 polynomials) or "" (never)
    fuse: str = ""
    # whether eager execution runs the shape rule before the kernel (None: every op but the
    # elementwise ones, whose kernels are numpy ufuncs or loops that check equal shapes and
    # broadcast exactly as the rule does). The numba kernels behind the others index
    # without bounds checks: a shape the rule rejects wrote out of bounds or was silently
    # accepted. See `check_inputs`.
    eager_check: bool | None = None
    # mixed precision (`sampan.amp.autocast` and the `amp` pass read it): "lower" runs in
    # the autocast dtype (float32 inputs cast down: GEMMs, convolutions), "float32" runs in
    # float32 (bfloat16/float16 inputs cast up: softmax, norms' statistics, exp/log/pow,
    # sums, losses), "follow" computes in whatever its inputs are (elementwise and shape
    # ops; the public functions promote mixed inputs before the op)
    amp: str = "follow"
    # a GEMM-family op (matmul, convolutions, einsum: FLOPs = 2 * output size * reduction);
    # the profiler's advisor judges these against the machine's measured sgemm rate
    gemm: bool = False
    # input 1 holds indices into input 0 along attribute `axis` (index_select, gathers):
    # a value outside [0, input 0's size there) fails the op (serving checks a request's
    # ids against it before batching them with others)
    indexes: bool = False
    # the output holds exactly the values of input 0, rearranged or repeated (reshape,
    # permute, expand, copy): a bound on the output's values is one on the input's
    same_values: bool = False
    # kernel_error(exc, arrays, attrs) -> a sampan error or None: what a kernel's plain
    # exception (an IndexError of an index value) means to the user. The numpy kernels are
    # plain numpy (`sampan deploy` copies them into a module without sampan), so the op's
    # message is made here, outside the kernel
    kernel_error: Callable[..., Any] | None = None
    doc: str = ""

    def __post_init__(self):
        self.kernel = default_kernel(self.kernels)
        self.differentiable = callable(self.grad)
        self.saves_per_input = bool(self.saves) and isinstance(self.saves[0], tuple)
        self.saves_read = {}        # requires_grad of each input -> inputs read (tape.py)
        if self.eager_check is None:
            self.eager_check = self.kind != "elementwise"
        self.checked = {}            # input shapes/dtypes/attrs the rule accepted (a cache)
        if self.amp not in AMP_POLICIES:
            raise ValueError(f"op {self.name!r}: amp={self.amp!r}; expected one of "
                             f"{', '.join(AMP_POLICIES)}")

    def __repr__(self):
        return f"<op {self.name}>"


OPS: dict[str, OpDef] = {}
# the backends whose kernel is an op's default (`OpDef.kernel`, what eager runs), first
# present first: "numba" holds the hand-written loops where numba is installed (each
# falls back to the numpy kernel for what it does not serve), "numpy" is the reference
# (plain numpy: the kernel `sampan deploy` copies)
DEFAULT_BACKENDS = ("numba", "numpy")


def default_kernel(kernels: dict):
    """The op's default kernel among `kernels` (see DEFAULT_BACKENDS)."""
    for b in DEFAULT_BACKENDS:
        if kernels.get(b) is not None:
            return kernels[b]
    return None


def defop(name: str, shape, *, kernel=None, **kw) -> OpDef:
    """Register an op. `kernel` is its numpy kernel; further backends via `kernels=`."""
    if name in OPS:
        raise ValueError(f"op {name!r} is registered twice")
    kernels = dict(kw.pop("kernels", {}))
    if kernel is not None:
        kernels["numpy"] = kernel
    op = OpDef(name=name, shape_rule=shape, kernels=kernels, **kw)
    OPS[name] = op
    return op


def register_kernel(op_name: str, backend: str, fn) -> None:
    """Add a backend kernel to an existing op (backends are kernel tables); a default
    backend's kernel (DEFAULT_BACKENDS) becomes the op's default if that was the one
    the table chose."""
    op = OPS[op_name]
    before = default_kernel(op.kernels)
    op.kernels[backend] = fn
    if op.kernel is before:
        op.kernel = default_kernel(op.kernels)


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise SampanError(f"unknown op {name!r}") from None


# ----------------------------------------------------------------------------- mode state
class _State(threading.local):
    def __init__(self):
        self.grad_enabled = True
        self.tracer = None           # set by sampan.jit while tracing
        self.hooked = False          # inside `ops.modes.dispatch`: the modes already ran


STATE = _State()


_CHECKED_MAX = 1024


def check_inputs(op: OpDef, inputs, attrs) -> None:
    """Run `op`'s shape/dtype rule on concrete eager inputs before the kernel runs, so a
    kernel never sees inputs its rule rejects (the rule raises a sampan error naming the
    op and the user's line). Accepted (shapes, dtypes, attrs) are cached per op, so a
    repeated call costs a tuple and a dict lookup instead of the rule."""
    n = len(inputs)
    if n == 1:                   # the common arities without a list (this is the hot path)
        a = inputs[0]._data
        key = (a.shape, a.dtype)
    elif n == 2:
        a, b = inputs[0]._data, inputs[1]._data
        key = (a.shape, a.dtype, b.shape, b.dtype)
    else:
        key = tuple([(t._data.shape, t._data.dtype) for t in inputs])
    if attrs:
        key = (key, tuple(attrs.items()))
    seen = op.checked
    try:
        if key in seen:
            return
    except TypeError:            # an unhashable attribute (a list …): check every call
        key = None
    try:
        # arrays carry .shape and .dtype as a Spec does, so the rule reads them directly
        op.shape_rule(*[t._data for t in inputs], **attrs)
    except SampanError as e:
        raise e.with_traceback(None) from None
    except Exception as e:
        raise op_error(ShapeError, op.name, describe(inputs) + (f" with {attrs}" if attrs
                                                                 else ""),
                       "inputs its shape rule accepts", f"the rule said: {e}") from None
    if key is not None:
        if len(seen) >= _CHECKED_MAX:
            seen.clear()
        seen[key] = True


def describe(inputs) -> str:
    from ..dtypes import short_name
    parts = []
    for t in inputs:
        d = getattr(t, "_data", t)
        try:
            parts.append(f"{short_name(d.dtype)}{list(d.shape)}")
        except Exception:
            parts.append(repr(t))
    return "(" + ", ".join(parts) + ")"


def raise_kernel_error(op: OpDef, inputs, attrs, exc: Exception):
    """Turn a kernel failure into a sampan error: run the shape rule to explain it."""
    if isinstance(exc, SampanError):
        raise exc
    if op.kernel_error is not None:
        err = op.kernel_error(exc, [t._data for t in inputs], attrs)
        if err is not None:
            raise err.with_traceback(None) from None
    specs = [Spec(tuple(t._data.shape), t._data.dtype) for t in inputs]
    try:
        op.shape_rule(*specs, **attrs)
    except SampanError as e:
        raise e.with_traceback(None) from None
    except Exception:
        pass
    if isinstance(exc, IndexError):   # an index value out of range: IndexError, as numpy's
        raise op_error(SampanIndexError, op.name, describe(inputs) + (
            f" with {attrs}" if attrs else ""), "indices within range",
            f"the kernel said: {exc}") from exc
    raise op_error(ShapeError, op.name, describe(inputs) + (f" with {attrs}" if attrs else ""),
                   "inputs this op accepts", f"the kernel said: {exc}") from exc
