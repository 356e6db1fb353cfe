"""The digits CNN trained data-parallel: one epoch on N ranks, each on its shard of every
global batch of 32; every rank prints the checksum of its parameters (identical on all
ranks: the gradients were averaged and the updates are the same).

Run: sampan launch -n 2 examples/digits_dp.py     (or: mpiexec -n 2 python examples/digits_dp.py)
"""
from __future__ import annotations

import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sampan  # noqa: E402
import sampan.distributed as dist  # noqa: E402
from sampan.data import DataLoader  # noqa: E402
from sampan.distributed.data_parallel import DataParallel  # noqa: E402
from sampan.distributed.sampler import DistributedSampler  # noqa: E402
from sampan.train import Trainer  # noqa: E402

from digits_cnn import DigitsCNN, evaluate  # noqa: E402
from digits_common import digits  # noqa: E402

GLOBAL_BATCH = 32


def checksum(model) -> str:
    """CRC-32 over the bytes of every parameter, in order: equal only if bit-identical."""
    crc = 0
    for p in model.parameters():
        crc = zlib.crc32(p.numpy().tobytes(), crc)
    return f"{crc:08x}"


def main(epochs=1):
    dist.init()                   # MPI under `sampan launch` / mpiexec, else one rank
    rank, n = dist.rank(), dist.world_size()
    train_set, test_set = digits(seed=0)
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
