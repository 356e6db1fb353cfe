"""Storage emulation of the ONNX dtypes sampan has no tensors of, at the import boundary.

sampan's dtypes stay as they are (bool, uint8, int8 … float64). A value whose ONNX type is
one of the others is carried inside the imported graph in a sampan dtype that holds every
value of that type exactly (its *carrier*), and the importer remembers the ONNX type:

==========================================  ===========  ====================================
ONNX type                                   carrier      settled after a node by
==========================================  ===========  ====================================
uint16                                      int32        ``mod 2**16`` (unsigned wrap-around)
uint32                                      int64        ``mod 2**32``
uint64                                      int64        two's complement bits; values must
                                                         be < 2**63 where sign matters
int4 / uint4 / int2 / uint2                 int8         wrap into the type's range
float8 e4m3fn, e4m3fnuz, e5m2, e5m2fnuz,    float32      round to nearest even on the type's
float4 e2m1, float8 e8m0fnu                              grid (ml_dtypes' conversion rule)
==========================================  ===========  ====================================

Ops run on the carrier; a node whose output could leave its declared type's range (an
unsigned Sub, a BitwiseNot, a left shift, a float8 product …) has its result settled to
that type right after it runs (`settle`), with sampan ops, so the graph stays traceable.
Inputs given as numpy/ml_dtypes arrays of such a type are converted to the carrier
(`to_carrier`), and `to_declared` turns a carrier value back into a numpy array of the
declared dtype (`sampan.onnx.backend` returns those; `OnnxModule.forward` returns the
carrier Tensors so that imported models compose and trace).

uint64 is the one type whose carrier cannot hold every value: int64 holds its bits, which
Add/Sub/Mul/bitwise ops and the final conversion respect, but a value >= 2**63 given as
an input is refused, and an op whose result depends on the sign (Div, Mod, comparisons,
Max/Min, right shifts, TopK …) refuses an eager uint64 input holding one.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

import sampan

from .. import dtypes as _dt
from ..tensor import Tensor
from .errors import OnnxError


class Fmt:
    """One emulated ONNX type: its storage dtype (numpy/ml_dtypes), its carrier, and for
    integers its range, for floats its grid (mantissa bits, min normal exponent, max)."""

    __slots__ = (
        "carrier",
        "code",
        "emin",
        "has_inf",
        "has_nan",
        "hi",
        "lo",
        "mant",
        "max",
        "name",
        "neg_zero",
        "storage",
    )

    def __init__(self, name, storage, carrier, lo=None, hi=None):
        from onnx import TensorProto
        self.name = name
        self.code = TensorProto.DataType.Value(name)
        self.storage = np.dtype(storage)
        self.carrier = np.dtype(carrier)
        self.lo, self.hi = lo, hi
        if self.is_float:
            f = ml_dtypes.finfo(self.storage)
            self.mant, self.emin, self.max = int(f.nmant), int(f.minexp), float(f.max)
            self.has_inf = name == "FLOAT8E5M2"
            self.has_nan = name != "FLOAT4E2M1"
            self.neg_zero = name in ("FLOAT8E4M3FN", "FLOAT8E5M2", "FLOAT4E2M1")

    @property
    def is_float(self):
        return self.carrier.kind == "f"

    def __repr__(self):
        return f"<emulated {self.name} in {self.carrier}>"


def _formats():
    fs = [Fmt("UINT16", np.uint16, np.int32, 0, 2**16 - 1),
          Fmt("UINT32", np.uint32, np.int64, 0, 2**32 - 1),
          Fmt("UINT64", np.uint64, np.int64, 0, 2**64 - 1),
          Fmt("INT4", ml_dtypes.int4, np.int8, -8, 7),
          Fmt("UINT4", ml_dtypes.uint4, np.int8, 0, 15),
          Fmt("FLOAT8E4M3FN", ml_dtypes.float8_e4m3fn, np.float32),
          Fmt("FLOAT8E4M3FNUZ", ml_dtypes.float8_e4m3fnuz, np.float32),
          Fmt("FLOAT8E5M2", ml_dtypes.float8_e5m2, np.float32),
          Fmt("FLOAT8E5M2FNUZ", ml_dtypes.float8_e5m2fnuz, np.float32),
          Fmt("FLOAT4E2M1", ml_dtypes.float4_e2m1fn, np.float32)]
    for name, st, lo, hi in (("INT2", "int2", -2, 1), ("UINT2", "uint2", 0, 3)):
        if hasattr(ml_dtypes, st):               # ml_dtypes >= 0.5
            fs.append(Fmt(name, getattr(ml_dtypes, st), np.int8, lo, hi))
    if hasattr(ml_dtypes, "float8_e8m0fnu"):
        fs.append(Fmt("FLOAT8E8M0", ml_dtypes.float8_e8m0fnu, np.float32))
    return fs


FORMATS = {f.code: f for f in _formats()}
BY_STORAGE = {f.storage: f for f in FORMATS.values()}


def fmt(code):
    """The emulated format of an ONNX TensorProto data type, or None (a sampan dtype, or
    one not emulated: string, complex …)."""
    return FORMATS.get(int(code)) if code else None


def onnx_code(np_dtype) -> int:
    from onnx import helper
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(np_dtype)))


# ---------------------------------------------------------------------- at the boundary
def to_carrier(a, f=None, what="a value"):
    """A numpy array of an emulated dtype as a numpy array of its carrier (exact)."""
    a = np.asarray(a)
    f = f or BY_STORAGE.get(a.dtype)
    if f is None:
        return a
    if f.name == "UINT64" and a.dtype.kind == "u" and a.size and int(a.max()) >= 2**63:
        raise OnnxError(f"sampan.onnx: {what} is uint64 and holds {int(a.max())}, which is "
                        ">= 2**63: sampan carries uint64 in int64 and cannot hold it exactly")
    if f.is_float:
        return a.astype(np.float32)
    if a.dtype.kind == "f" or a.dtype == f.storage or a.dtype.kind in "iub":
        return a.astype(f.carrier)
    return a.astype(np.int64).astype(f.carrier)


def to_declared(t, f):
    """A carrier value (Tensor or array) as a numpy array of the emulated dtype `f`."""
    a = t.numpy() if isinstance(t, Tensor) else np.asarray(t)
    if f.name == "UINT64":
        return a.astype(np.int64).view(np.uint64)
    if f.is_float:
        return a.astype(np.float32).astype(f.storage)
    return a.astype(f.storage)


# ---------------------------------------------------------------------- inside the graph
# op types whose outputs hold only values of their inputs (or a handler that settles its
# own result): nothing to settle
PASSTHROUGH = frozenset({
    "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Split",
    "Gather", "GatherND", "GatherElements", "Slice", "Expand", "Tile", "Where", "Max", "Min",
    "TopK", "Sort", "Pad", "Cast", "CastLike", "QuantizeLinear", "DynamicQuantizeLinear",
    "Constant", "ReduceMax", "ReduceMin",
})

# op types exact on uint64's two's complement bits (no sign-dependent result)
BITS_SAFE = frozenset({
    "Add", "Sub", "Mul", "Neg", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot",
    "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Split",
    "Gather", "Slice", "Expand", "Tile", "Where", "Equal", "Shape", "Size", "Constant",
})


def settle(t, f, carrier=None):
    """`t` (a carrier Tensor) reduced to the declared type `f`'s values: unsigned and
    sub-byte integers wrap, floats round to the type's grid (ml_dtypes' rule). Integers
    wrap in `carrier` (default f's)."""
    carrier = np.dtype(carrier or f.carrier)
    if t is None or not isinstance(t, Tensor):
        return t
    if f.is_float:
        if t.dtype.kind != "f":
            t = sampan.cast(t, np.float32)
        return round_to(t, f, saturate=False)
    if t.dtype.kind == "f":
        t = sampan.trunc(t)
    if t.dtype != carrier:
        t = sampan.cast(t, carrier)
    if f.name == "UINT64":
        return t
    span = f.hi - f.lo + 1
    if f.lo == 0:
        return sampan.mod(t, span)
    return sampan.mod(t - f.lo, span) + f.lo


def check_uint64(ctx, node, name, t):
    """Refuse, before an op whose result depends on sign, an eager uint64 value >= 2**63."""
    d = getattr(t, "_data", None)
    if isinstance(d, np.ndarray) and d.size and d.min() < 0:
        raise ctx.error(f"input {name!r} is uint64 and holds a value >= 2**63, which "
                        "sampan's int64 carrier holds only as bits; "
                        f"{node.op_type} on it would be wrong")


def round_to(x, f, saturate, round_mode="up"):
    """Round a float Tensor to the nearest value (ties to even) of float format `f`, with
    sampan ops. Overflow: `saturate` clips to +-max (infinities too), as ONNX's saturating
    Cast does; otherwise it gives inf where the type has one, else NaN (float4 has no NaN:
    it saturates), as ml_dtypes' conversion does. The result is in x's float dtype
    (float32 at least). float8 e8m0 rounds by `round_mode` (see `_round_e8m0`)."""
    if x.dtype not in (_dt.float32, _dt.float64):
        x = sampan.cast(x, np.float32)
    if f.name == "FLOAT8E8M0":
        return _round_e8m0(x, saturate, round_mode)
    if saturate or f.name == "FLOAT4E2M1":
        x = sampan.clip(x, -f.max, f.max)
    a = sampan.abs(x)
    tiny = sampan.where(a > 0, a, 1.0)
    e = sampan.floor(sampan.log2(tiny))
    # log2 may round up just below a power of two, or down just above: fix e exactly
    e = sampan.where(sampan.exp2(e) > tiny, e - 1, e)
    e = sampan.where(sampan.exp2(e + 1) <= tiny, e + 1, e)
    e = sampan.maximum(e, float(f.emin))
    q = sampan.exp2(e - f.mant)
    r = sampan.round(a / q) * q
    # (scalars, not full_like: a constant of x's shape would pin a dynamic dim under jit)
    big = np.inf if f.has_inf else np.nan if f.has_nan else f.max
    r = sampan.where(r > f.max, big, r)
    y = sampan.where(x < 0, -r, r)
    if f.neg_zero:
        y = sampan.where(a == 0, x, y)    # -0 stays -0
    else:
        y = y + 0.0                       # -0 -> +0: the fnuz types have no negative zero
    nan = sampan.isnan(x)
    if f.has_nan:
        y = sampan.where(nan, x, y)
    if not saturate:
        inf = sampan.isinf(x)
        if f.has_inf:
            y = sampan.where(inf, x, y)
        else:
            y = sampan.where(sampan.logical_and(inf, x < 0), -big, sampan.where(inf, big, y))
    return y


def _round_e8m0(x, saturate, mode="up"):
    """float8 e8m0 (a bare exponent, 2**(E-127), E=255 NaN, no zero, no sign): |x|'s
    float32 exponent, rounded by `mode` on its mantissa ("up": any fraction goes up,
    "down": truncates, "nearest": the reference's guard-bit rule), with `saturate`
    keeping E at 254 instead of overflowing to NaN. Built on sampan ops: no bit views."""
    if mode not in ("up", "down", "nearest"):
        raise OnnxError(f"sampan.onnx: round_mode={mode!r}; expected 'up', 'down' or "
                        "'nearest'")
    x = sampan.cast(x, np.float32) if x.dtype != _dt.float32 else x
    # in float64: numpy's float32 exp2(127) is not exactly 2**127
    a = sampan.cast(sampan.abs(x), np.float64)
    special = sampan.logical_or(sampan.isnan(x), sampan.isinf(x))
    a = sampan.where(special, 1.0, a)
    normal = a >= 2.0 ** -126
    tiny = sampan.where(normal, a, 1.0)
    e = sampan.floor(sampan.log2(tiny))
    e = sampan.where(sampan.exp2(e) > tiny, e - 1, e)
    e = sampan.where(sampan.exp2(e + 1) <= tiny, e + 1, e)
    big_e = sampan.where(normal, e + 127, 0.0)          # biased exponent
    unit = sampan.where(normal, sampan.exp2(e), 2.0 ** -126)
    frac = a / unit - sampan.cast(normal, np.float64)
    if mode == "up":
        up = frac > 0
    elif mode == "down":
        up = frac < 0                                                    # never
    else:
        up = sampan.logical_or(frac > 0.5, sampan.logical_and(frac == 0.5, big_e > 0))
    if saturate:
        up = sampan.logical_and(up, big_e < 254)
    big_e = big_e + sampan.cast(up, np.float64)
    y = sampan.cast(sampan.exp2(big_e - 127), np.float32)
    return sampan.where(sampan.logical_or(special, big_e > 254), np.nan, y)
