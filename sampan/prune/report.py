"""Sparsity vs accuracy vs latency of pruned models, measured side by side in one run.

Example::

    >>> rows = sampan.prune.report({"dense": net, "50% channels": small}, (x1,),
    ...                            accuracy=lambda m: evaluate(m, test_loader))
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np

from .. import nn


def _zeros(model):
    z = t = 0
    for _, m in model.named_layers():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            w = m.weight._data
            z += int(np.count_nonzero(w == 0))
            t += w.size
    return z / max(t, 1)


def _dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def measure(model, example_inputs, accuracy=None, repeats=500, warmup=50) -> dict:
    """One row of `report`: parameters, weight sparsity, saved-program bytes, accuracy
    (`accuracy(model)`, if given) and the saved program's latency at `example_inputs`
    (p50/p99 microseconds over `repeats` calls after `warmup`)."""
    from .. import jit
    was = model.training
    model.eval()
    d = tempfile.mkdtemp(prefix="sampan-prune-")
    try:
        path = jit.save(model, os.path.join(d, "m.sampan"), tuple(example_inputs))
        size = _dir_bytes(path)
        prog = jit.load(path)
        for _ in range(warmup):
            prog(*example_inputs)
        ts = np.empty(repeats)
        for i in range(repeats):
            t0 = time.perf_counter()
            prog(*example_inputs)
            ts[i] = time.perf_counter() - t0
    finally:
        shutil.rmtree(d, ignore_errors=True)
    row = {"params": model.num_parameters(), "sparsity": _zeros(model), "bytes": size,
           "p50_us": float(np.percentile(ts, 50) * 1e6),
           "p99_us": float(np.percentile(ts, 99) * 1e6)}
    row["accuracy"] = None if accuracy is None else float(accuracy(model))
    model.train(was)
    return row


def report(models: dict, example_inputs, accuracy=None, repeats=500, file=None) -> dict:
    """Measure each model of `models` ({name: Layer}) with `measure` and print a table
    (to `file`, default stdout); returns {name: row}. Latency ratios are against the
    first model."""
    import sys
    rows = {n: measure(m, example_inputs, accuracy, repeats) for n, m in models.items()}
    out = file or sys.stdout
    print(f"{'model':<22} {'params':>9} {'sparsity':>8} {'saved KiB':>9} {'accuracy':>8} "
          f"{'p50 us':>8} {'p99 us':>8} {'speed-up':>8}", file=out)
    base = next(iter(rows.values()))["p50_us"] if rows else 1.0
    for n, r in rows.items():
        acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.2%}"
        print(f"{n:<22} {r['params']:>9} {r['sparsity']:>8.1%} {r['bytes'] / 1024:>9.1f} "
              f"{acc:>8} {r['p50_us']:>8.1f} {r['p99_us']:>8.1f} "
              f"{base / r['p50_us']:>7.2f}x", file=out)
    return rows
