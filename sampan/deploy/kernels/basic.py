"""Elementwise (non-ufunc), shape, reduction, creation and matmul kernels (numpy only).

Each mirrors the numpy path of the op's kernel in `sampan/ops/` (see the package doc)."""
import numpy as np

_HALF = (np.dtype(np.float16),)


def k_relu(a):
    return np.maximum(a, a.dtype.type(0))


def k_sigmoid(a):
    e = np.exp(-np.abs(a))
    return np.where(a >= 0, 1 / (1 + e), e / (1 + e)).astype(a.dtype)


def k_softplus(a):
    return np.logaddexp(a.dtype.type(0), a)


def k_where(c, a, b):
    return np.where(c, a, b)


def k_cast(a, dtype):
    d = np.dtype("bool" if dtype == "bool" else dtype)
    return a if a.dtype == d else a.astype(d)


def k_copy(a):
    return a.copy()


def k_full(shape, value, dtype):
    return np.full(shape, value, dtype=np.dtype(dtype))


def k_reshape(a, shape):
    return a.reshape(shape)


def k_permute(a, dims):
    return a.transpose(dims)


def k_expand(a, shape):
    return np.broadcast_to(a, shape)


def k_concat(*a, axis):
    return np.concatenate(a, axis=axis)


def _acc(f, a, axis, keepdims):
    if a.dtype in _HALF:
        return np.asarray(f(a, axis=axis, keepdims=keepdims, dtype=np.float32)).astype(a.dtype)
    return f(a, axis=axis, keepdims=keepdims)


def _red_shape(a, axis, keepdims):
    axes = range(a.ndim) if axis is None else [x % a.ndim for x in axis]
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(a.shape))
    return tuple(d for i, d in enumerate(a.shape) if i not in axes)


def k_sum(a, axis=None, keepdims=False):
    return _acc(np.sum, a, axis, keepdims)


def k_mean(a, axis=None, keepdims=False):
    if not a.size:
        return np.full(_red_shape(a, axis, keepdims), np.nan, a.dtype)
    return _acc(np.mean, a, axis, keepdims)


def k_max(a, axis=None, keepdims=False):
    return np.max(a, axis=axis, keepdims=keepdims)


def k_min(a, axis=None, keepdims=False):
    return np.min(a, axis=axis, keepdims=keepdims)


def k_matmul(a, b):
    if a.dtype in _HALF:
        return k_matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    if a.ndim > 2 and b.ndim == 2:
        m = 1
        for d in a.shape[:-1]:
            m *= d
        return np.matmul(a.reshape(m, a.shape[-1]), b).reshape(a.shape[:-1] + (b.shape[1],))
    return np.matmul(a, b)


def planned_matmul(a, b):
    """matmul as the memory-planned runtime runs it (sampan/runtime/memory.py): an output
    of at least 256 bytes is written into a buffer by np.matmul, which keeps a
    non-contiguous (..., m, k) input as a batch of products."""
    if a.dtype in _HALF or b.dtype in _HALF or a.dtype.kind != "f" or b.dtype.kind != "f":
        return k_matmul(a, b)
    n = np.result_type(a, b).itemsize * b.shape[-1]
    for d in a.shape[:-1]:
        n *= d
    if a.ndim > 2 and b.ndim == 2 and not a.flags.c_contiguous and n >= 256:
        return np.matmul(a, b)
    return k_matmul(a, b)


def _decode_index(enc, arrays):
    out = []
    for it in enc:
        k = it[0]
        if k == "s":
            out.append(slice(it[1], it[2], it[3]))
        elif k == "i":
            out.append(it[1])
        elif k == "n":
            out.append(None)
        elif k == "e":
            out.append(Ellipsis)
        else:
            out.append(arrays[it[1]])
    return tuple(out)


def k_getitem(a, *idx, index):
    key = _decode_index(index, idx)
    r = a[key]
    if type(r) is not np.ndarray:   # one element: a 0-d view, not a numpy scalar
        r = a[key + (Ellipsis,)]
    return r


def k_index_select(a, i, axis):
    n = a.shape[axis]
    if i.size and (i.min() < -n or i.max() >= n):
        raise IndexError(f"index_select: an index is out of range for a dim of size {n}")
    return np.take(a, i, axis=axis)
