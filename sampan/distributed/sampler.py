"""`DistributedSampler`: each rank's share of a dataset, the same epoch order on all.

The order of an epoch depends only on `seed` and the epoch (not on the number of
ranks), padded by wrapping around so that every rank gets the same count (torch's
semantics), or trimmed with `drop_last`. `set_start(k)` skips the first `k` samples of
that order: a run resumed after a failure, perhaps with another number of ranks (an
elastic resize), continues at the sample where the whole job stopped, because the
position is counted in global samples, not in per-rank batches.
"""
from __future__ import annotations

import math

import numpy as np

from ..data.sampler import ShardSampler
from ..errors import SampanValueError
from . import _comm

__all__ = ["DistributedSampler"]


class DistributedSampler(ShardSampler):
    """Rank `rank`'s share of `dataset` out of `num_replicas` (defaults: the current group).

    Example::

        >>> sampler = DistributedSampler(train_set, shuffle=True, seed=0)
        >>> loader = DataLoader(train_set, batch_size=32, sampler=sampler)
        >>> for epoch in range(3):
        ...     sampler.set_epoch(epoch)       # or loader.set_epoch (Trainer does)
        ...     for x, y in loader: ...
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        num_replicas = _comm.world_size() if num_replicas is None else int(num_replicas)
        rank = _comm.rank() if rank is None else int(rank)
        super().__init__(dataset, num_replicas, rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.start = 0

    def set_start(self, samples: int) -> None:
        """Skip the first `samples` samples of the epoch's global order (resuming).

        Example::

            >>> sampler.set_epoch(2); sampler.set_start(640)  # 640 samples of epoch 2 done
        """
        samples = int(samples)
        if samples < 0:
            raise SampanValueError(f"DistributedSampler.set_start: got {samples}; "
                                   "expected >= 0")
        self.start = samples

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            self.start = 0             # a new epoch starts at its first sample
        super().set_epoch(epoch)

    def _remaining(self) -> int:
        return max(len(self.data_source) - self.start, 0)

    def __len__(self) -> int:
        n = self._remaining()
        if self.drop_last:
            return n // self.num_replicas
        return math.ceil(n / self.num_replicas)

    def global_order(self) -> list:
        """The epoch's order over the whole dataset (before skipping and padding)."""
        n = len(self.data_source)
        if self.shuffle:
            return np.random.default_rng([int(self.seed), self.epoch]).permutation(n).tolist()
        return list(range(n))

    def __iter__(self):
        order = self.global_order()[self.start:]
        total = len(self) * self.num_replicas
        if total > len(order) and order:
            order = (order * -(-total // len(order)))[:total]
        return iter(order[:total][self.rank::self.num_replicas])
