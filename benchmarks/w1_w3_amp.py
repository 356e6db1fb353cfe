"""W1-W3 training under bfloat16 autocast: sampan (eager and jit) beside PyTorch eager
(`torch.autocast("cpu", dtype=torch.bfloat16)`), each beside its own float32 training, in
one process run from identical weights (the models and optimisers of w1_w3_train.py).
Every line records the CPU model, its AVX-512/AMX flags and the kernel provider per op
(`common.emit`'s "machine"); `--kernels numpy` keeps bf16 GEMMs on the numpy kernel
(float32 sgemm, rounded), `onednn` prefers oneDNN, default: measured per op.

Also the loss after N steps (default 200, `--loss-steps`) of sampan's bf16 W3 training
against its float32 training from the same weights (target: within 1%).

`--profile N` also profiles N steps of sampan's bf16 training (eager, and jit unless
--no-jit) with `sampan.profiler` and prints one line per mode with the ops that take the
most self time (ms per step, share of the wall time, GFLOP/s).

`--cpu-clock` times steps per CPU second of the process (time.process_time) instead of
wall time, PyTorch on one thread: run it single-threaded (OMP_NUM_THREADS=1
OPENBLAS_NUM_THREADS=1 NUMBA_NUM_THREADS=1) on a shared machine, where a busy neighbour
deschedules one of two threads and wall-time ratios measure the scheduler, not the kernels
(W1 at load 10: 70 steps/s instead of ~290). The ratios it gives are the single-thread
work per step; the wall-time ones on a quiet machine stay the target.

Usage: python w1_w3_amp.py [W1 W2 W3] [--reps N] [--quick] [--no-jit] [--loss-steps N]
[--no-timing] [--cpu-clock] [--profile N] [--kernels measured|numpy|onednn] [--pool ...] [--pool-bf16 ...]"""
from __future__ import annotations

import argparse
from functools import partial

import models as M
from common import add_kernel_args, apply_kernel_args, blas_info, emit

# sampan before torch: libgomp reads its wait policy once, when the first library loads
# it, and PyTorch ships a libgomp.so.1 that oneDNN then shares; imported first, torch
# left it spinning and W1 bf16 ran at 0.12x its fp32 (every line records the policy in
# force, "omp_wait_policy"). Both frameworks run under the one policy.
import sampan  # noqa: E402,F401  (sets sampan's OpenMP wait policy)
from w1_w3_train import SPEC, causal_mask
from w1_w3_train import build_sampan as _train_step
from w1_w3_train import interleaved_rates


def build_sampan(wl, amp, jit=False):
    """w1_w3_train's sampan step, under bfloat16 autocast when `amp`."""
    import sampan
    return _train_step(wl, jit=jit, amp=sampan.bfloat16 if amp else None)


def build_torch(wl, amp):
    import torch
    s = SPEC[wl]
    F = M.TorchF()
    p = {k: torch.tensor(v, requires_grad=True) for k, v in s["weights"]().items()}
    x, y = s["batch"]()
    x, y = torch.tensor(x), torch.tensor(y)
    extra = (torch.tensor(causal_mask()),) if wl == "W3" else ()
    name, kw = s["opt"]
    opt = getattr(torch.optim, name)(list(p.values()), **kw)

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = F.ce(s["fwd"](F, p, x, *extra), y)
        loss.backward()
        opt.step()
        return float(loss.item())
    return step


def loss_after(build, n):
    f = build()
    loss = None
    for _ in range(n):
        loss = f()
    return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*", default=["W1", "W2", "W3"])
    ap.add_argument("--reps", type=int, default=None, help="timed blocks per system")
    ap.add_argument("--pause", type=float, default=0.3)
    ap.add_argument("--no-jit", action="store_true")
    ap.add_argument("--quick", action="store_true", help="3 blocks, 20 loss steps")
    ap.add_argument("--loss-steps", type=int, default=None,
                    help="W3 steps of the bf16-vs-float32 loss check (default 200; 0: none)")
    ap.add_argument("--no-timing", action="store_true", help="only the loss check")
    ap.add_argument("--profile", type=int, default=0,
                    help="profile N bf16 steps of sampan and print the top ops")
    ap.add_argument("--cpu-clock", action="store_true",
                    help="steps per CPU second (process time), PyTorch on one thread")
    add_kernel_args(ap)
    args = ap.parse_args()
    apply_kernel_args(args)
    import torch
    torch.set_num_threads(1 if args.cpu_clock else 2)
    info = blas_info()
    reps = args.reps or (3 if args.quick else 5)
    for wl in args.workloads:
        if not args.no_timing:
            timing(wl, args, reps, info)
        if args.profile:
            for jit in (False,) if args.no_jit else (False, True):
                profile(wl, jit, args.profile, info)
        steps = args.loss_steps if args.loss_steps is not None else (20 if args.quick else 200)
        if wl == "W3" and steps:
            jit = not args.no_jit
            l32 = loss_after(partial(build_sampan, wl, False, jit=jit), steps)
            l16 = loss_after(partial(build_sampan, wl, True, jit=jit), steps)
            emit(wl, "sampan", "jit_bf16" if jit else "eager_bf16", "loss_rel_diff_pct_vs_fp32",
                 [100 * abs(l16 - l32) / abs(l32)], steps=steps, loss_bf16=round(l16, 6),
                 loss_fp32=round(l32, 6))


def profile(wl, jit, steps, info, top=12):
    """The ops with the most self time in `steps` of sampan's bf16 step (after warm-up)."""
    import sampan.profiler
    f = build_sampan(wl, True, jit=jit)
    f()
    f()
    with sampan.profiler.profile() as prof:
        for _ in range(steps):
            f()
    table = prof.key_averages()
    rows = [{"op": r.name, "cat": r.cat, "ms_per_step": round(r.self_ns / 1e6 / steps, 3),
             "share": round(r.share, 4), "gflops": round(r.gflops, 2)}
            for r in table.sorted("self_time")[:top]]
    emit(wl, "sampan", "jit_bf16" if jit else "eager_bf16", "profile_ms_per_step",
         [table.wall_ns / 1e6 / steps], top_ops=rows, **info)


def timing(wl, args, reps, info):
    """steps/s of every system in one interleaved, rotated run, and the ratios."""
    systems = {("sampan", "eager_fp32"): partial(build_sampan, wl, False),
               ("sampan", "eager_bf16"): partial(build_sampan, wl, True),
               ("pytorch", "eager_fp32"): partial(build_torch, wl, False),
               ("pytorch", "eager_bf16"): partial(build_torch, wl, True)}
    if not args.no_jit:
        systems[("sampan", "jit_fp32")] = partial(build_sampan, wl, False, jit=True)
        systems[("sampan", "jit_bf16")] = partial(build_sampan, wl, True, jit=True)
    fns, first = {}, {}
    for k, b in systems.items():
        fns[k] = b()
        first[k] = [fns[k](), fns[k]()]       # warm-up: tracing, compiles
    import time
    clock = time.process_time if args.cpu_clock else time.perf_counter
    rates = interleaved_rates(fns, SPEC[wl]["steps"], reps, args.pause, clock)
    metric = "steps_per_cpu_s" if args.cpu_clock else "steps_per_s"
    recs = {k: emit(wl, k[0], k[1], metric, v, loss_after_1_step=round(
        first[k][1], 6), **info) for k, v in rates.items()}
    def ratio(a, b):
        # median over median; "best": best block over best block (on a shared machine the
        # least disturbed block of each system, a figure beside the median, not instead)
        return dict(values=[recs[a]["value"] / recs[b]["value"]],
                    best=round(recs[a]["max"] / recs[b]["max"], 4))
    tb = ("pytorch", "eager_bf16")
    for mode in ("eager", "jit"):
        ours = ("sampan", f"{mode}_bf16")
        if ours not in recs:
            continue
        r = ratio(ours, tb)
        emit(wl, f"sampan_{mode}_bf16/pytorch_eager_bf16", mode, "speed_ratio", r["values"],
             best=r["best"])
        r = ratio(ours, ("sampan", f"{mode}_fp32"))
        emit(wl, f"sampan_{mode}_bf16/sampan_{mode}_fp32", mode, "speed_ratio", r["values"],
             best=r["best"])
    r = ratio(tb, ("pytorch", "eager_fp32"))
    emit(wl, "pytorch_eager_bf16/pytorch_eager_fp32", "eager", "speed_ratio", r["values"],
         best=r["best"])


if __name__ == "__main__":
    main()
