"""Datasets: map-style (`__getitem__` + `__len__`) and iterable (`__iter__`)."""
from __future__ import annotations

import bisect
import math

import numpy as np

from sampan.errors import SampanValueError

__all__ = [
    "ChainDataset",
    "ConcatDataset",
    "Dataset",
    "IterableDataset",
    "StackDataset",
    "Subset",
    "TensorDataset",
    "random_split",
]


class Dataset:
    """A map-style dataset: subclasses define `__getitem__(index)` and `__len__()`.

    Example::

        >>> class Squares(Dataset):
        ...     def __len__(self): return 10
        ...     def __getitem__(self, i): return i * i
    """

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset:
    """A stream of samples: subclasses define `__iter__()`.

    With `num_workers > 0` every worker iterates its own copy; use
    `sampan.data.get_worker_info()` inside `__iter__` to give each worker its share.

    Example::

        >>> class Count(IterableDataset):
        ...     def __iter__(self): return iter(range(5))
    """

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


def _rows_of(x):
    """The numpy array behind a Tensor or array-like, plus whether it was a Tensor."""
    from sampan.tensor import Tensor

    if isinstance(x, Tensor):
        return x.numpy(), True
    return np.asarray(x), False


class TensorDataset(Dataset):
    """Rows of equally long Tensors/arrays: item `i` is `(t0[i], t1[i], ...)`.

    Tensors give Tensor rows, numpy arrays give numpy rows.

    Example::

        >>> ds = TensorDataset(sampan.tensor(np.zeros((4, 3))), np.arange(4))
        >>> x, y = ds[2]
    """

    def __init__(self, *tensors):
        if not tensors:
            raise SampanValueError("TensorDataset: got no tensors; expected at least one")
        self.tensors = tensors
        pairs = [_rows_of(t) for t in tensors]
        self._arrays = [a for a, _ in pairs]
        self._is_tensor = [flag for _, flag in pairs]
        n = [a.shape[0] if a.ndim else None for a in self._arrays]
        if None in n or len(set(n)) != 1:
            shapes = ", ".join(str(a.shape) for a in self._arrays)
            raise SampanValueError(f"TensorDataset: got tensors of shapes {shapes}; expected "
                                   "the same (non-zero-dim) first dimension")
        self._n = n[0]

    def __len__(self) -> int:
        return self._n

    def __getstate__(self):
        # workers need the arrays only, never the autograd history of the Tensors
        return {"_arrays": self._arrays, "_is_tensor": self._is_tensor, "_n": self._n}

    def __setstate__(self, state):
        self.__dict__.update(state)
        from sampan.tensor import Tensor

        self.tensors = tuple(Tensor(a) if t else a
                             for a, t in zip(self._arrays, self._is_tensor))

    def __getitem__(self, index):
        out = []
        for arr, is_tensor in zip(self._arrays, self._is_tensor):
            row = arr[index]
            if is_tensor:
                from sampan.tensor import Tensor

                row = Tensor(np.asarray(row))
            out.append(row)
        return tuple(out)


class Subset(Dataset):
    """The items of `dataset` at `indices`, in that order.

    Example::

        >>> evens = Subset(ds, range(0, len(ds), 2))
    """

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = [int(i) for i in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self.dataset[i] for i in self.indices[index]]
        return self.dataset[self.indices[index]]


class ConcatDataset(Dataset):
    """Several map-style datasets one after another.

    Example::

        >>> both = ConcatDataset([train_a, train_b]); len(both) == len(train_a) + len(train_b)
        True
    """

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise SampanValueError("ConcatDataset: got no datasets; expected at least one")
        self.cumulative = np.cumsum([len(d) for d in self.datasets]).tolist()

    def __len__(self) -> int:
        return self.cumulative[-1]

    def __getitem__(self, index):
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"ConcatDataset: index {index} out of range for length {n}")
        k = bisect.bisect_right(self.cumulative, index)
        start = self.cumulative[k - 1] if k else 0
        return self.datasets[k][index - start]


def random_split(dataset, lengths, seed=None, generator=None):
    """Split `dataset` into non-overlapping random `Subset`s of the given lengths.

    `lengths` are counts summing to `len(dataset)`, or fractions summing to 1 (the
    remainder is dealt round-robin). The same `seed` (or a `generator`, numpy or
    `sampan.Generator`, in the same state) gives the same split.

    Example::

        >>> train, val = random_split(ds, [0.8, 0.2], seed=0)
    """
    n = len(dataset)
    lengths = list(lengths)
    if all(isinstance(x, float) and 0 <= x <= 1 for x in lengths) and \
            math.isclose(sum(lengths), 1.0, abs_tol=1e-6):
        counts = [math.floor(n * f) for f in lengths]
        for i in range(n - sum(counts)):
            counts[i % len(counts)] += 1
        lengths = counts
    if sum(lengths) != n or any(x < 0 for x in lengths):
        raise SampanValueError(f"random_split: got lengths {lengths} for a dataset of length "
                               f"{n}; expected non-negative counts summing to {n} or "
                               "fractions summing to 1")
    from .sampler import numpy_rng

    rng = numpy_rng(generator) if generator is not None else np.random.default_rng(seed)
    perm = rng.permutation(n).tolist()
    out, start = [], 0
    for length in lengths:
        out.append(Subset(dataset, perm[start:start + length]))
        start += length
    return out


class ChainDataset(IterableDataset):
    """Several iterable datasets one after another (chained lazily, as one stream).

    Example::

        >>> list(ChainDataset([Count(), Count()]))  # 0..4, then 0..4 again
    """

    def __init__(self, datasets):
        self.datasets = list(datasets)

    def __iter__(self):
        for i, d in enumerate(self.datasets):
            if not isinstance(d, IterableDataset):
                raise SampanValueError(f"ChainDataset: dataset {i} is a "
                                       f"{type(d).__name__}; expected IterableDatasets only")
            yield from d

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)  # TypeError if one stream has no length


class StackDataset(Dataset):
    """Samples of several same-length datasets side by side: a tuple (positional
    datasets) or a dict (keyword datasets).

    Example::

        >>> ds = StackDataset(images=imgs, labels=lbls); ds[0]
        {'images': ..., 'labels': ...}
    """

    def __init__(self, *args, **kwargs):
        if args and kwargs:
            raise SampanValueError("StackDataset: got both positional and keyword datasets; "
                                   "expected one form (tuple samples or dict samples)")
        if not args and not kwargs:
            raise SampanValueError("StackDataset: got no datasets; expected at least one")
        self.datasets = args if args else kwargs
        parts = list(args) if args else list(kwargs.values())
        lengths = [len(d) for d in parts]
        if len(set(lengths)) != 1:
            names = list(range(len(args))) if args else list(kwargs)
            raise SampanValueError(f"StackDataset: datasets of lengths "
                                   f"{dict(zip(names, lengths))}; expected equal lengths")
        self._length = lengths[0]

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {k: d[index] for k, d in self.datasets.items()}
        return tuple(d[index] for d in self.datasets)

    def __getitems__(self, indices):
        return [self[i] for i in indices]
