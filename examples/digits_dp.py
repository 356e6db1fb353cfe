"""The digits CNN trained data-parallel: one epoch on N ranks, each on its shard of every
global batch of 32; every rank prints the checksum of its parameters (identical on all
ranks: the gradients were averaged and the updates are the same).

Run: sampan launch -n 2 examples/digits_dp.py     (or: mpiexec -n 2 python examples/digits_dp.py)
`--data F.npz` reads the split from a file `save_digits` wrote instead of scikit-learn
(whose import is the slowest part of a rank's start).
"""
from __future__ import annotations

import argparse
import os
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sampan  # noqa: E402
import sampan.distributed as dist  # noqa: E402
from sampan.data import DataLoader  # noqa: E402
from sampan.distributed.data_parallel import DataParallel  # noqa: E402
from sampan.distributed.sampler import DistributedSampler  # noqa: E402
from sampan.train import Trainer  # noqa: E402

from digits_cnn import DigitsCNN, evaluate  # noqa: E402

GLOBAL_BATCH = 32


def checksum(model) -> str:
    """CRC-32 over the bytes of every parameter, in order: equal only if bit-identical."""
    crc = 0
    for p in model.parameters():
        crc = zlib.crc32(p.numpy().tobytes(), crc)
    return f"{crc:08x}"


def save_digits(path):
    """Write digits_common's train/test split to `path` (.npz) for `--data`."""
    from digits_common import digits
    tr, te = digits(seed=0)
    np.savez(path, **{f"{k}{i}": t.numpy() for k, ds in (("train", tr), ("test", te))
                      for i, t in enumerate(ds.tensors)})


def _datasets(path):
    if path is None:
        from digits_common import digits
        return digits(seed=0)
    from sampan.data import TensorDataset
    with np.load(path) as z:
        return tuple(TensorDataset(sampan.tensor(z[f"{k}0"]), sampan.tensor(z[f"{k}1"]))
                     for k in ("train", "test"))


def main(argv=None, epochs=1):
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=None, help=".npz written by save_digits")
    a = ap.parse_args(argv)
    dist.init()                   # MPI under `sampan launch` / mpiexec, else one rank
    rank, n = dist.rank(), dist.world_size()
    train_set, test_set = _datasets(a.data)
    sampan.manual_seed(rank)      # different initial weights: DataParallel broadcasts rank 0's
    model = DataParallel(DigitsCNN())
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=GLOBAL_BATCH // n, sampler=sampler)
    opt = sampan.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    Trainer(model, opt, sampan.cross_entropy, loader).fit(epochs)
    acc = evaluate(model.module, DataLoader(test_set, batch_size=256))
    print(f"rank {rank}/{n}: {len(loader)} steps of {GLOBAL_BATCH // n} samples, "
          f"test accuracy {acc:.4f}, parameter checksum {checksum(model.module)}", flush=True)
    dist.destroy()


if __name__ == "__main__":
    main()
