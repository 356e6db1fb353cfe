"""dtypes and type promotion.

sampan dtypes are numpy dtypes (bfloat16 comes from ml_dtypes). Promotion rules,
applied by every binary op:

* categories are ordered bool < integer < floating; mixing categories gives the
  higher category's dtype (int32 + float16 -> float16);
* within floating: the wider wins; bfloat16 with float16 gives float32;
* within integers: the wider wins; uint8 with a signed int8 gives int16;
* a Python scalar never widens a tensor of its own category or higher
  (float32 tensor + 2.0 -> float32); a Python float with an integer or bool
  tensor gives the default float dtype; a Python int with a bool tensor gives int64.
  numpy scalars (np.float64(2.0), np.int32(3)) count as the Python scalars of their
  category, as in PyTorch;
* a 0-d tensor is weaker than a tensor with dims, as in PyTorch: it decides the result
  dtype only when its category is higher (float16 tensor * tensor(2.0) -> float16,
  int32 tensor * tensor(2.0) -> float32); two 0-d tensors promote as above.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

bool_ = np.dtype(np.bool_)
uint8 = np.dtype(np.uint8)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
int64 = np.dtype(np.int64)
float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)

DTYPES = {
    "bool": bool_, "uint8": uint8, "int8": int8, "int16": int16, "int32": int32,
    "int64": int64, "float16": float16, "bfloat16": bfloat16, "float32": float32,
    "float64": float64,
}
_NAMES = {v: k for k, v in DTYPES.items()}
_SHORT = {"bool": "b1", "uint8": "u8", "int8": "i8", "int16": "i16", "int32": "i32",
          "int64": "i64", "float16": "f16", "bfloat16": "bf16", "float32": "f32",
          "float64": "f64"}
SHORT_TO_NAME = {v: k for k, v in _SHORT.items()}

_default_float = [float32]


def get_default_dtype() -> np.dtype:
    """The dtype Python floats and float factories use (float32 unless set)."""
    return _default_float[0]


def set_default_dtype(dt) -> None:
    """Set the default float dtype. Example: ``sampan.set_default_dtype("float64")``."""
    d = as_dtype(dt)
    if not is_floating(d):
        raise TypeError(f"set_default_dtype: got {d}; expected a floating dtype")
    _default_float[0] = d


def as_dtype(dt) -> np.dtype:
    """Normalise a dtype spelling (name, numpy dtype, Python type) to a sampan dtype."""
    if dt is None:
        return get_default_dtype()
    if isinstance(dt, np.dtype):
        d = dt
    elif isinstance(dt, str):
        d = DTYPES.get(dt) or DTYPES.get(SHORT_TO_NAME.get(dt, ""))
        if d is None:
            d = np.dtype(dt)
    elif dt is float:
        return get_default_dtype()
    elif dt is int:
        return int64
    elif dt is bool:
        return bool_
    else:
        d = np.dtype(dt)
    if d not in _NAMES:
        raise TypeError(f"unsupported dtype {d}; sampan supports {', '.join(DTYPES)}")
    return d


def dtype_name(d: np.dtype) -> str:
    """Canonical name of a dtype, e.g. 'float32'."""
    return _NAMES[np.dtype(d)]


def short_name(d: np.dtype) -> str:
    """Short IR spelling, e.g. 'f32'."""
    return _SHORT[_NAMES[np.dtype(d)]]


def is_floating(d) -> bool:
    return d.kind == "f" or d == bfloat16


def is_integer(d) -> bool:
    return d.kind in "iu"


def _category(d) -> int:
    if d == bool_:
        return 0
    if d.kind in "iu":
        return 1
    return 2


_PROMO_CACHE: dict = {}


def promote_types(a: np.dtype, b: np.dtype) -> np.dtype:
    """Result dtype of a binary op on tensors of dtypes a and b (see module doc)."""
    key = (a, b)
    r = _PROMO_CACHE.get(key)
    if r is not None:
        return r
    if a == b:
        r = a
    else:
        ca, cb = _category(a), _category(b)
        if ca != cb:
            r = a if ca > cb else b
        elif ca == 2:
            if {a, b} == {bfloat16, float16}:
                r = float32
            else:
                r = a if a.itemsize > b.itemsize else b
        else:
            r = np.promote_types(a, b)
    _PROMO_CACHE[key] = r
    return r


def operand_dtype(a: np.dtype, a_is_0d: bool, b: np.dtype, b_is_0d: bool) -> np.dtype:
    """Result dtype of a binary op on tensors of dtypes a and b, one of them possibly 0-d
    (see module doc): a 0-d tensor beside one with dims counts only by its category."""
    if a_is_0d == b_is_0d or a == b:
        return promote_types(a, b)
    dims, zero = (b, a) if a_is_0d else (a, b)
    return zero if _category(zero) > _category(dims) else dims


def scalar_dtype(value, other: np.dtype) -> np.dtype:
    """dtype a Python (or numpy) scalar takes when combined with a tensor of dtype
    `other`."""
    if isinstance(value, (bool, np.bool_)):
        return other
    if isinstance(value, (int, np.integer)):
        return int64 if other == bool_ else other
    if isinstance(value, (float, np.floating)) or (
            isinstance(value, np.generic) and np.dtype(type(value)) == bfloat16):
        return other if is_floating(other) else get_default_dtype()
    if isinstance(value, (complex, np.complexfloating)):
        raise TypeError("sampan has no complex dtypes")
    return other


# ---------------------------------------------------------------------- limits
class finfo:
    """Limits of a floating dtype, with PyTorch's attribute names (bits, eps, max, min,
    tiny, smallest_normal, resolution, dtype), bfloat16 and float16 included.

    Example::

        >>> sampan.finfo(sampan.bfloat16).eps
        0.0078125
    """

    def __init__(self, type=None):
        d = as_dtype(type)
        if not is_floating(d):
            raise TypeError(f"finfo: got dtype {dtype_name(d)}; expected a floating dtype "
                            "(sampan.iinfo for integers)")
        f = ml_dtypes.finfo(d)
        self.bits = f.bits
        self.eps = builtins_float(f.eps)
        self.max = builtins_float(f.max)
        self.min = builtins_float(f.min)
        self.tiny = self.smallest_normal = builtins_float(f.smallest_normal)
        self.resolution = 10.0 ** -int(f.precision)   # as PyTorch: 0.01, not bf16(0.01)
        self.dtype = dtype_name(d)

    def __repr__(self):
        return (f"finfo(resolution={self.resolution:g}, min={self.min:g}, max={self.max:g}, "
                f"eps={self.eps:g}, smallest_normal={self.smallest_normal:g}, "
                f"tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo:
    """Limits of an integer dtype, with PyTorch's attribute names (bits, max, min, dtype).

    Example::

        >>> sampan.iinfo(sampan.int32).max
        2147483647
    """

    def __init__(self, type):
        d = as_dtype(type)
        if not is_integer(d):
            raise TypeError(f"iinfo: got dtype {dtype_name(d)}; expected an integer dtype "
                            "(sampan.finfo for floats)")
        i = np.iinfo(d)
        self.bits, self.max, self.min = i.bits, int(i.max), int(i.min)
        self.dtype = dtype_name(d)

    def __repr__(self):
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"


builtins_float = float
