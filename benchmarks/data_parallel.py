"""D1: data-parallel scaling of W1 (MLP) and W3 (small GPT) training (WORKLOADS.md).

Each rank trains on the workload's batch (weak scaling: the 2-rank job takes 2x the
samples a step), one BLAS thread per rank. Systems, each in fresh processes, in one run:
  sampan  1 rank (plain step)  and 2 ranks (`mpiexec -n 2`, eager `DataParallel`)
  torch   1 rank (plain step)  and 2 ranks (DDP, gloo, init_method tcp://127.0.0.1:port)
Lines: samples/s of each; scaling efficiency = samples/s(2 ranks) / (2 x samples/s(1
rank)); sampan DP / torch DDP; exposed communication (the wait after backward ends) over
the total communication time (the same buckets all-reduced back to back, blocking) from
DataParallel's timestamps. The 2-rank sampan job then prints the all-reduce bandwidth
lines of dist-comm's `benchmarks/allreduce.py: sampan_allreduce_bandwidth` (1-64 MB
against raw mpi4py), when that file exists (`--no-bandwidth` skips them).
Targets: efficiency >= 0.9 (W3), >= 0.8 (W1); >= 1.0x DDP; exposed < 20%.
Usage: python data_parallel.py [W1 W3] [--quick] [--reps N] [--no-bandwidth]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import models as M  # noqa: E402
from common import ROOT, blas_info, emit  # noqa: E402

OPT = {"W1": ("SGD", dict(lr=0.01, momentum=0.9)),
       "W3": ("AdamW", dict(lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01))}
BATCH = {"W1": 128, "W3": M.W3["batch"]}
BUCKET_MB = 2.0     # W1 has 2.5 MB of gradients, W3 7.1 MB: several buckets to overlap
ONE_THREAD = {k: "1" for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                               "NUMBA_NUM_THREADS")}


def _inputs(wl):
    if wl == "W1":
        return M.w1_weights, M.w1_batch, M.w1_forward, ()
    mask = np.tril(np.ones((M.W3["seq"],) * 2, bool))
    return M.w3_weights, M.w3_batch, M.w3_forward, (mask,)


# ------------------------------------------------------------------------ workers
def sampan_worker(wls, steps, reps):
    import sampan.distributed as dist
    n = 1
    if "PMI_RANK" in os.environ or "PMI_SIZE" in os.environ:
        dist.init("mpi")
        n = dist.world_size()
    for wl in wls:
        _sampan_one(wl, steps[wl], reps, n)
    if n > 1 and os.environ.get("DP_BANDWIDTH") == "1" and \
            os.path.exists(os.path.join(HERE, "allreduce.py")):
        import allreduce     # dist-comm's: 1-64 MB vs raw mpi4py, JSON lines from rank 0
        allreduce.sampan_allreduce_bandwidth(quick=reps < 5)
    if n > 1:
        dist.destroy()


def _sampan_one(wl, steps, reps, n):
    import sampan
    import sampan.distributed as dist
    from sampan import nn
    from sampan.distributed.data_parallel import DataParallel
    weights, batch, fwd, extra = _inputs(wl)
    F = M.SampanF()

    class Model(nn.Layer):
        def __init__(self):
            super().__init__()
            self.keys = list(weights())
            for k, v in weights().items():
                self.register_parameter(k.replace(".", "_"), nn.Parameter(sampan.tensor(v)))

        def forward(self, x, *extra):
            p = {k: getattr(self, k.replace(".", "_")) for k in self.keys}
            return fwd(F, p, x, *extra)

    model = Model()
    dp = DataParallel(model, bucket_mb=BUCKET_MB) if n > 1 else model
    x, y = batch()
    x, y = sampan.tensor(x), sampan.tensor(y)
    ext = tuple(sampan.tensor(e) for e in extra)
    name, kw = OPT[wl]
    opt = getattr(sampan.optim, name)(model.parameters(), **kw)
    exposed = []

    def step():
        opt.zero_grad()
        F.ce(dp(x, *ext), y).backward()
        opt.step()
        if n > 1:
            exposed.append(dp.last_timing["exposed_comm_s"])

    out = _time(step, steps, reps, barrier=dist.barrier if n > 1 else None)
    if n > 1:
        # the same buckets all-reduced back to back, blocking: the communication a step does
        bufs = [np.ones(b.size, b.dtype) for b in dp.buckets]
        for a in bufs:
            dist.all_reduce(a, op="mean")
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(5):
            for a in bufs:
                dist.all_reduce(a, op="mean")
        comm = (time.perf_counter() - t0) / 5
        out.update(comm_s=comm, exposed_s=float(np.median(exposed)),
                   buckets=len(dp.buckets), grad_mb=sum(b.nbytes() for b in dp.buckets) / 2**20)
    out.update(ranks=n, workload=wl, **blas_info())
    if n == 1 or dist.rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)


def torch_worker(wls, steps, reps):
    import torch
    torch.set_num_threads(1)
    n = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if n > 1:
        import torch.distributed as tdist
        tdist.init_process_group("gloo", init_method=os.environ["INIT"], rank=rank,
                                 world_size=n)
    for wl in wls:
        _torch_one(wl, steps[wl], reps, n, rank)
    if n > 1:
        tdist.destroy_process_group()


def _torch_one(wl, steps, reps, n, rank):
    import torch
    import torch.distributed as tdist
    weights, batch, fwd, extra = _inputs(wl)
    F = M.TorchF()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.keys = list(weights())
            self.p = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(
                torch.tensor(v)) for k, v in weights().items()})

        def forward(self, x, *extra):
            return fwd(F, {k: self.p[k.replace(".", "_")] for k in self.keys}, x, *extra)

    model = Model()
    net = torch.nn.parallel.DistributedDataParallel(model) if n > 1 else model
    x, y = batch()
    x, y = torch.tensor(x), torch.tensor(y)
    ext = tuple(torch.tensor(e) for e in extra)
    name, kw = OPT[wl]
    opt = getattr(torch.optim, name)(model.parameters(), **kw)

    def step():
        opt.zero_grad()
        F.ce(net(x, *ext), y).backward()
        opt.step()

    out = _time(step, steps, reps, barrier=(lambda: tdist.barrier()) if n > 1 else None)
    out.update(ranks=n, workload=wl, **blas_info())
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def _time(step, steps, reps, barrier=None):
    for _ in range(2):
        step()
    rates = []
    for _ in range(reps):
        if barrier is not None:
            barrier()
        t = time.perf_counter()
        for _ in range(steps):
            step()
        rates.append(steps / (time.perf_counter() - t))
    return {"steps_per_s": rates}


# ------------------------------------------------------------------------ driver
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    env = dict(os.environ, **ONE_THREAD)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _result(procs, timeout=600):
    got, logs = {}, []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        logs.append(out)
        if p.returncode != 0:
            raise RuntimeError(f"worker failed ({p.returncode}):\n{out[-3000:]}")
        for line in out.splitlines():
            if line.startswith("{"):          # a benchmark line printed by the worker
                print(line, flush=True)
            if line.startswith("RESULT "):
                r = json.loads(line[7:])
                got[r["workload"]] = r
    if not got:
        raise RuntimeError("no RESULT line:\n" + "\n".join(logs)[-3000:])
    return got


def run(system, wls, n, steps, reps, env=()):
    """Results by workload of one job: `system` on `n` ranks running every workload."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", system, *wls,
           "--steps", json.dumps(steps), "--reps", str(reps)]
    kw = dict(env=dict(_env(), **dict(env)), stdout=subprocess.PIPE,
              stderr=subprocess.STDOUT, text=True)
    if system == "sampan":
        if n > 1:
            cmd = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(n)] + cmd
        return _result([subprocess.Popen(cmd, **kw)])
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen(cmd, **dict(kw, env=dict(kw["env"], RANK=str(r),
                                                        WORLD_SIZE=str(n), INIT=init)))
             for r in range(n)]
    return _result(procs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("workloads", nargs="*", default=["W1", "W3"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--steps", default=None, help="JSON {workload: steps per rep}")
    ap.add_argument("--worker", default=None)
    ap.add_argument("--no-bandwidth", dest="bandwidth", action="store_false",
                    help="skip dist-comm's all-reduce bandwidth lines")
    a = ap.parse_args()
    steps = {wl: ({"W1": 10, "W3": 2} if a.quick else {"W1": 30, "W3": 5})[wl]
             for wl in a.workloads}
    steps.update(json.loads(a.steps) if a.steps else {})
    reps = a.reps or (3 if a.quick else 5)
    if a.worker:
        fn = sampan_worker if a.worker == "sampan" else torch_worker
        return fn(a.workloads, steps, reps)
    res = {}
    for system in ("sampan", "torch"):     # one job per system and rank count
        for n in (1, 2):
            env = {"DP_BANDWIDTH": "1"} if (system, n) == ("sampan", 2) and a.bandwidth else {}
            for wl, r in run(system, a.workloads, n, steps, reps, env).items():
                res[wl, system, n] = r
    for wl in a.workloads:
        report(wl, {(s, n): r for (w, s, n), r in res.items() if w == wl})


def report(wl, res):
    b = BATCH[wl]
    info = dict(threads_per_rank=1, note="noisy shared 2-core machine: compare ratios "
                "within this run only")
    sps = {k: [s * b * k[1] for s in v["steps_per_s"]] for k, v in res.items()}
    for (system, n), v in sps.items():
        blas = {k: res[system, n].get(k) for k in ("blas", "blas_kernel", "blas_threads")}
        emit(wl, system, f"{n}rank", "samples_per_s", v, ranks=n, **blas, **info)
    med = {k: float(np.median(v)) for k, v in sps.items()}
    target = 0.9 if wl == "W3" else 0.8
    for system in ("sampan", "torch"):
        eff = med[system, 2] / (2 * med[system, 1])
        emit(wl, system, "2rank", "scaling_efficiency", [eff], target=target,
             met=eff >= target, **info)
    ratio = med["sampan", 2] / med["torch", 2]
    emit(wl, "sampan", "2rank", "vs_torch_ddp", [ratio], target=1.0, met=ratio >= 1.0,
         **info)
    d = res["sampan", 2]
    frac = d["exposed_s"] / d["comm_s"]
    emit(wl, "sampan", "2rank", "exposed_comm_fraction", [frac], target=0.2, met=frac < 0.2,
         exposed_ms=round(d["exposed_s"] * 1e3, 3), comm_ms=round(d["comm_s"] * 1e3, 3),
         buckets=d["buckets"], grad_mb=round(d["grad_mb"], 2), **info)


if __name__ == "__main__":
    main()
