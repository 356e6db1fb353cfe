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


def _saved(model, example_inputs, d, name):
    from .. import jit
    was = model.training
    model.eval()
    try:
        path = jit.save(model, os.path.join(d, f"{name}.sampan"), tuple(example_inputs))
    finally:
        model.train(was)
    return _dir_bytes(path), jit.load(path)


def _served(p):
    """The executor a Predictor serves for the concrete program `p`: its memory plan and
    the kernels chosen once for its shapes (`runtime/specialize.py`: direct and one-GEMM
    convolutions, 2x2 pooling, the small-GEMM path), which is where a pruned model's
    smaller layers pay less; the loaded program's own executor keeps the op-table
    kernels, whose per-call decisions cost as much as a small layer's arithmetic (issue
    31: 1.17x against 1.37x for 50% channels of the W5 CNN at batch 1, measured under
    load). A symbolic program keeps its loaded executor."""
    if p.symbolic:
        return p.compiled
    from ..passes import PassManager
    from ..runtime import compile_graph
    return compile_graph(PassManager(["plan_memory"]).run(p.graph), name="served_fn",
                         specialize=True)


def _time(progs, example_inputs, repeats, warmup):
    """Per program, `repeats` times of its served executor (`_served`) on the example's
    arrays (no tensor wrapping: what a predictor with bound input buffers pays), the
    programs taking turns call by call, so a shared machine's load falls on all of them
    alike."""
    calls = []
    for p in progs:   # the compiled graph on prepared arrays, as a predictor runs it
        arrays = p.input_arrays(tuple(example_inputs))
        calls.append((_served(p), arrays))
        for _ in range(warmup):
            calls[-1][0](*arrays)
    ts = np.empty((len(progs), repeats))
    for i in range(repeats):
        for k, (f, arrays) in enumerate(calls):
            t0 = time.perf_counter()
            f(*arrays)
            ts[k, i] = time.perf_counter() - t0
    return ts


def measure(models: dict, example_inputs, accuracy=None, repeats=500, warmup=50) -> dict:
    """The rows of `report`, {name: row}: parameters, weight sparsity, saved-program
    bytes, accuracy (`accuracy(model)`, if given) and the saved program's latency at
    `example_inputs` (p50/p99 microseconds over `repeats` calls after `warmup`)."""
    d = tempfile.mkdtemp(prefix="sampan-prune-")
    try:
        saved = {n: _saved(m, example_inputs, d, f"m{i}")
                 for i, (n, m) in enumerate(models.items())}
        ts = _time([p for _, p in saved.values()], example_inputs, repeats, warmup)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    rows = {}
    for k, (n, m) in enumerate(models.items()):
        was = m.training
        m.eval()
        rows[n] = {"params": m.num_parameters(), "sparsity": _zeros(m),
                   "bytes": saved[n][0], "p50_us": float(np.percentile(ts[k], 50) * 1e6),
                   "p99_us": float(np.percentile(ts[k], 99) * 1e6),
                   "accuracy": None if accuracy is None else float(accuracy(m))}
        m.train(was)
    return rows


def report(models: dict, example_inputs, accuracy=None, repeats=500, file=None) -> dict:
    """Measure the models of `models` ({name: Layer}) with `measure` and print a table
    (to `file`, default stdout); returns {name: row}. Speed-ups are against the first
    model's p50."""
    import sys
    rows = measure(models, example_inputs, accuracy, repeats)
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
