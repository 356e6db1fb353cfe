"""The advisor's rules for time spent waiting on other parties: the embedding hot cache
and parameter-server pulls (sampan.rec), and collectives waited for instead of overlapped
(sampan.distributed). `advisor` re-exports them and their thresholds."""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ._advice import _WORK, Finding, _by_tid, _merged, _ms, _rule, _union_ns, _View

# embedding caches and parameter-server pulls
REC_MISS_RATE = 0.5
REC_MIN_LOOKUPS = 256
REC_WAIT_SHARE = 0.20


# ------------------------------------------------------------------------ rec / PS
@_rule
def embedding_cache_misses(v: _View):
    """The embedding hot cache misses most lookups."""
    cache = [e for e in v.by_cat["rec"] if e.name == "cache"]
    hits = sum(int(e.args.get("hits", 0)) for e in cache)
    misses = sum(int(e.args.get("misses", 0)) for e in cache)
    n = hits + misses
    if n < REC_MIN_LOOKUPS or misses / n < REC_MISS_RATE:
        return []
    pull_ns = _union_ns([(e.ts, e.end) for e in v.by_cat["rec"] if e.name == "pull"])
    ev = {"lookups": n, "hits": hits, "misses": misses, "miss_rate": round(misses / n, 3),
          "batches": len(cache), "pull_ms": _ms(pull_ns)}
    return [Finding(
        "embedding_cache_misses", f"the embedding hot cache misses {misses / n:.0%} of "
                                  f"{n} lookups", ev,
        "raise the hot-cache budget (rows kept in memory next to the model) to cover the "
        "working set of hot ids; admission that keeps one-off ids out helps it hold them",
        share=min(pull_ns / v.wall_ns, 1.0))]


@_rule
def ps_pull_wait(v: _View):
    """Training waits on parameter-server pulls (synchronous, or prefetch not keeping up)."""
    rec = v.by_cat["rec"]
    waits = [e for e in rec if e.name == "prefetch_wait"]
    pulls = [e for e in rec if e.name == "pull"]
    # time the training side is blocked: prefetch waits, and pulls on threads that train
    work_tids = {e.tid for e in v.events if e.cat in _WORK}
    blocking = waits + [e for e in pulls if e.tid in work_tids]
    ns = _union_ns([(e.ts, e.end) for e in blocking])
    share = ns / v.wall_ns
    if not blocking or share < REC_WAIT_SHARE:
        return []
    ev = {"blocked_ms": _ms(ns), "share": round(share, 3), "pulls": len(pulls),
          "prefetch_waits": len(waits),
          "mean_pull_ms": round(float(np.mean([e.dur for e in pulls])) / 1e6, 3)
          if pulls else 0.0}
    if waits:
        fix = ("the prefetcher does not hide the pulls: the step is shorter than a pull; "
               "raise the hot-cache budget so fewer ids go to the shards, add shards, or "
               "pipeline deeper")
        title = f"the step waits on the embedding prefetcher {share:.0%} of the time"
    else:
        fix = ("pulls run synchronously on the training thread: wrap the batches in "
               "sampan.rec.Prefetcher so batch t+1 is pulled while step t trains, and "
               "raise the hot-cache budget")
        title = f"parameter-server pulls block the step {share:.0%} of the time"
    return [Finding("ps_pull_wait", title, ev, fix, share=ev["share"])]


# ------------------------------------------------------------------ exposed communication
EXPOSED_COMM_SHARE = 0.20      # of the collectives' time, spent blocked in wait()
EXPOSED_MIN_WALL_SHARE = 0.02  # of the profiled time: a rare short wait stays silent
EXPOSED_MIN_COLLECTIVES = 2


def _walk_of(t, merged):
    return next(((a, b) for a, b in merged if a <= t <= b), None)


@_rule
def exposed_communication(v: _View):
    """Collectives (gradient reductions) are waited for instead of overlapping backward.
    Read from one process's trace: a wait for a slower rank to arrive counts too."""
    coll = v.by_cat["collective"]
    spans = [e for e in coll if e.name != "wait"]
    waits = [e for e in coll if e.name == "wait"]
    if len(spans) < EXPOSED_MIN_COLLECTIVES or not waits:
        return []
    walks = defaultdict(list)
    for e in v.by_cat["backward"]:
        if e.name == "backward":       # one span around each whole backward walk
            walks[e.tid].append((e.ts, e.end))
    total_ns = exposed_ns = early = early_done = 0
    for tid, mine in _by_tid(spans).items():       # per thread: one rank's trainer
        total_ns += _union_ns([(e.ts, e.end) for e in mine])
        exposed_ns += _union_ns([(e.ts, e.end) for e in waits if e.tid == tid])
        bw = _merged(walks.get(tid, []))
        for e in mine:      # started with a quarter or more of its backward still to run
            w = _walk_of(e.ts, bw)
            if w is not None and w[1] - e.ts >= (w[1] - w[0]) / 4:
                early += 1
                early_done += e.end <= w[1]
    share = exposed_ns / max(total_ns, 1)
    if share < EXPOSED_COMM_SHARE or exposed_ns / v.wall_ns < EXPOSED_MIN_WALL_SHARE:
        return []
    ev = {"exposed_ms": _ms(exposed_ns), "collective_ms": _ms(total_ns),
          "exposed_share": round(share, 3), "wall_share": round(exposed_ns / v.wall_ns, 3),
          "collectives": len(spans), "waits": len(waits), "started_early": early,
          "done_during_backward": early_done,
          "largest_wait_ms": _ms(max(e.dur for e in waits))}
    if early and not early_done:
        fix = ("reductions started early in backward still finish only after it: MPI moves "
               "a nonblocking collective's bytes only inside MPI calls, so test the ones in "
               "flight between the ops of backward (DataParallel does) rather than only "
               "when waiting for them")
    else:
        fix = ("the gradients ready last are reduced after backward: bucket gradients in "
               "the order they become ready (DataParallel rebuilds its buckets so after "
               "its first step), keep the final bucket small (bucket_mb, LAST_BUCKET_MB) "
               "and start each bucket as soon as it is full; a wait seen on one rank only "
               "is a slower peer arriving (compare both ranks' traces)")
    return [Finding("exposed_communication",
                    f"{share:.0%} of the collectives' time is waited for, not overlapped",
                    ev, fix, share=min(exposed_ns / v.wall_ns, 1.0))]
