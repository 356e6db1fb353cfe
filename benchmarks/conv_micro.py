"""Micro-benchmark: sampan conv2d forward+backward against PyTorch (CPU) on the LeNet
shapes (batch 64: conv 1->6 5x5 pad 2 on 28x28, conv 6->16 5x5 on 14x14).

Prints one JSON line: per layer the median milliseconds of sampan and torch and their
ratio (sampan / torch; below 1 means sampan is faster), all measured in this one run.

    .venv/bin/python benchmarks/conv_micro.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import sampan  # noqa: E402

LAYERS = [  # name, input shape, weight shape, padding, input needs grad
    ("conv1", (64, 1, 28, 28), (6, 1, 5, 5), 2, False),
    ("conv2", (64, 6, 14, 14), (16, 6, 5, 5), 0, True),
]


def _median_ms(fns, repeats, block=20, pause=0.3):
    """Median milliseconds per call of each function, in blocks of `block` calls that
    alternate between the systems, each after a pause: this VM's speed drifts by a third,
    and a thread pool still spinning from the other system's calls (OpenBLAS's, OpenMP's)
    would take a core from the one measured."""
    for fn in fns:
        fn()  # warm up
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            time.sleep(pause)
            t0 = time.perf_counter()
            for _ in range(block):
                fn()
            ts.append((time.perf_counter() - t0) * 1e3 / block)
    return [statistics.median(ts) for ts in times]


def _sampan_step(x, w, b, pad, g):
    def step():
        for t in (x, w, b):
            t.grad = None
        y = sampan.conv2d(x, w, b, padding=pad)
        y.backward(g)
    return step


def _torch_step(torch, x, w, b, pad, g):
    def step():
        for t in (x, w, b):
            t.grad = None
        y = torch.nn.functional.conv2d(x, w, b, padding=pad)
        y.backward(g)
    return step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    import torch
    r = np.random.default_rng(0)
    result = {"benchmark": "conv2d_fwd_bwd_lenet", "repeats": args.repeats,
              "torch_threads": torch.get_num_threads(), "layers": {}}
    tot_s = tot_t = 0.0
    for name, xs, ws, pad, xgrad in LAYERS:
        xa = r.standard_normal(xs).astype(np.float32)
        wa = (r.standard_normal(ws) * 0.1).astype(np.float32)
        ba = r.standard_normal(ws[0]).astype(np.float32)
        ho = xs[2] + 2 * pad - ws[2] + 1
        ga = r.standard_normal((xs[0], ws[0], ho, ho)).astype(np.float32)
        sx, sw, sb = (sampan.tensor(xa, requires_grad=xgrad), sampan.tensor(wa, requires_grad=True),
                      sampan.tensor(ba, requires_grad=True))
        tx, tw, tb = (torch.tensor(xa, requires_grad=xgrad), torch.tensor(wa, requires_grad=True),
                      torch.tensor(ba, requires_grad=True))
        ms_s, ms_t = _median_ms([_sampan_step(sx, sw, sb, pad, sampan.tensor(ga)),
                                 _torch_step(torch, tx, tw, tb, pad, torch.tensor(ga))],
                                args.repeats)
        # same numbers both ways (a benchmark of a wrong kernel is worthless)
        np.testing.assert_allclose(sw.grad.numpy(), tw.grad.numpy(), rtol=1e-3, atol=1e-3)
        result["layers"][name] = {"sampan_ms": round(ms_s, 3), "torch_ms": round(ms_t, 3),
                                  "ratio": round(ms_s / ms_t, 3)}
        tot_s, tot_t = tot_s + ms_s, tot_t + ms_t
    result["total_sampan_ms"] = round(tot_s, 3)
    result["total_torch_ms"] = round(tot_t, 3)
    result["ratio"] = round(tot_s / tot_t, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
