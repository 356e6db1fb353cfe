"""W1 (MLP), W2 (LeNet-5), W3 (small GPT) training steps/s: sampan eager (and jit when
available) beside PyTorch eager, in one process run, from identical initial weights.
Before timing, the loss after one step of each system must match sampan eager's within
1e-4 relative. Usage: python w1_w3_train.py [W1 W2 W3] [--steps N]"""
from __future__ import annotations

import argparse
import time

import numpy as np

import models as M
from common import blas_info, emit

SPEC = {
    "W1": dict(weights=M.w1_weights, batch=M.w1_batch, fwd=M.w1_forward,
               opt=("SGD", dict(lr=0.01, momentum=0.9)), steps=20),
    "W2": dict(weights=M.w2_weights, batch=M.w2_batch, fwd=M.w2_forward,
               opt=("Adam", dict(lr=1e-3)), steps=10),
    "W3": dict(weights=M.w3_weights, batch=M.w3_batch, fwd=M.w3_forward,
               opt=("AdamW", dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)),
               steps=3),
}


def build_sampan(wl, jit=False):
    import sampan
    s = SPEC[wl]
    F = M.SampanF()
    p = {k: sampan.tensor(v, requires_grad=True) for k, v in s["weights"]().items()}
    x, y = s["batch"]()
    x = sampan.tensor(x)
    y = sampan.tensor(y)
    extra = ()
    if wl == "W3":
        extra = (sampan.tensor(np.tril(np.ones((M.W3["seq"],) * 2, bool))),)
    name, kw = s["opt"]
    opt = getattr(sampan.optim, name)(list(p.values()), **kw)

    def step(x, y, *extra):
        opt.zero_grad()
        loss = F.ce(s["fwd"](F, p, x, *extra), y)
        loss.backward()
        opt.step()
        return loss

    if jit:
        step = sampan.jit(step)
    return lambda: float(step(x, y, *extra).item())


def build_torch(wl):
    import torch
    torch.manual_seed(0)
    s = SPEC[wl]
    F = M.TorchF()
    p = {k: torch.tensor(v, requires_grad=True) for k, v in s["weights"]().items()}
    x, y = s["batch"]()
    x, y = torch.tensor(x), torch.tensor(y)
    extra = ()
    if wl == "W3":
        extra = (torch.tensor(np.tril(np.ones((M.W3["seq"],) * 2, bool))),)
    name, kw = s["opt"]
    opt = getattr(torch.optim, name)(list(p.values()), **kw)

    def step():
        opt.zero_grad()
        loss = F.ce(s["fwd"](F, p, x, *extra), y)
        loss.backward()
        opt.step()
        return float(loss.item())
    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*", default=["W1", "W2", "W3"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-jit", action="store_true")
    args = ap.parse_args()
    info = blas_info()
    import torch
    torch.set_num_threads(2)
    for wl in args.workloads:
        systems = {("sampan", "eager"): build_sampan(wl), ("pytorch", "eager"): build_torch(wl)}
        if not args.no_jit:
            try:
                systems[("sampan", "jit")] = build_sampan(wl, jit=True)
            except Exception as e:  # jit not available yet
                print(f"# {wl}: sampan jit unavailable: {type(e).__name__}: {e}")
        # correctness: two steps from identical weights; losses must agree
        losses = {k: [f(), f()] for k, f in systems.items()}
        ref = losses[("sampan", "eager")]
        for k, ls in losses.items():
            rel = abs(ls[1] - ref[1]) / abs(ref[1])
            if rel > 1e-4:
                print(f"# {wl} {k}: loss after one step {ls[1]:.6f} vs sampan eager "
                      f"{ref[1]:.6f} (rel {rel:.2e}) — excluded from timing")
                systems.pop(k)
        n = SPEC[wl]["steps"]
        rates = {k: [] for k in systems}
        for _ in range(args.reps):  # interleaved so background load hits all systems alike
            for k, f in systems.items():
                t = time.perf_counter()
                for _ in range(n):
                    f()
                rates[k].append(n / (time.perf_counter() - t))
        recs = {k: emit(wl, k[0], k[1], "steps_per_s", v, loss_after_1_step=round(
            losses[k][1], 6), **info) for k, v in rates.items()}
        base = recs.get(("pytorch", "eager"))
        if base:
            for k, r in recs.items():
                if k[0] == "sampan":
                    emit(wl, f"sampan_{k[1]}/pytorch_eager", k[1], "speed_ratio",
                         [r["value"] / base["value"]])


if __name__ == "__main__":
    main()
