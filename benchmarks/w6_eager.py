"""W6: eager overhead. 1,000 chained elementwise ops (x + b, x * c, tanh) on float32[16],
x a leaf requiring grad; µs per op for sampan, PyTorch eager and raw numpy, measured in
one process run. Also forward+backward."""
from __future__ import annotations

import numpy as np

from common import blas_info, emit, timeit

N_OPS = 999  # 333 repetitions of 3 ops


def sampan_chain():
    import sampan
    r = np.random.default_rng(0)
    x0 = sampan.tensor(r.standard_normal(16).astype(np.float32), requires_grad=True)
    b = sampan.tensor(r.standard_normal(16).astype(np.float32))
    c = sampan.tensor(r.standard_normal(16).astype(np.float32))
    tanh = sampan.tanh

    def fwd():
        x = x0
        for _ in range(333):
            x = x + b
            x = x * c
            x = tanh(x)
        return x

    def fwd_bwd():
        x0.grad = None
        fwd().sum().backward()
    return fwd, fwd_bwd


def torch_chain():
    import torch
    torch.set_num_threads(1)
    r = np.random.default_rng(0)
    x0 = torch.tensor(r.standard_normal(16).astype(np.float32), requires_grad=True)
    b = torch.tensor(r.standard_normal(16).astype(np.float32))
    c = torch.tensor(r.standard_normal(16).astype(np.float32))
    tanh = torch.tanh

    def fwd():
        x = x0
        for _ in range(333):
            x = x + b
            x = x * c
            x = tanh(x)
        return x

    def fwd_bwd():
        x0.grad = None
        fwd().sum().backward()
    return fwd, fwd_bwd


def numpy_chain():
    r = np.random.default_rng(0)
    x0 = r.standard_normal(16).astype(np.float32)
    b = r.standard_normal(16).astype(np.float32)
    c = r.standard_normal(16).astype(np.float32)

    def fwd():
        x = x0
        for _ in range(333):
            x = x + b
            x = x * c
            x = np.tanh(x)
        return x
    return fwd, None


def main():
    info = blas_info()
    systems = [("numpy", numpy_chain), ("sampan", sampan_chain)]
    try:
        import torch  # noqa: F401
        systems.append(("pytorch", torch_chain))
    except ImportError:
        pass
    built = {name: make() for name, make in systems}
    # check: sampan and pytorch compute the same chain
    if "pytorch" in built:
        a = built["sampan"][0]().numpy()
        b = built["pytorch"][0]().detach().numpy()
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    res = {}
    for rnd in range(2):  # interleave systems so background load hits all alike
        for name, (fwd, fb) in built.items():
            f = [t * 1e6 / N_OPS for t in timeit(fwd, reps=7)]
            res.setdefault((name, "fwd"), []).extend(f)
            if fb is not None:
                g = [t * 1e6 / N_OPS for t in timeit(fb, reps=7)]
                res.setdefault((name, "fwd_bwd"), []).extend(g)
    out = {}
    for (name, mode), vals in res.items():
        out[(name, mode)] = emit("W6", name, "eager", f"us_per_op_{mode}", vals, **info)
    if ("pytorch", "fwd") in out:
        for mode in ("fwd", "fwd_bwd"):
            ratio = out[("sampan", mode)]["value"] / out[("pytorch", mode)]["value"]
            emit("W6", "sampan/pytorch", "eager", f"time_ratio_{mode}", [ratio])
            # ratio of the best repetitions: less sensitive to load spikes on a shared box
            best = out[("sampan", mode)]["min"] / out[("pytorch", mode)]["min"]
            emit("W6", "sampan/pytorch", "eager", f"time_ratio_{mode}_best", [best])


if __name__ == "__main__":
    main()
