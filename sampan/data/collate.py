"""Turning a list of samples into a batch."""
from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import numpy as np

from sampan.errors import SampanValueError

__all__ = ["default_collate", "default_convert"]


def _tensor_cls():
    from sampan.tensor import Tensor

    return Tensor


def _where(path: str) -> str:
    return f" at '{path}'" if path else ""


def default_collate(batch, _path: str = ""):
    """Stack a list of samples into a batch, keeping the samples' structure.

    Tensors, numpy arrays and numpy scalars are stacked into a Tensor with a new first
    axis; Python bools, ints and floats become bool, int64 and float32 Tensors; dicts,
    tuples, namedtuples and lists are collated field by field; strings stay a list.

    Example::

        >>> b = default_collate([{"x": np.ones(3), "y": 1}, {"x": np.zeros(3), "y": 0}])
        >>> b["x"].shape, b["y"].dtype
        ((2, 3), dtype('int64'))
    """
    if not isinstance(batch, Sequence) or isinstance(batch, (str, bytes)):
        raise SampanValueError(f"default_collate: got {type(batch).__name__}; expected a list "
                               "of samples")
    if len(batch) == 0:
        raise SampanValueError("default_collate: got an empty batch")
    Tensor = _tensor_cls()
    elem = batch[0]
    if isinstance(elem, (Tensor, np.ndarray, np.generic)):
        arrays = [b.numpy() if isinstance(b, Tensor) else np.asarray(b) for b in batch]
        shapes = {a.shape for a in arrays}
        if len(shapes) != 1:
            first = arrays[0].shape
            k = next(i for i, a in enumerate(arrays) if a.shape != first)
            raise SampanValueError(
                f"default_collate: cannot stack samples of different shapes{_where(_path)}: "
                f"sample 0 has shape {first}, sample {k} has shape {arrays[k].shape}; pad them "
                "or pass a collate_fn")
        return Tensor(np.stack(arrays))
    if isinstance(elem, bool):
        return Tensor(np.array(batch, dtype=np.bool_))
    if isinstance(elem, numbers.Integral):
        return Tensor(np.array(batch, dtype=np.int64))
    if isinstance(elem, numbers.Real):
        return Tensor(np.array(batch, dtype=np.float32))
    if isinstance(elem, (str, bytes)):
        return list(batch)
    if isinstance(elem, Mapping):
        keys = list(elem.keys())
        for i, b in enumerate(batch):
            if not isinstance(b, Mapping) or set(b.keys()) != set(keys):
                raise SampanValueError(
                    f"default_collate: samples have different keys{_where(_path)}: sample 0 has "
                    f"{sorted(map(str, keys))}, sample {i} has "
                    f"{sorted(map(str, b.keys())) if isinstance(b, Mapping) else type(b)}")
        out = {k: default_collate([b[k] for b in batch], f"{_path}.{k}" if _path else str(k))
               for k in keys}
        return out if type(elem) is dict else _rebuild_mapping(elem, out)
    if isinstance(elem, Sequence):
        n = len(elem)
        for i, b in enumerate(batch):
            if len(b) != n:
                raise SampanValueError(
                    f"default_collate: samples have different lengths{_where(_path)}: sample 0 "
                    f"has {n} fields, sample {i} has {len(b)}")
        cols = [default_collate(list(col), f"{_path}.{j}" if _path else str(j))
                for j, col in enumerate(zip(*batch))]
        if isinstance(elem, tuple):
            return type(elem)(*cols) if hasattr(elem, "_fields") else tuple(cols)
        return cols
    raise SampanValueError(
        f"default_collate: cannot batch samples of type {type(elem).__name__}{_where(_path)}; "
        "expected Tensors, numpy arrays, numbers, strings, dicts, tuples or lists (or pass a "
        "collate_fn)")


def _rebuild_mapping(elem, out: dict):
    try:
        return type(elem)(out)
    except TypeError:
        return out


def default_convert(sample):
    """Convert numpy arrays inside one sample to Tensors (used when batch_size is None).

    Example::

        >>> default_convert({"x": np.ones(3), "id": 7})["x"].shape
        (3,)
    """
    Tensor = _tensor_cls()
    if isinstance(sample, np.ndarray) and sample.dtype.kind != "O":
        return Tensor(sample)
    if isinstance(sample, Mapping):
        return {k: default_convert(v) for k, v in sample.items()}
    if isinstance(sample, tuple):
        vals = [default_convert(v) for v in sample]
        return type(sample)(*vals) if hasattr(sample, "_fields") else tuple(vals)
    if isinstance(sample, list):
        return [default_convert(v) for v in sample]
    return sample
