"""W1 (MLP), W2 (LeNet-5), W3 (small GPT) training steps/s: sampan eager (and jit when
available) beside PyTorch eager, and, where they install and compile here, JAX jit and
PyTorch torch.compile, in one process run, from identical initial weights.
Before timing, the loss after one step of each system must match sampan eager's within
1e-4 relative. Usage: python w1_w3_train.py [W1 W2 W3] [--reps N] [--no-jit] [--no-jax]
[--no-compile]

Also the fraction of the machine's peak GEMM rate each system reaches: a step's GEMM work
(matmuls and convolutions, forward and backward, counted by the op table's FLOP rules
over sampan's traced step) times steps/s, over the rate of a 1024^3 float32 numpy
matmul timed in the same rotation of blocks as the systems ("gemm_peak_fraction")."""
from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial

os.environ["JAX_PLATFORMS"] = "cpu"  # before jax is imported: CPU only, no accelerator probing

import numpy as np

import sampan  # noqa: F401 - before torch: sets OpenMP's passive wait policy before any libgomp loads
import models as M
from common import add_kernel_args, apply_kernel_args, blas_info, emit

SPEC = {
    "W1": dict(weights=M.w1_weights, batch=M.w1_batch, fwd=M.w1_forward,
               opt=("SGD", dict(lr=0.01, momentum=0.9)), steps=20),
    "W2": dict(weights=M.w2_weights, batch=M.w2_batch, fwd=M.w2_forward,
               opt=("Adam", dict(lr=1e-3)), steps=10),
    "W3": dict(weights=M.w3_weights, batch=M.w3_batch, fwd=M.w3_forward,
               opt=("AdamW", dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)),
               steps=3, reps=12),
}
PEAK = ("numpy", "gemm_peak")   # a pseudo-system: the peak-rate GEMM, timed in the rotation
COMPILE_WARMUP = 3  # untimed torch.compile steps beyond the two of the correctness check


def causal_mask():
    return np.tril(np.ones((M.W3["seq"],) * 2, bool))


def build_sampan(wl, jit=False, amp=None):
    """One training step of workload `wl` as a callable; `amp`: run forward and loss
    under ``sampan.amp.autocast(amp)`` (w1_w3_amp.py)."""
    import contextlib

    import sampan
    s = SPEC[wl]
    F = M.SampanF()
    p = {k: sampan.tensor(v, requires_grad=True) for k, v in s["weights"]().items()}
    x, y = s["batch"]()
    x = sampan.tensor(x)
    y = sampan.tensor(y)
    extra = ()
    if wl == "W3":
        extra = (sampan.tensor(causal_mask()),)
    name, kw = s["opt"]
    opt = getattr(sampan.optim, name)(list(p.values()), **kw)

    def step(x, y, *extra):
        opt.zero_grad()
        with sampan.amp.autocast(amp) if amp is not None else contextlib.nullcontext():
            loss = F.ce(s["fwd"](F, p, x, *extra), y)
        loss.backward()
        opt.step()
        return loss

    if jit:
        step = sampan.jit(step)
    return lambda: float(step(x, y, *extra).item())


def build_torch(wl, compile=None):
    """PyTorch eager, or with torch.compile (default mode): compile="step" compiles the
    forward+loss and the optimiser step, compile="forward" the forward+loss only. Compilation
    happens at the first call, so errors surface there."""
    import torch
    torch.manual_seed(0)
    s = SPEC[wl]
    F = M.TorchF()
    p = {k: torch.tensor(v, requires_grad=True) for k, v in s["weights"]().items()}
    x, y = s["batch"]()
    x, y = torch.tensor(x), torch.tensor(y)
    extra = ()
    if wl == "W3":
        extra = (torch.tensor(causal_mask()),)
    name, kw = s["opt"]
    opt = getattr(torch.optim, name)(list(p.values()), **kw)

    def loss_fn(x, y, *extra):
        return F.ce(s["fwd"](F, p, x, *extra), y)

    def opt_step():
        opt.step()

    if compile:
        # compile in this process: no pool of compile workers left competing for the 2 cores
        import torch._inductor.config
        torch._inductor.config.compile_threads = 1
        loss_fn = torch.compile(loss_fn)
        if compile == "step":
            opt_step = torch.compile(opt_step)

    def step():
        opt.zero_grad()
        loss = loss_fn(x, y, *extra)
        loss.backward()
        opt_step()
        return float(loss.item())
    return step


def jax_optimiser(name, kw):
    """(init, update) with PyTorch's semantics, written in jax.numpy. SGD: buf = m*buf + g,
    p -= lr*buf (buf starts at 0, so the first step gives buf = g as in torch). Adam/AdamW:
    torch's bias-corrected update; AdamW first decays p by (1 - lr*wd)."""
    import jax
    import jax.numpy as jnp
    tm = jax.tree_util.tree_map
    lr = kw["lr"]
    if name == "SGD":
        mom = kw["momentum"]

        def init(p):
            return tm(jnp.zeros_like, p)

        def update(p, g, buf):
            buf = tm(lambda b, g: mom * b + g, buf, g)
            return tm(lambda p, b: p - lr * b, p, buf), buf
        return init, update
    if name not in ("Adam", "AdamW"):
        raise NotImplementedError(name)
    b1, b2 = kw.get("betas", (0.9, 0.999))
    eps = kw.get("eps", 1e-8)
    wd = kw.get("weight_decay", 0.01 if name == "AdamW" else 0.0)

    def init(p):
        return tm(jnp.zeros_like, p), tm(jnp.zeros_like, p), jnp.zeros((), jnp.int32)

    def update(p, g, state):
        m, v, t = state
        t = t + 1
        tf = t.astype(jnp.float32)
        bc1, bc2 = 1 - b1 ** tf, 1 - b2 ** tf
        if wd and name == "AdamW":
            p = tm(lambda p: p * (1 - lr * wd), p)
        elif wd:
            g = tm(lambda g, p: g + wd * p, g, p)
        m = tm(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = tm(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        step_size, sbc2 = lr / bc1, jnp.sqrt(bc2)
        p = tm(lambda p, m, v: p - step_size * m / (jnp.sqrt(v) / sbc2 + eps), p, m, v)
        return p, (m, v, t)
    return init, update


def build_jax(wl):
    """The whole train step (forward, loss, gradient, optimiser) as one jax.jit-ed function;
    params and optimiser state are donated, so XLA updates them in place."""
    import jax
    import jax.numpy as jnp
    s = SPEC[wl]
    F = M.JaxF()
    params = {k: jnp.asarray(v) for k, v in s["weights"]().items()}
    x, y = s["batch"]()
    x = jnp.asarray(x if x.dtype == np.float32 else x.astype(np.int32))
    y = jnp.asarray(y.astype(np.int32))
    extra = (jnp.asarray(causal_mask()),) if wl == "W3" else ()
    init, update = jax_optimiser(*s["opt"])

    def loss_fn(p, x, y, *extra):
        return F.ce(s["fwd"](F, p, x, *extra), y)

    def train_step(p, state, x, y, *extra):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y, *extra)
        p, state = update(p, g, state)
        return p, state, loss

    jstep = jax.jit(train_step, donate_argnums=(0, 1))
    cur = [params, init(params)]

    def step():
        cur[0], cur[1], loss = jstep(cur[0], cur[1], x, y, *extra)
        jax.block_until_ready(cur)  # the update as well as the loss is finished
        return float(loss)
    return step


def first_line(e, n=200):
    msg = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {msg[:n]}"


GEMM_OPS = ("matmul", "conv2d", "conv_transpose2d", "conv2d_grad_weight")
PEAK_N = 1024   # the GEMM that measures the machine's peak rate: 2 * 1024^3 FLOP per call


def gemm_flops_per_step(wl):
    """GEMM FLOPs of one training step: the op table's FLOP rule of every matmul and
    convolution node in sampan's traced step (the graph the runtime compiles)."""
    import sampan.runtime as rt
    import sampan.runtime.codegen as cg
    from sampan.ops.registry import OPS
    graphs, orig = [], cg.compile_graph

    def capture(g, **kw):
        graphs.append(g)
        return orig(g, **kw)
    cg.compile_graph = rt.compile_graph = capture
    try:
        build_sampan(wl, jit=True)()
    finally:
        cg.compile_graph = rt.compile_graph = orig
    return sum(OPS[n.op].flops(*n.inputs, **n.attrs) for n in graphs[-1].nodes
               if n.op in GEMM_OPS)


def peak_gemm():
    """One float32 PEAK_N^3 matmul per call (numpy's BLAS with all its threads, also when
    sampan's oneDNN GEMM pool holds it at one: the machine's peak, not the pool's)."""
    from sampan import _threads
    r = np.random.default_rng(0)
    a, b = (r.standard_normal((PEAK_N, PEAK_N), dtype=np.float32) for _ in range(2))
    out = np.empty_like(a)

    def run():
        cap = _threads.blas_cap()
        _threads.cap_blas(None)
        try:
            np.matmul(a, b, out=out)
        finally:
            _threads.cap_blas(cap)
    return run


def interleaved_rates(systems, n, reps, pause, clock=time.perf_counter):
    """{key: [steps/s of each block]} for blocks of `n` calls of every system's step,
    `reps` rounds, interleaved so background load hits all systems alike and rotated so
    that each system runs in each position (first after the pause, after a GEMM-heavy
    peer, ...) equally often: with a fixed order, sampan's A/B against itself moved by up
    to 5% with which side ran first. Each block starts after `pause` seconds: thread pools
    of the system before (OpenBLAS workers spin ~0.1 s after a GEMM, OpenMP's a little)
    would otherwise take a core from this one; measured, that slowed PyTorch after sampan
    by ~1.5x on W1. `clock`: time.process_time gives steps per CPU second of the
    process (w1_w3_amp.py --cpu-clock)."""
    rates = {k: [] for k in systems}
    order = list(systems.items())
    for r in range(reps):
        for k, f in order[r % len(order):] + order[:r % len(order)]:
            time.sleep(pause)
            t = clock()
            for _ in range(n):
                f()
            rates[k].append(n / (clock() - t))
    return rates


def two_steps(build):
    f = build()
    return f, [f(), f()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*", default=["W1", "W2", "W3"])
    ap.add_argument("--reps", type=int, default=None,
                    help="timed blocks per system (default: 5, W3 8)")
    ap.add_argument("--pause", type=float, default=0.3,
                    help="seconds idle before each timed block (lets other thread pools sleep)")
    ap.add_argument("--no-jit", action="store_true", help="skip sampan jit")
    ap.add_argument("--no-jax", action="store_true", help="skip JAX jit")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    add_kernel_args(ap)
    args = ap.parse_args()
    apply_kernel_args(args)
    info = blas_info()
    import torch
    torch.set_num_threads(2)
    jax_ok, jax_version = not args.no_jax, None
    if jax_ok:
        try:
            import jax
            jax_version = jax.__version__
        except Exception as e:
            print(f"# jax unavailable: {first_line(e)}")
            jax_ok = False
    for wl in args.workloads:
        # correctness: two steps from identical weights; losses must agree
        systems, losses, notes = {}, {}, {}
        for k, b in ((("sampan", "eager"), partial(build_sampan, wl)),
                     (("pytorch", "eager"), partial(build_torch, wl))):
            systems[k], losses[k] = two_steps(b)
        if not args.no_jit:
            try:
                k = ("sampan", "jit")
                systems[k], losses[k] = two_steps(partial(build_sampan, wl, jit=True))
            except Exception as e:  # jit not available yet
                print(f"# {wl}: sampan jit unavailable: {first_line(e)}")
        if jax_ok:
            try:
                k = ("jax", "jit")
                systems[k], losses[k] = two_steps(partial(build_jax, wl))
                notes[k] = {"jax": jax_version}
            except Exception as e:
                print(f"# {wl}: jax jit unavailable: {first_line(e)}")
        if not args.no_compile:
            k = ("pytorch", "compile")
            try:
                systems[k], losses[k] = two_steps(partial(build_torch, wl, compile="step"))
                notes[k] = {"compiled": "forward+loss, optimiser step"}
            except Exception as e:
                print(f"# {wl}: torch.compile of the optimiser step failed ({first_line(e)}); "
                      "compiling forward+loss only")
                try:
                    systems[k], losses[k] = two_steps(
                        partial(build_torch, wl, compile="forward"))
                    notes[k] = {"compiled": "forward+loss"}
                except Exception as e:
                    print(f"# {wl}: torch.compile unavailable: {first_line(e)}")
            if k in systems:
                for _ in range(COMPILE_WARMUP):
                    systems[k]()
        ref = losses[("sampan", "eager")]
        for k, ls in losses.items():
            rel = abs(ls[1] - ref[1]) / abs(ref[1])
            if rel > 1e-4:
                print(f"# {wl} {k}: loss after one step {ls[1]:.6f} vs sampan eager "
                      f"{ref[1]:.6f} (rel {rel:.2e}) — excluded from timing")
                systems.pop(k)
        try:
            gemm_flops = gemm_flops_per_step(wl) if ("sampan", "jit") in systems else None
        except Exception as e:
            print(f"# {wl}: GEMM FLOPs not counted: {first_line(e)}")
            gemm_flops = None
        if gemm_flops:
            systems[PEAK] = peak_gemm()
        # W3's blocks are 3 steps of ~0.15 s: more of them, as its ratio moved by +-0.1
        # between runs with 5 and by +-0.05 with 8
        reps = args.reps or SPEC[wl].get("reps", 5)
        rates = interleaved_rates(systems, SPEC[wl]["steps"], reps, args.pause)
        peak = rates.pop(PEAK, None)
        recs = {k: emit(wl, k[0], k[1], "steps_per_s", v, loss_after_1_step=round(
            losses[k][1], 6), **notes.get(k, {}), **info) for k, v in rates.items()}
        if peak:
            peak_flops = 2 * PEAK_N ** 3 * statistics.median(peak)
            for k, v in rates.items():
                emit(wl, k[0], k[1], "gemm_peak_fraction", [gemm_flops * x / peak_flops
                                                            for x in v],
                     gemm_gflop_per_step=round(gemm_flops / 1e9, 4),
                     peak_gflops=round(peak_flops / 1e9, 1), peak_gemm=f"{PEAK_N}^3 float32")
        base = recs.get(("pytorch", "eager"))
        if base:
            for k, r in recs.items():
                if k[0] == "sampan":
                    emit(wl, f"sampan_{k[1]}/pytorch_eager", k[1], "speed_ratio",
                         [r["value"] / base["value"]])
        ours = recs.get(("sampan", "jit"))
        for peer in (("jax", "jit"), ("pytorch", "compile")):
            if ours and peer in recs:
                emit(wl, f"sampan_jit/{peer[0]}_{peer[1]}", "jit", "speed_ratio",
                     [ours["value"] / recs[peer]["value"]])


if __name__ == "__main__":
    main()
