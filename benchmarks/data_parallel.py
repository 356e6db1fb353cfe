"""D1: data-parallel scaling of W1 (MLP) and W3 (small GPT) training (WORKLOADS.md).

Each rank trains on the workload's batch (weak scaling: a 2-rank step takes 2x the
samples), one BLAS thread per rank. One 2-rank job per system (sampan: `mpiexec -n 2`,
eager `DataParallel`; torch: DDP, gloo, init_method tcp://127.0.0.1:port); inside it each
repetition times rank 0 alone on plain steps (1 rank x 1 thread, rank 1 asleep), then
both ranks on data-parallel steps, so a pair sees the same machine load. Lines:
samples/s of each; scaling efficiency = samples/s(2 ranks) / (2 x samples/s(1 rank)),
per pair (and its ceiling: both ranks running plain steps at once, no communication, last
in each repetition); sampan DP / torch DDP (jobs alternated, paired by round); exposed
communication over the total communication time, per rank, from DataParallel's
timestamps (`last_timing`, perf_counter = CLOCK_MONOTONIC, one clock for the ranks of a
host): exposed = the time from the LAST rank's end of backward to this rank's reductions
being done, i.e. the communication still running once every rank has finished computing
(a rank's wait before that is for a slower peer to arrive, reported apart as skew); total =
the same buckets all-reduced back to back, blocking, after a barrier (median of 20). The
line's value is the larger of the two ranks' median fractions (`p10_per_rank`: the same
from the 10th percentiles of both, the machine's undisturbed moments). The 2-rank sampan job
then prints the all-reduce bandwidth lines of dist-comm's
`benchmarks/allreduce.py: sampan_allreduce_bandwidth` (1-64 MB against raw mpi4py), when
that file exists (`--no-bandwidth` skips them).
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
    dist.init("mpi")
    for wl in wls:
        _sampan_one(wl, steps[wl], reps)
    if os.environ.get("DP_BANDWIDTH") == "1" and \
            os.path.exists(os.path.join(HERE, "allreduce.py")):
        import allreduce     # dist-comm's: 1-64 MB vs raw mpi4py, JSON lines from rank 0
        allreduce.sampan_allreduce_bandwidth(quick=reps < 5)
    dist.destroy()


def _sampan_one(wl, steps, reps):
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

    x, y = batch()
    x, y = sampan.tensor(x), sampan.tensor(y)
    ext = tuple(sampan.tensor(e) for e in extra)
    name, kw = OPT[wl]
    stamps = []         # (backward_end_t, reduced_t, own wait) of each data-parallel step

    def make(parallel):
        model = Model()           # the solo model has no DataParallel hooks on it
        net = DataParallel(model, bucket_mb=BUCKET_MB) if parallel else model
        opt = getattr(sampan.optim, name)(model.parameters(), **kw)

        def step():
            opt.zero_grad()
            F.ce(net(x, *ext), y).backward()
            opt.step()
            if parallel:
                t = net.last_timing
                stamps.append((t["backward_end_t"], t["reduced_t"], t["exposed_comm_s"]))
        return step, net

    solo, _ = make(False)
    step, dp = make(True)
    out = _time_paired(solo, step, steps, reps, dist.rank(), dist.barrier)
    # the same buckets all-reduced back to back, blocking: the communication of one step
    bufs = [np.ones(b.size, b.dtype) for b in dp.buckets]
    for a in bufs:
        dist.all_reduce(a, op="mean")
    comm = []
    for _ in range(20):
        dist.barrier()
        t0 = time.perf_counter()
        for a in bufs:
            dist.all_reduce(a, op="mean")
        comm.append(time.perf_counter() - t0)
    # the median, as the exposed time's; the 10th percentiles of both too (other work on
    # this shared machine lengthens both, unevenly)
    out.update(comm_s=float(np.median(comm)), comm_p10_s=float(np.percentile(comm, 10)),
               **_exposed(stamps[2:]),
               buckets=len(dp.buckets), grad_mb=sum(b.nbytes() for b in dp.buckets) / 2**20,
               workload=wl, **blas_info())
    if dist.rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)


def _exposed(stamps):
    """Per rank, the median over steps of: exposed = reduced_t - max over ranks of
    backward_end_t (>= 0), skew = that max - this rank's backward_end_t, and the plain
    wait after this rank's own backward (exposed + the part of skew spent waiting)."""
    import sampan.distributed as dist
    mine = np.asarray(stamps, np.float64)
    every = np.stack(dist.all_gather(mine))             # (ranks, steps, 3)
    last_end = every[:, :, 0].max(axis=0)
    exposed = np.maximum(every[:, :, 1] - last_end, 0.0)
    skew = last_end - every[:, :, 0]
    med = lambda a: [float(v) for v in np.median(a, axis=1)]  # noqa: E731
    return {"exposed_s": med(exposed), "skew_s": med(skew), "wait_s": med(every[:, :, 2]),
            "exposed_p10_s": [float(v) for v in np.percentile(exposed, 10, axis=1)]}


def torch_worker(wls, steps, reps):
    import torch
    import torch.distributed as tdist
    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=os.environ["INIT"],
                             rank=int(os.environ["RANK"]), world_size=2)
    for wl in wls:
        _torch_one(wl, steps[wl], reps, tdist.get_rank())
    tdist.destroy_process_group()


def _torch_one(wl, steps, reps, rank):
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

    x, y = batch()
    x, y = torch.tensor(x), torch.tensor(y)
    ext = tuple(torch.tensor(e) for e in extra)
    name, kw = OPT[wl]

    def make(parallel):
        model = Model()
        net = torch.nn.parallel.DistributedDataParallel(model) if parallel else model
        opt = getattr(torch.optim, name)(model.parameters(), **kw)

        def step():
            opt.zero_grad()
            F.ce(net(x, *ext), y).backward()
            opt.step()
        return step

    out = _time_paired(make(False), make(True), steps, reps, rank, tdist.barrier)
    out.update(workload=wl, **blas_info())
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


def _time_paired(solo, step, steps, reps, rank, barrier):
    """Per repetition, in the same 2-rank job: rank 0 alone runs `steps` plain steps (1
    rank x 1 thread; rank 1 sleeps meanwhile), then both run `steps` data-parallel steps.
    Drift of a shared machine falls on both halves of a pair."""
    import tempfile
    flag = os.path.join(tempfile.gettempdir(), f"sampan-dp-bench-{os.environ['DP_RUN']}")
    solo()      # every rank: the last phase of a repetition runs it on both
    solo()
    for _ in range(2):
        step()
    solo_rates, rates, solo_each, each, both = [], [], [], [], []
    load = os.getloadavg()[0]

    def timed(fn, out):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    for i in range(reps):
        if rank == 0:
            t = time.perf_counter()
            for _ in range(steps):
                timed(solo, solo_each)
            solo_rates.append(steps / (time.perf_counter() - t))
            open(f"{flag}-{i}", "w").close()
        else:                           # sleep, not spin: the other core stays free
            while not os.path.exists(f"{flag}-{i}"):
                time.sleep(0.002)
        barrier()
        if rank == 0:
            os.remove(f"{flag}-{i}")
        t = time.perf_counter()
        for _ in range(steps):
            timed(step, each)
        rates.append(steps / (time.perf_counter() - t))
        barrier()
        t = time.perf_counter()         # both ranks, plain steps, no communication
        for _ in range(steps):
            solo()
        both.append(steps / (time.perf_counter() - t))
        barrier()
    return {"steps_per_s": rates, "solo_steps_per_s": solo_rates, "step_s": each,
            "solo_step_s": solo_each, "both_solo_steps_per_s": both,
            "load_1m": [load, os.getloadavg()[0]]}


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


def run(system, wls, steps, reps, env=()):
    """Results by workload of one 2-rank job of `system` running every workload."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", system, *wls,
           "--steps", json.dumps(steps), "--reps", str(reps)]
    env = dict(_env(), DP_RUN=f"{os.getpid()}-{time.monotonic_ns()}", **dict(env))
    kw = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if system == "sampan":
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        return _result([subprocess.Popen([mpiexec, "-n", "2"] + cmd, env=env, **kw)])
    init = f"tcp://127.0.0.1:{_free_port()}"
    return _result([subprocess.Popen(cmd, env=dict(env, RANK=str(r), INIT=init), **kw)
                    for r in range(2)])


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
    steps = {wl: ({"W1": 10, "W3": 2} if a.quick else {"W1": 30, "W3": 4})[wl]
             for wl in a.workloads}
    steps.update(json.loads(a.steps) if a.steps else {})
    reps = a.reps or (3 if a.quick else 5)
    if a.worker:
        fn = sampan_worker if a.worker == "sampan" else torch_worker
        return fn(a.workloads, steps, reps)
    rounds = 1 if a.quick else 2          # sampan, torch, sampan, torch: paired by round
    res = {}
    for k in range(rounds):
        for system in ("sampan", "torch"):
            env = {"DP_BANDWIDTH": "1"} if system == "sampan" and k == 0 and a.bandwidth \
                else {}
            for wl, r in run(system, a.workloads, steps, reps, env).items():
                res.setdefault((wl, system), []).append(r)
    for wl in a.workloads:
        report(wl, res[wl, "sampan"], res[wl, "torch"])


def report(wl, ours, theirs):
    b = BATCH[wl]
    info = dict(threads_per_rank=1, note="noisy shared 2-core machine: ratios are paired "
                "within one job (efficiency) or one round (vs DDP)")
    target = 0.9 if wl == "W3" else 0.8
    for system, runs in (("sampan", ours), ("torch", theirs)):
        blas = {k: runs[0].get(k) for k in ("blas", "blas_kernel", "blas_threads")}
        solo = [s * b for r in runs for s in r["solo_steps_per_s"]]
        dp = [s * 2 * b for r in runs for s in r["steps_per_s"]]
        emit(wl, system, "1rank", "samples_per_s", solo, ranks=1, **blas, **info)
        emit(wl, system, "2rank", "samples_per_s", dp, ranks=2, **blas, **info)
        eff = [d / s for r in runs for d, s in zip(r["steps_per_s"], r["solo_steps_per_s"])]
        emit(wl, system, "2rank", "scaling_efficiency", eff, target=target,
             met=float(np.median(eff)) >= target,
             load_1m=[round(v, 2) for r in runs for v in r["load_1m"]], **info)
        # the same ratio from the 10th percentile of single step times (pooled over the
        # job): what the machine gives in its undisturbed moments, when other work on
        # this shared machine makes the repetitions' medians swing (the line above is
        # the figure the target is judged on)
        p10 = [float(np.percentile(r["solo_step_s"], 10) / np.percentile(r["step_s"], 10))
               for r in runs]
        emit(wl, system, "2rank", "scaling_efficiency_p10", p10, target=target,
             steps=[len(r["step_s"]) for r in runs], **info)
        # both ranks running plain steps at once, no communication, against one alone:
        # what two ranks can reach on this machine as loaded now (caches, memory, the
        # other work on it), whatever data parallelism does
        ceil = [b / s for r in runs
                for b, s in zip(r["both_solo_steps_per_s"], r["solo_steps_per_s"])]
        emit(wl, system, "2rank", "scaling_ceiling", ceil, **info)
    ratio = [float(np.median(o["steps_per_s"]) / np.median(t["steps_per_s"]))
             for o, t in zip(ours, theirs)]
    emit(wl, "sampan", "2rank", "vs_torch_ddp", ratio, target=1.0,
         met=float(np.median(ratio)) >= 1.0, **info)
    ms = lambda key: [[round(v * 1e3, 3) for v in r[key]] for r in ours]  # noqa: E731
    per_rank = [[e / r["comm_s"] for e in r["exposed_s"]] for r in ours]
    frac = [max(f) for f in per_rank]
    emit(wl, "sampan", "2rank", "exposed_comm_fraction", frac, target=0.2,
         met=float(np.median(frac)) < 0.2,
         per_rank=[[round(v, 3) for v in f] for f in per_rank],
         exposed_ms=ms("exposed_s"), skew_ms=ms("skew_s"), wait_ms=ms("wait_s"),
         comm_ms=round(float(np.median([r["comm_s"] for r in ours])) * 1e3, 3),
         p10_per_rank=[[round(e / r["comm_p10_s"], 3) for e in r["exposed_p10_s"]]
                       for r in ours],
         measure="exposed = reduced_t - last rank's backward_end_t, per rank",
         buckets=ours[0]["buckets"], grad_mb=round(ours[0]["grad_mb"], 2), **info)


if __name__ == "__main__":
    main()
