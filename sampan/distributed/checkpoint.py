"""`DistributedCheckpoint`: the Trainer's `Checkpoint` for data-parallel runs.

Rank 0 writes (atomically, as `Checkpoint` does) and the others wait at a barrier, so
no rank runs ahead of a checkpoint that is not on disk yet. Every rank resumes from the
newest one. The position in the epoch is saved as a count of *global samples*
(``samples_in_epoch``), not of per-rank batches, and on resume the data order of the
epoch (`DistributedSampler`, the same for any number of ranks) is skipped to it; so a
job relaunched with another number of ranks (an elastic resize) and the same global
batch continues at the right sample, and the loss curve goes on where it stopped.
`logs["loss"]` becomes the mean over the ranks (the loss of the global batch).
"""
from __future__ import annotations

import numpy as np

from ..errors import SampanValueError
from ..train.hooks import Checkpoint
from . import _comm
from . import collectives as _coll
from .sampler import DistributedSampler

__all__ = ["DistributedCheckpoint"]


class DistributedCheckpoint(Checkpoint):
    """`Checkpoint` that rank 0 writes and every rank resumes from, elastically.

    `sampler`: the `DistributedSampler` of the training data (default: the train
    loader's sampler).

    Example::

        >>> sampler = DistributedSampler(data, seed=0)
        >>> loader = DataLoader(data, batch_size=global_batch // world_size, sampler=sampler)
        >>> hooks = [DistributedCheckpoint("ckpt", every_n_steps=100)]
        >>> Trainer(DataParallel(model), opt, loss_fn, loader, hooks=hooks).fit(10)
    """

    def __init__(self, directory, every_n_steps: int = 100, keep_last: int = 3,
                 resume: bool = True, save_at_end: bool = True, sampler=None):
        super().__init__(directory, every_n_steps, keep_last, resume, save_at_end)
        self.sampler = sampler
        self.samples_in_epoch = 0
        self._trainer = None

    def _sampler(self, trainer):
        s = self.sampler
        if s is None:
            s = getattr(trainer.train_loader, "sampler", None)
        if not isinstance(s, DistributedSampler):
            raise SampanValueError(
                "DistributedCheckpoint: the train loader's sampler is "
                f"{type(s).__name__}; expected a DistributedSampler (pass sampler=)")
        return s

    def _global_batch(self, trainer):
        bs = getattr(trainer.train_loader, "batch_size", None) or 1
        return int(bs) * _comm.world_size()

    # where the whole job is in the epoch, in samples of the epoch's global order
    def _position(self, trainer):
        s = self._sampler(trainer)
        if trainer.batch_in_epoch == 0 and s.epoch != trainer.epoch:
            return 0                      # an epoch just ended: the next starts afresh
        n = len(s.data_source)
        return min(s.start + trainer.batch_in_epoch * self._global_batch(trainer), n)

    def state_dict(self) -> dict:
        t = self._trainer
        return {"samples_in_epoch": self._position(t) if t is not None else 0,
                "world_size": _comm.world_size()}

    def load_state_dict(self, state: dict) -> None:
        self.samples_in_epoch = int(state.get("samples_in_epoch", 0))

    def on_fit_begin(self, trainer):
        self._trainer = trainer
        self._sampler(trainer)
        _comm.barrier()     # rank 0 may still be cleaning up temporaries of a killed write
        if _comm.rank() == 0:
            self._remove_temporaries()
        _comm.barrier()
        if not self.resume:
            return
        self.samples_in_epoch = 0
        self._resume(trainer)
        if self.resumed_from is not None:
            s = self._sampler(trainer)
            s.set_epoch(trainer.epoch)
            s.set_start(self.samples_in_epoch)
            # the sampler skips the samples done; the trainer must not skip batches again
            trainer.batch_in_epoch = 0

    def save(self, trainer) -> str:
        path = None
        if _comm.rank() == 0:
            path = super().save(trainer)
        _comm.barrier()
        return path

    def after_step(self, trainer, logs):
        if _comm.world_size() > 1:
            loss = np.array([float(logs["loss"])], np.float64)
            _coll.all_reduce(loss, op="mean")
            logs["loss"] = float(loss[0])
        super().after_step(trainer, logs)
