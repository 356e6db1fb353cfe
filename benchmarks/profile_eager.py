"""Where an eager training step's time goes: per-op time of W1, W2 or W3 in sampan eager,
from timers wrapped around every op table kernel (forward, "F op") and gradient rule
(backward, "B op", its nested ops included), plus the optimiser's step and zero_grad.

Each timed call is keyed by its place in the step; the minimum over the steps is kept,
which filters the noise of a shared machine. "GEMM" is matmul and convolution forward
and backward; "outside ops" is the step's minimum minus the sum of the op minima: the
per-op dispatch, tape and engine bookkeeping and the model's own Python (an upper
bound, since the minima come from different steps). Timers add ~0.3 us per call. Not
part of `make bench` (absolute times); the jit side is profile_jit.py.

    .venv/bin/python benchmarks/profile_eager.py W3 [--steps 12] [--top 25]
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GEMM = ("matmul", "conv2d", "conv_transpose2d", "conv2d_grad_weight")


def instrument(log):
    """Wrap every op's kernel and gradient rule and the optimiser's step/zero_grad so
    that each outermost call appends (label, seconds) to `log`."""
    from sampan.ops.registry import OPS
    from sampan.optim.optimizer import Optimizer
    depth = [0]

    def timed(label, f):
        def run(*a, **kw):
            if depth[0]:                # nested (a gradient rule's own ops): counted once
                return f(*a, **kw)
            depth[0] += 1
            t = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                log.append((label, time.perf_counter() - t))
                depth[0] -= 1
        return run

    for op in OPS.values():
        op.kernel = timed("F " + op.name, op.kernel)
        if op.grad is not None:
            op.grad = timed("B " + op.name, op.grad)
    Optimizer.step = timed("optimizer.step", Optimizer.step)
    Optimizer.zero_grad = timed("optimizer.zero_grad", Optimizer.zero_grad)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", nargs="?", default="W3", choices=["W1", "W2", "W3"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    import w1_w3_train as B
    log = []
    instrument(log)
    step = B.build_sampan(args.workload)
    for _ in range(2):
        step()
    runs, totals = [], []
    for _ in range(args.steps):
        log.clear()
        t = time.perf_counter()
        step()
        totals.append(time.perf_counter() - t)
        runs.append(list(log))
    labels = [k for k, _ in runs[0]]
    if any([k for k, _ in r] != labels for r in runs):
        raise SystemExit("profile_eager: the steps ran different op sequences")
    mins = [min(r[i][1] for r in runs) for i in range(len(labels))]
    per = collections.defaultdict(float)
    count = collections.Counter()
    for k, t in zip(labels, mins):
        per[k] += t
        count[k] += 1
    ops = sum(mins)
    gemm = sum(t for k, t in per.items() if k.split(" ")[-1] in GEMM)
    best = min(totals)
    print(f"{args.workload} eager step: min {best * 1e3:.2f} ms over {args.steps} steps")
    print(f"  GEMM ops {gemm * 1e3:.2f} ms ({gemm / best:.0%}), other ops "
          f"{(ops - gemm) * 1e3:.2f} ms ({(ops - gemm) / best:.0%}), outside ops "
          f"{(best - ops) * 1e3:.2f} ms ({(best - ops) / best:.0%})")
    for k, t in sorted(per.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {k:32s} {t * 1e3:9.3f} ms  x{count[k]}")


if __name__ == "__main__":
    main()
