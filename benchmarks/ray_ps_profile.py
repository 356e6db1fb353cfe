"""Where W4's time goes with Ray shard actors (issue 24): the trainer's rec spans, the
actors' own CPU per call, and every process's CPU on the machine, against the in-process
2-shard backend in the same run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/ray_ps_profile.py
    ... --steps 123 --blocks 6 --batch 1024 --staleness 1 [--profile]

The backends train block by block in turn (order rotating), so a shared machine's load
falls on both. Prints one JSON line per backend: samples/s and ms per step, the time the
trainer waited for prefetched batches, the shard actors' thread CPU per call kind (pull,
push, snapshot capture and write) and their whole processes' CPU, and CPU ms per step of
every busy process on the machine and of each trainer thread, so the 2 cores' budget can
be read off; with ``--profile``, ms per step of each rec span (pull, push, split,
prefetch_wait) on each trainer thread, from sampan's profiler.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time

from common import blas_info, emit
from w4_ctr import sampan_model

import sampan
from sampan.rec.data import ClickStream
from sampan.rec.models import train_step
from sampan.rec.remote import init_ray, require_ray
from sampan.rec.sharded import Prefetcher


def _cpu_snapshot(psutil):
    """CPU seconds of every process (and of this process's threads)."""
    procs = {}
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            t = p.cpu_times()
            name = " ".join(p.info["cmdline"] or [p.info["name"] or "?"])[:40].strip()
            procs[p.pid] = (name, t.user + t.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    me = psutil.Process()
    threads = {t.id: t.user_time + t.system_time for t in me.threads()}
    return procs, threads


def _thread_names(attr="native_id"):
    import threading
    return {getattr(t, attr): t.name for t in threading.enumerate()}


class Runner:
    """One backend's W4 prefetch loop, run block by block; CPU counted over its blocks."""

    def __init__(self, backend, staleness, batches, weights, profile, psutil):
        self.name = backend
        self.backend, self.batches, self.psutil, self.profile = backend, batches, psutil, \
            profile
        self.m, self.opt = sampan_model(weights, 2, backend, staleness)
        self.emb = self.m.embedding.emb
        # a batch more than it trains on keeps the prefetch thread alive (and counted)
        self.pf = Prefetcher(self.emb, batches + batches[:2], ids_of=lambda b: b.ids_matrix())
        self.it = iter(self.pf)
        self.i, self.steps, self.wall, self.wait = 0, 0, 0.0, 0.0
        self.procs, self.threads = collections.Counter(), collections.Counter()
        self.pnames: dict = {}
        self.actor_cpu = collections.defaultdict(lambda: [0, 0.0])
        self.actor_proc = 0.0
        self.spans = collections.Counter()
        self.block(3, count=False)  # warm-up

    def _step(self):
        b = self.batches[self.i]
        train_step(self.m, self.opt, b.ids_matrix(), b.dense, b.labels, pulled=next(self.it))
        self.pf.done()
        self.i += 1

    def block(self, n, count=True):
        ray = self.backend == "ray"
        if ray:
            self.emb.flush()
            a0 = self.emb.info()
        procs0, thr0 = _cpu_snapshot(self.psutil)
        wait0 = self.pf.wait_seconds
        prof = None
        if count and self.profile:
            prof = sampan.profiler.profile(record_shapes=False, profile_memory=False)
            prof.__enter__()
        t0 = time.perf_counter()
        for _ in range(n):
            self._step()
        if ray:
            self.emb.flush()
        wall = time.perf_counter() - t0
        if prof:
            prof.__exit__(None, None, None)
        if not count:
            return
        procs1, thr1 = _cpu_snapshot(self.psutil)
        self.steps += n
        self.wall += wall
        self.wait += self.pf.wait_seconds - wait0
        for pid, (name, c) in procs1.items():
            self.procs[pid] += c - procs0.get(pid, (name, 0.0))[1]
            self.pnames.setdefault(pid, f"{pid} {name}")
        names = _thread_names()
        for tid, c in thr1.items():
            self.threads[names.get(tid, "ray/other")] += c - thr0.get(tid, 0.0)
        if ray:
            for a, b0 in zip(self.emb.info(), a0):
                for k, (calls, sec) in a["cpu"].items():
                    c0, s0 = b0["cpu"].get(k, (0, 0.0))
                    self.actor_cpu[k][0] += calls - c0
                    self.actor_cpu[k][1] += sec - s0
                self.actor_proc += a["process_cpu"] - b0["process_cpu"]
        if prof:
            idents = _thread_names("ident")
            for ev in prof.events:
                if ev.cat == "rec" and ev.dur:
                    self.spans[f"{ev.name}@{idents.get(ev.tid, ev.tid)}"] += ev.dur / 1e9

    def result(self):
        n = self.steps
        ms = lambda v: round(1e3 * v / n, 2)  # noqa: E731
        out = {"backend": self.name, "samples_per_s": round(
            n * len(self.batches[0]) / self.wall, 1), "ms_per_step": ms(self.wall),
            "prefetch_wait_ms": ms(self.wait)}
        if self.backend == "ray":
            out["actor_thread_ms_per_step"] = {k: ms(s) for k, (c, s) in self.actor_cpu.items()}
            out["actor_calls_per_step"] = {k: round(c / n, 2)
                                           for k, (c, s) in self.actor_cpu.items()}
            out["actor_process_ms_per_step"] = ms(self.actor_proc)
        out["process_cpu_ms_per_step"] = {self.pnames[k]: ms(v) for k, v in
                                          self.procs.most_common() if v > 0.02 * self.wall}
        out["total_cpu_ms_per_step"] = ms(sum(self.procs.values()))
        out["trainer_threads_cpu_ms_per_step"] = {k: ms(v) for k, v in
                                                  self.threads.most_common()}
        if self.spans:
            out["rec_span_ms_per_step"] = {k: ms(v) for k, v in sorted(self.spans.items())}
        return out

    def close(self):
        self.pf.close()
        self.emb.close()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--staleness", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="also record the rec spans")
    ap.add_argument("--backends", default="local,ray")
    ap.add_argument("--blocks", type=int, default=4)
    args = ap.parse_args(argv)
    import psutil
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    from w4_ctr import shared_weights
    ray = require_ray()
    init_ray(ray, num_cpus=2, object_store_memory=512 * 2**20)
    stream = ClickStream(seed=0)
    print(f"# generating {args.steps} batches", file=sys.stderr)
    batches = [stream.batch(i, args.batch) for i in range(args.steps)]
    weights = shared_weights()
    info = {"batch": args.batch, "steps": args.steps, **blas_info()}
    names = args.backends.split(",")
    runners = {b: Runner(b, args.staleness, batches, weights, args.profile, psutil)
               for b in names}
    per = max(1, (args.steps - 3) // args.blocks)
    for r in range(args.blocks):  # interleaved, order rotating: load falls on both alike
        for b in names[r % len(names):] + names[: r % len(names)]:
            runners[b].block(per)
    res = {}
    for b in names:
        res[b] = runners[b].result()
        runners[b].close()
        print(json.dumps({"workload": "W4", "profile": "ray_ps", **res[b]}), flush=True)
    if "ray" in res and "local" in res:
        emit("W4", "sampan_ray/sampan_local", "prefetch", "speed_ratio",
             [res["ray"]["samples_per_s"] / res["local"]["samples_per_s"]],
             max_staleness=args.staleness, **info)
    ray.shutdown()


if __name__ == "__main__":
    main()
