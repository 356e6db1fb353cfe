"""W7 input pipeline: one epoch of 100,000 W4-shaped records from Parquet, shuffled, in
2048-row CSR batches (indptr, indices = raw ids, field ids) with dense and label arrays.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/w7_input.py

sampan: ``sampan.rec.data.ParquetCTRReader`` (iter_batches, shuffle buffer, background
thread). PyTorch: the file read with ``pyarrow.parquet.read_table`` into tensors, then a
``DataLoader`` over a ``TensorDataset`` with ``shuffle=True`` (per-sample collate,
"dataloader") or a ``BatchSampler`` indexing whole batches ("batch-sampler"); each batch is
turned into the same CSR arrays. Batches/s = batches per epoch / epoch seconds.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from common import blas_info, emit

from sampan.rec.data import ClickStream, ParquetCTRReader, write_parquet

F = 26


def make_file(path: str, rows: int) -> None:
    stream = ClickStream(seed=7)
    per = 10_000
    write_parquet(path, (stream.batch(i, min(per, rows - i * per))
                         for i in range((rows + per - 1) // per)))


def sampan_epoch(path, batch, shuffle_buffer):
    n = 0
    for b in ParquetCTRReader(path, batch_size=batch, shuffle_buffer=shuffle_buffer, seed=n):
        assert b.indptr[-1] == b.indices.size
        n += 1
    return n


def torch_loader(torch, path, batch, mode):
    import pyarrow.parquet as pq

    t = pq.read_table(path)
    ids = torch.from_numpy(np.stack([t.column(f"sparse_{f}").to_numpy() for f in range(F)], 1))
    dense = torch.from_numpy(np.stack([t.column(f"dense_{j}").to_numpy()
                                       for j in range(13)], 1))
    labels = torch.from_numpy(t.column("label").to_numpy())
    ds = torch.utils.data.TensorDataset(ids, dense, labels)
    if mode == "dataloader":
        return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True)
    sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds), batch, False)
    return torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None)


def torch_epoch(torch, path, batch, mode):
    n = 0
    for ids, dense, labels in torch_loader(torch, path, batch, mode):
        b = ids.shape[0]
        indptr = torch.arange(0, b * F + 1, F)
        indices = ids.reshape(-1)
        fields = torch.arange(F, dtype=torch.int32).repeat(b)
        assert indptr[-1] == indices.numel() == fields.numel()
        n += 1
    return n


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--shuffle-buffer", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--systems", default="sampan,torch-dataloader,torch-batch-sampler")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "w7.parquet")
        print(f"# writing {args.rows} rows to {path}", file=sys.stderr)
        make_file(path, args.rows)
        info = {"rows": args.rows, "batch": args.batch, **blas_info()}
        for system in args.systems.split(","):
            if system == "sampan":
                def epoch():
                    return sampan_epoch(path, args.batch, args.shuffle_buffer)
                name, mode = "sampan", "eager"
            else:
                import torch

                torch.set_num_threads(1)
                mode = system.split("-", 1)[1]

                def epoch(mode=mode):
                    return torch_epoch(torch, path, args.batch, mode)
                name = "pytorch"
            epoch()  # warm-up: imports, numba compilation, page cache
            rates = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                n = epoch()
                rates.append(n / (time.perf_counter() - t0))
            emit("W7", name, mode, "batches_per_s", rates, batches=n,
                 file_mb=round(os.path.getsize(path) / 2**20, 1), **info)


if __name__ == "__main__":
    main()
