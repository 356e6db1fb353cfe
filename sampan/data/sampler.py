"""Samplers: which indices a loader reads, and in what order.

Every order is decided in the main process, so the batches a loader yields do not
depend on how many workers load them.
"""
from __future__ import annotations

import math

import numpy as np

from sampan.errors import SampanValueError

__all__ = ["BatchSampler", "RandomSampler", "Sampler", "SequentialSampler", "ShardSampler",
           "SubsetRandomSampler", "WeightedRandomSampler"]


def numpy_rng(generator):
    """A numpy Generator to draw from: `generator` itself if it is one, else a stream
    keyed by a `sampan.Generator`'s (seed, counter), advancing its counter, so the same
    seed gives the same orders and each draw (epoch) a fresh one.

    Example::

        >>> numpy_rng(sampan.Generator(0)).permutation(3)  # same numbers for seed 0
    """
    if isinstance(generator, np.random.Generator):
        return generator
    from sampan.ops.random import Generator

    if isinstance(generator, Generator):
        key = [generator.seed, generator.counter]
        generator.counter += 1
        return np.random.default_rng(key)
    raise SampanValueError(f"got generator of type {type(generator).__name__}; expected a "
                           "sampan.Generator or a numpy.random.Generator")


class Sampler:
    """Base class: `__iter__` yields indices (or lists of indices for batch samplers).

    Example::

        >>> class Reverse(Sampler):
        ...     def __init__(self, n): self.n = n
        ...     def __iter__(self): return iter(range(self.n - 1, -1, -1))
        ...     def __len__(self): return self.n
    """

    def __iter__(self):
        raise NotImplementedError


class SequentialSampler(Sampler):
    """Indices 0, 1, ..., len(data_source) - 1.

    Example::

        >>> list(SequentialSampler(range(3)))
        [0, 1, 2]
    """

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(Sampler):
    """A random permutation (or draws with `replacement=True`) of the dataset's indices.

    With a `seed`, epoch k uses the stream seeded by `(seed, k)`; the epoch advances on
    every iteration and can be set with `set_epoch` (to resume). With a `generator`
    (a `sampan.Generator` or a numpy one) each iteration draws from it instead, so a
    generator seeded alike gives the same orders. With neither, orders are fresh.

    Example::

        >>> s = RandomSampler(range(5), seed=0); list(s) != list(s)  # epoch 0, then 1
        True
    """

    def __init__(self, data_source, replacement=False, num_samples=None, seed=None,
                 generator=None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.seed = seed
        self.generator = generator
        self.epoch = 0
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples < 0):
            raise SampanValueError(f"RandomSampler: got num_samples={num_samples!r}; expected "
                                   "a non-negative int")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration use the order of `epoch` (with a seed).

        Example::

            >>> sampler.set_epoch(3)
        """
        self.epoch = int(epoch)

    def _rng(self):
        if self.generator is not None:
            return numpy_rng(self.generator)
        if self.seed is not None:
            return np.random.default_rng([int(self.seed), self.epoch])
        return np.random.default_rng()

    def __iter__(self):
        rng = self._rng()
        self.epoch += 1
        n = len(self.data_source)
        if self.replacement:
            return iter(rng.integers(0, n, size=self.num_samples).tolist())
        reps = -(-self.num_samples // n) if n else 0
        order = np.concatenate([rng.permutation(n) for _ in range(reps)]) if reps else []
        return iter(np.asarray(order, dtype=np.int64)[: self.num_samples].tolist())

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given `indices` in a random order (a fresh order each iteration).

    Example::

        >>> sorted(SubsetRandomSampler([4, 7, 9], generator=sampan.Generator(0)))
        [4, 7, 9]
    """

    def __init__(self, indices, generator=None):
        self.indices = list(indices)
        self.generator = generator

    def __iter__(self):
        rng = numpy_rng(self.generator) if self.generator is not None else \
            np.random.default_rng()
        return iter([self.indices[i] for i in rng.permutation(len(self.indices))])

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """`num_samples` indices in ``[0, len(weights))`` drawn with probability proportional
    to `weights` (with `replacement`, or each index at most once without).

    Example::

        >>> s = WeightedRandomSampler([0.1, 0.0, 0.9], 5, generator=sampan.Generator(0))
        >>> 1 in list(s)
        False
    """

    def __init__(self, weights, num_samples, replacement=True, generator=None):
        w = np.asarray(weights.numpy() if hasattr(weights, "numpy") else weights,
                       dtype=np.float64)
        where = "WeightedRandomSampler"
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or \
                num_samples <= 0:
            raise SampanValueError(f"{where}: got num_samples={num_samples!r}; expected a "
                                   "positive int")
        if not isinstance(replacement, bool):
            raise SampanValueError(f"{where}: got replacement={replacement!r}; expected a bool")
        if w.ndim != 1 or w.size == 0:
            raise SampanValueError(f"{where}: got weights of shape {w.shape}; expected a "
                                   "non-empty 1-D sequence")
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise SampanValueError(f"{where}: weights must be finite, >= 0 and not all 0; got "
                                   f"min {w.min()}, sum {w.sum()}")
        if not replacement and num_samples > np.count_nonzero(w):
            raise SampanValueError(f"{where}: num_samples={num_samples} without replacement "
                                   f"but only {np.count_nonzero(w)} weights are non-zero")
        self.weights = w
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self):
        rng = numpy_rng(self.generator) if self.generator is not None else \
            np.random.default_rng()
        p = self.weights / self.weights.sum()
        idx = rng.choice(p.size, size=self.num_samples, replace=self.replacement, p=p)
        return iter(idx.astype(np.int64).tolist())

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Groups the indices of `sampler` into lists of `batch_size`.

    Example::

        >>> list(BatchSampler(SequentialSampler(range(5)), 2, drop_last=False))
        [[0, 1], [2, 3], [4]]
    """

    def __init__(self, sampler, batch_size: int, drop_last: bool = False):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise SampanValueError(f"BatchSampler: got batch_size={batch_size!r}; expected a "
                                   "positive int")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self):
        batch = []
        for idx in self.sampler:
            batch.append(idx)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)


class ShardSampler(Sampler):
    """The share of replica `rank` out of `num_replicas` (data-parallel training).

    All replicas agree on one order (shuffled with `seed` and `set_epoch` when
    `shuffle=True`), padded by wrapping around so each gets the same count, or trimmed
    with `drop_last=True`; replica r takes every `num_replicas`-th index from r.

    Example::

        >>> list(ShardSampler(range(5), num_replicas=2, rank=1))
        [1, 3, 0]
    """

    def __init__(self, data_source, num_replicas: int, rank: int, shuffle: bool = False,
                 seed: int = 0, drop_last: bool = False):
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise SampanValueError(f"ShardSampler: got num_replicas={num_replicas}, rank={rank};"
                                   " expected num_replicas >= 1 and 0 <= rank < num_replicas")
        self.data_source = data_source
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffled order of `epoch`; call it on every replica alike.

        Example::

            >>> sampler.set_epoch(epoch)
        """
        self.epoch = int(epoch)

    def __len__(self) -> int:
        n = len(self.data_source)
        if self.drop_last:
            return n // self.num_replicas
        return math.ceil(n / self.num_replicas)

    def __iter__(self):
        n = len(self.data_source)
        if self.shuffle:
            order = np.random.default_rng([int(self.seed), self.epoch]).permutation(n).tolist()
        else:
            order = list(range(n))
        total = len(self) * self.num_replicas
        if total > n and order:
            order = (order * -(-total // n))[:total]
        order = order[:total]
        return iter(order[self.rank::self.num_replicas])
