"""The advisor: read a profile, say what to change (`prof.advise()`).

Each rule looks for one known way a program wastes time, and reports it as a `Finding`
whose evidence is numbers read from the trace and whose fix is a concrete change. A rule
stays silent unless its evidence passes its thresholds (the named constants below), so a
reasonable program (a jitted step fed by a fast loader) gets no findings at all.

=====================  ==================================================================
rule                   fires when
=====================  ==================================================================
input_bound            the training thread spends >= INPUT_BOUND_SHARE of its time in the
                       loader (queue wait, or fetch/collate run inline), first batch aside
dispatch_bound         >= DISPATCH_MIN_OPS eager ops, most shorter than
                       DISPATCH_TINY_OP_US, and >= DISPATCH_OVERHEAD_SHARE of the eager
                       time outside ops that long (dispatch, Python between ops)
unfused_elementwise    a jitted program runs >= UNFUSED_MIN_CHAIN elementwise nodes in a
                       row, each reading the one before, as separate kernels
recompilation_storm    one jitted function compiled >= RECOMPILE_MIN times
gemm_below_peak        matmul/conv of one shape (one eager shape, or one jit node) takes
                       >= GEMM_MIN_SHARE of the time at < GEMM_PEAK_FRACTION of this
                       machine's measured sgemm rate in its best call; why: small calls,
                       float64, or starved BLAS threads (calls varying >= GEMM_JITTER x, or
                       a GEMM that is not small below GEMM_STARVED_FRACTION of peak)
embedding_cache_misses the embedding hot cache misses >= REC_MISS_RATE of
                       >= REC_MIN_LOOKUPS lookups
ps_pull_wait           pulls / prefetch waits take >= REC_WAIT_SHARE of the time
exposed_communication  threads block in collectives' wait() >= EXPOSED_COMM_SHARE of their
                       collectives' time and >= EXPOSED_MIN_WALL_SHARE of the run
=====================  ==================================================================

    >>> for f in prof.advise():
    ...     print(f)
"""
from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .machine import machine_peak_gflops

__all__ = ["RULES", "Finding", "advise", "machine_peak_gflops"]

# input_bound: share of the training thread's time in the loader (steady state)
INPUT_BOUND_SHARE = 0.20
INPUT_MIN_BATCHES = 3          # loader waits needed (after the first) before judging
# dispatch_bound: many short eager ops whose overhead dominates the eager time
DISPATCH_MIN_OPS = 200
DISPATCH_TINY_OP_US = 50.0
DISPATCH_TINY_FRACTION = 0.5   # of the ops must be tiny
DISPATCH_OVERHEAD_SHARE = 0.5
# unfused_elementwise: a chain of elementwise kernels this long, in one program call
UNFUSED_MIN_CHAIN = 3
# recompilation_storm: compiles of one function
RECOMPILE_MIN = 3
# gemm_below_peak
GEMM_PEAK_FRACTION = 0.10
GEMM_MIN_SHARE = 0.05          # of the profiled wall time, for one (op, shapes) group
GEMM_SMALL_DIM = 64            # a GEMM dimension below this is "too small"
GEMM_JITTER = 10.0             # median / best call time of one shape: threads contending
GEMM_STARVED_FRACTION = 0.01   # a GEMM that is not small this far below peak: starved
GEMM_OPS = ("matmul", "conv2d", "conv_transpose2d", "conv2d_grad_weight", "einsum")
# embedding caches and parameter-server pulls
REC_MISS_RATE = 0.5
REC_MIN_LOOKUPS = 256
REC_WAIT_SHARE = 0.20


@dataclass
class Finding:
    """One thing to change: `rule` (its name), a one-line `title`, the `evidence` (numbers
    read from the trace), the `fix` and the `share` of the profiled time at stake."""
    rule: str
    title: str
    evidence: dict = field(default_factory=dict)
    fix: str = ""
    share: float = 0.0     # of the profiled time at stake; `advise` lists the largest first

    def __str__(self):
        ev = ", ".join(f"{k}={_fmt(v)}" for k, v in self.evidence.items())
        return f"[{self.rule}] {self.title}\n  evidence: {ev}\n  fix: {self.fix}"


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


# ------------------------------------------------------------------------ the trace view
class _View:
    """The events of a profile, grouped the ways the rules read them."""

    def __init__(self, prof):
        evs = prof.events if hasattr(prof, "events") else list(prof)
        self.events = [e for e in evs if e.cat != "memory"]
        self.by_cat = defaultdict(list)
        self.by_tid = defaultdict(list)
        for e in self.events:
            self.by_cat[e.cat].append(e)
            self.by_tid[e.tid].append(e)
        wall = getattr(prof, "wall_ns", 0) or 0
        if self.events and wall <= 0:
            wall = max(e.end for e in self.events) - min(e.ts for e in self.events)
        self.wall_ns = max(int(wall), 1)


def _union_ns(spans) -> int:
    """Length of the union of (start, end) intervals."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _merged(spans) -> list:
    """Sorted, disjoint [start, end] intervals covering the (start, end) spans."""
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _sig(x, digits=4) -> float:
    return float(f"{x:.{digits}g}")


def _ms(ns) -> float:
    return round(ns / 1e6, 3)


RULES: list = []


def _rule(fn):
    RULES.append(fn)
    return fn


def advise(prof, rules=None) -> list:
    """Findings for a `Profile` (or a list of `Event`s), the most time at stake first.

    >>> findings = sampan.profiler.advisor.advise(prof)
    """
    view = _View(prof)
    out = []
    for rule in RULES if rules is None else rules:
        out.extend(rule(view))
    return sorted(out, key=lambda f: -f.share)


# ------------------------------------------------------------------------ input bound
_WORK = ("op", "kernel", "backward", "optim")


@_rule
def input_bound(v: _View):
    """The training thread waits on the loader (or loads inline) a large share of its time."""
    found = []
    for tid, evs in v.by_tid.items():
        data = [e for e in evs if e.cat == "data"]
        if not data:
            continue
        merged = _merged((e.ts, e.end) for e in data)   # collate sits inside fetch
        if not any(e.cat in _WORK and not _inside(e, merged) for e in evs):
            continue   # a worker thread (its ops index the dataset), or no training here
        if len(merged) < INPUT_MIN_BATCHES + 1:
            continue
        first, rest = merged[0], merged[1:]        # the first batch: workers starting up
        end = max(e.end for e in evs)
        window = end - first[1]
        loader = sum(e - s for s, e in rest)
        share = loader / max(window, 1)
        if share < INPUT_BOUND_SHARE:
            continue
        inline = any(e.name == "fetch" for e in data)
        workers = {e.tid for e in v.by_cat["data"] if e.name == "fetch" and e.tid != tid}
        fetches = [e.dur for e in v.by_cat["data"] if e.name == "fetch"]
        work = _union_ns([(e.ts, e.end) for e in evs if e.cat in _WORK and e.ts >= first[1]])
        step_ms = work / len(rest) / 1e6
        fetch_ms = float(np.mean(fetches)) / 1e6 if fetches else None
        ev = {"loader_share": round(share, 3), "loader_ms": _ms(loader),
              "window_ms": _ms(window), "batches": len(rest), "worker_threads": len(workers),
              "compute_ms_per_batch": round(step_ms, 3)}
        if fetch_ms is not None:
            ev["fetch_ms_per_batch"] = round(fetch_ms, 3)
        if inline:
            how = ("batches are loaded on the training thread (num_workers=0): "
                   "DataLoader(num_workers=N) loads them ahead while the step runs")
        else:
            need = max(int(np.ceil(fetch_ms / max(step_ms, 1e-3))) if fetch_ms else 0,
                       len(workers) + 1)
            how = (f"the {len(workers)} worker(s) cannot keep up (a batch takes "
                   f"{fetch_ms or 0:.3g} ms to load, a step {step_ms:.3g} ms): raise "
                   f"num_workers (about {need} keep up"
                   + (", more than this machine's cores: make loading cheaper first"
                      if need > (os.cpu_count() or 1) else "") + ") and prefetch_factor")
        found.append(Finding(
            "input_bound", f"input-bound: the step waits on the data loader "
                           f"{share:.0%} of the time", ev,
            how + "; move per-sample transforms out of __getitem__ into batch ops in the "
                  "compiled step (sampan.jit) or precompute them", share=min(loader /
                                                                           v.wall_ns, 1.0)))
    return found


def _inside(e, merged) -> bool:
    """Whether event `e` lies within one of the sorted [start, end] intervals."""
    for s, t in merged:
        if s <= e.ts and e.end <= t:
            return True
        if s > e.ts:
            break
    return False


# ------------------------------------------------------------------------ dispatch bound
@_rule
def dispatch_bound(v: _View):
    """Many tiny eager ops: per-op overhead, not arithmetic, takes the time."""
    # ops run by the loader's workers or inside the rec pipeline are not the step's
    stages = {tid: _merged((e.ts, e.end) for e in es if e.cat in ("data", "rec"))
              for tid, es in v.by_tid.items()}
    ops = [e for e in v.by_cat["op"] if not _inside(e, stages[e.tid])]
    if len(ops) < DISPATCH_MIN_OPS:
        return []
    tiny_ns = DISPATCH_TINY_OP_US * 1e3
    durs = np.array([e.dur for e in ops], dtype=np.float64)
    n_tiny = int((durs < tiny_ns).sum())
    if n_tiny < DISPATCH_TINY_FRACTION * len(ops):
        return []
    by_tid = defaultdict(list)
    for e in ops:
        by_tid[e.tid].append(e)
    window = busy_big = other = in_ops = 0
    for tid, es in by_tid.items():
        t0, t1 = min(e.ts for e in es), max(e.end for e in es)
        window += t1 - t0
        # long ops are useful arithmetic; time in other stages is not dispatch overhead
        busy_big += _union_ns([(e.ts, e.end) for e in es if e.dur >= tiny_ns])
        in_ops += _union_ns([(e.ts, e.end) for e in es])
        other += _union_ns([(max(e.ts, t0), min(e.end, t1)) for e in v.by_tid[tid]
                            if e.cat in ("data", "rec", "jit", "kernel", "collective")
                            and e.end > t0 and e.ts < t1])
    eager = max(window - other, 1)
    overhead = max(eager - busy_big, 0) / eager
    if overhead < DISPATCH_OVERHEAD_SHARE:
        return []
    ev = {"eager_ops": len(ops), "tiny_ops": n_tiny, "median_op_us": round(
        float(np.median(durs)) / 1e3, 2), "ops_per_ms": round(len(ops) / (eager / 1e6), 1),
        "overhead_share": round(overhead, 3), "eager_ms": _ms(eager),
        "python_gap_ms": _ms(max(eager - in_ops, 0))}
    return [Finding(
        "dispatch_bound", f"dispatch-bound eager code: {len(ops)} ops, median "
                          f"{ev['median_op_us']} us each; {overhead:.0%} of the eager time "
                          "is per-op overhead", ev,
        "wrap the training step (forward, backward and optimiser) in sampan.jit: it is "
        "traced once and runs as one compiled program with fused kernels, without "
        "per-op dispatch", share=min((eager - busy_big) / v.wall_ns, 1.0))]


# ------------------------------------------------------------------------ unfused chains
_VAL = re.compile(r"%(\w+)")


def _kernel_op(e):
    """(op name, output value ids, input value ids, output types) of a kernel event, read
    from its IR line ``%9: f32[8,64] = tanh(%5)  # model.py:3`` (the name alone without)."""
    ir = str(e.args.get("ir", "")).split("  #")[0]
    lhs, sep, rhs = ir.partition(" = ")
    m = re.match(r"\s*([A-Za-z_][\w.]*)\(", rhs) if sep else None
    if not m:
        return e.name, set(), set(), ""
    return m[1], set(_VAL.findall(lhs)), set(_VAL.findall(rhs)), lhs


@_rule
def unfused_elementwise(v: _View):
    """Elementwise nodes of a jitted program that run as separate kernels in a chain."""
    from ..ops.registry import OPS
    kernels = v.by_cat["kernel"]
    if not kernels:
        return []
    fused_progs = {e.args.get("program") for e in kernels
                   if _kernel_op(e)[0] == "fused" or e.name == "fused"}
    chains = defaultdict(lambda: {"count": 0, "ns": 0, "dtypes": set()})
    for es in _by_tid(kernels).values():
        run = []
        for e in es + [None]:
            info = None if e is None else _kernel_op(e)
            op = None if info is None else OPS.get(info[0])
            elementwise = op is not None and op.kind == "elementwise"
            linked = elementwise and run and e.args.get("program") == run[-1][0].args.get(
                "program")
            if linked and info[2] and run[-1][1][1]:     # IR known: it must read the chain
                linked = bool(info[2] & set().union(*(r[1][1] for r in run)))
            if elementwise and (not run or linked):
                run.append((e, info))
                continue
            if len(run) >= UNFUSED_MIN_CHAIN:
                key = (run[0][0].args.get("program"), tuple(r[1][0] for r in run))
                c = chains[key]
                c["count"] += 1
                c["ns"] += sum(r[0].dur for r in run)
                c["dtypes"].update(re.findall(r"\b(f64|f16|bf16|f32)\[", " ".join(
                    r[1][3] for r in run)))
                c["src"] = run[0][0].args.get("src", "")
            run = [(e, info)] if elementwise else []
    found = []
    for (prog, names), c in sorted(chains.items(), key=lambda kv: -kv[1]["ns"]):
        ev = {"program": prog, "chain": " -> ".join(names), "length": len(names),
              "occurrences": c["count"], "chain_ms": _ms(c["ns"]),
              "share": round(c["ns"] / v.wall_ns, 3)}
        if c.get("src"):
            ev["src"] = c["src"]
        if prog not in fused_progs:
            why = ("no fused kernel ran in this program: its pipeline lacks the "
                   "'fuse_elementwise' pass (sampan.jit(fn, pipeline=...) or "
                   "sampan.passes.set_pipeline) or numba is missing; run it")
        else:
            never = [n for n in names if not OPS[n].fuse]
            f32 = [n for n in names if OPS[n].fuse == "float32"]
            if never:
                why = (f"{', '.join(sorted(set(never)))} are not fusible (fuse='' in the op "
                       "table): give them a scalar form there")
            elif f32 and c["dtypes"] - {"f32", "bf16"}:
                why = (f"{', '.join(sorted(set(f32)))} fuse only in float32/bfloat16, the "
                       f"chain runs in {'/'.join(sorted(c['dtypes']))}: compute in float32")
            else:
                why = ("the fusion pass left them apart (shapes that broadcast differently, or "
                       "a value used outside the chain): run sampan.jit(fn, debug=True) to "
                       "see the pass's groups")
        found.append(Finding(
            "unfused_elementwise", f"{len(names)} elementwise kernels in a row in "
                                   f"{prog} run unfused ({c['count']}x)", ev, why,
            share=ev["share"]))
    return found


def _by_tid(events):
    d = defaultdict(list)
    for e in events:
        d[e.tid].append(e)
    for es in d.values():
        es.sort(key=lambda e: e.ts)
    return d


# ------------------------------------------------------------------------ recompilation
_SHAPE = re.compile(r"\[([\d, ]*)\]")


def _shapes(sig):
    """Per-argument shapes from a signature: a dict {name: "f32[3,4]"}, a list of shapes,
    or a string "x: f32[32,10], y: i64[32]". Returns [(name, shape tuple)]."""
    if isinstance(sig, dict):
        items = list(sig.items())
    elif isinstance(sig, (list, tuple)):
        if all(isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s)
               for s in sig):
            return [(f"arg{i}", tuple(s)) for i, s in enumerate(sig)]
        items = [(f"arg{i}", s) for i, s in enumerate(sig)]
    else:
        parts = re.findall(r"(?:(\w+)\s*[:=]\s*)?[a-z]+\d*\[([\d, ]*)\]", str(sig))
        return [(n or f"arg{i}", tuple(int(d) for d in s.split(",") if d.strip()))
                for i, (n, s) in enumerate(parts)]
    out = []
    for n, s in items:
        m = _SHAPE.search(str(s))
        if isinstance(s, (list, tuple)) and all(isinstance(d, int) for d in s):
            out.append((str(n), tuple(s)))
        elif m:
            out.append((str(n), tuple(int(d) for d in m[1].split(",") if d.strip())))
    return out


@_rule
def recompilation_storm(v: _View):
    """One jitted function compiled again and again for new signatures."""
    jit = v.by_cat["jit"]
    compiles = defaultdict(list)
    misses = defaultdict(int)
    for e in jit:
        fn = str(e.args.get("fn", "?"))
        if e.name == "compile":
            compiles[fn].append(e)
        elif e.name == "cache_miss":
            misses[fn] += 1
    found = []
    for fn, es in compiles.items():
        if len(es) < RECOMPILE_MIN:
            continue
        sigs = [_shapes(e.args.get("signature")) for e in es]
        varying = []
        if sigs and all(len(s) == len(sigs[0]) for s in sigs):
            for i, (name, shape) in enumerate(sigs[0]):
                if not all(len(s[i][1]) == len(shape) for s in sigs):
                    continue
                for d in range(len(shape)):
                    vals = sorted({s[i][1][d] for s in sigs})
                    if len(vals) > 1:
                        varying.append((name, d, vals))
        ev = {"fn": fn, "compiles": len(es), "cache_misses": misses.get(fn, len(es)),
              "compile_ms": _ms(sum(e.dur for e in es)),
              "compile_share": round(sum(e.dur for e in es) / v.wall_ns, 3)}
        if varying:
            ev["varying"] = "; ".join(f"{n} dim {d}: {vals[:6]}" for n, d, vals in varying)
            spec = ", ".join(f'"{n}": {{{d}: "n{k}"}}' for k, (n, d, _) in
                             enumerate(varying))
            short = fn.split(".")[-1]
            short = short if short.isidentifier() else "fn"
            fix = (f"mark the varying dim symbolic so one program serves every size: "
                   f"sampan.jit({short}, dynamic={{{spec}}}) (or pad to a few fixed sizes)")
        else:
            fix = ("the signature did not change in a shape: a Python value the trace reads "
                   "(a float hyperparameter, a flag) changes per call; pass it as a tensor")
        title = f"recompilation storm: {fn} was compiled {len(es)} times"
        if varying and len(varying) == 1:
            title += f", its signatures differing only in {varying[0][0]} dim {varying[0][1]}"
        found.append(Finding("recompilation_storm", title, ev, fix,
                             share=ev["compile_share"]))
    return found


# ------------------------------------------------------------------------ GEMMs vs peak
def _gemm_name(e):
    if e.cat == "op":
        return e.name
    if e.cat == "kernel":
        return _kernel_op(e)[0]
    return None


def _gemm_shapes(e):
    """(group key, shapes to show, the GEMM's dims) of one matmul/conv event. An eager op
    has its input shapes; a jit kernel its IR line, whose output type and FLOPs give M, N
    and the reduction K (one node of one program: the same shapes every call)."""
    if e.cat == "op":
        shapes = e.args.get("shapes") or []
        dims = [d for s in shapes[-2:] for d in s[-2:]]
        return str(shapes), shapes, dims
    ir = str(e.args.get("ir", "")).split("  #")[0]
    out = re.findall(r"\[([\d,]*)\]", ir.partition(" = ")[0])
    shape = [int(d) for d in out[0].split(",") if d] if out else []
    numel = int(np.prod(shape)) if shape else 1
    k = int(e.args["flops"]) // max(2 * numel, 1)
    label = f"out {shape}, K={k}"
    return (e.args.get("program"), ir), label, shape[-2:] + [k]


@_rule
def gemm_below_peak(v: _View):
    """matmul/conv groups taking real time at a small fraction of the machine's rate."""
    groups = {}
    for e in v.by_cat["op"] + v.by_cat["kernel"]:
        name = _gemm_name(e)
        if name not in GEMM_OPS or not e.args.get("flops"):
            continue
        key, shapes, dims = _gemm_shapes(e)
        g = groups.setdefault((name, key), {"calls": 0, "ns": 0, "flops": 0, "shapes": shapes,
                                            "dims": dims, "dtypes": e.args.get("dtypes"),
                                            "durs": []})
        g["calls"] += 1
        g["ns"] += e.dur
        g["flops"] += int(e.args["flops"])
        g["durs"].append(e.dur)
    cands = [(k, g) for k, g in groups.items() if g["ns"] >= GEMM_MIN_SHARE * v.wall_ns]
    if not cands:
        return []
    peak = machine_peak_gflops()
    found = []
    for (name, _), g in sorted(cands, key=lambda kv: -kv[1]["ns"]):
        calls, ns, fl, dims = g["calls"], g["ns"], g["flops"], g["dims"]
        per_call = fl / calls
        rate = fl / max(ns, 1)      # flops per ns = GFLOP/s
        # judged by the best call: a GEMM slowed only by a busy machine is fast sometimes,
        # one that is small or badly laid out is slow every time
        best = per_call / max(min(g["durs"]), 1)
        frac = best / peak
        if frac >= GEMM_PEAK_FRACTION:
            continue
        jitter = float(np.median(g["durs"])) / max(min(g["durs"]), 1)
        ev = {"op": name, "shapes": g["shapes"], "calls": calls,
              "achieved_gflops": _sig(rate), "best_call_gflops": _sig(best),
              "peak_gflops": round(peak, 1), "fraction_of_peak": _sig(frac),
              "time_ms": _ms(ns), "share": round(ns / v.wall_ns, 3),
              "median_over_best": _sig(jitter, 3)}
        if g["dtypes"]:
            ev["dtypes"] = g["dtypes"]
        reasons = []
        if (dims and min(dims) < GEMM_SMALL_DIM) or per_call < 2 * GEMM_SMALL_DIM ** 3:
            reasons.append(f"each call is small ({per_call / 1e6:.3g} MFLOP), so per-call "
                           "overhead and thin loops dominate: give each call more work "
                           "(larger batches; stack many small products into one batched "
                           "matmul)")
        if g["dtypes"] and any("float64" in str(d) for d in g["dtypes"]):
            reasons.append("the inputs are float64: float32 GEMMs run about twice as fast")
        small = bool(reasons)
        if jitter >= GEMM_JITTER or (not small and frac < GEMM_STARVED_FRACTION):
            what = (f"calls of this one shape vary {jitter:.0f}x in time" if jitter >=
                    GEMM_JITTER else f"a GEMM of this size at {frac:.2%} of peak is slower "
                    "than any layout explains")
            reasons.append(f"{what}: the BLAS threads wait for each other while the "
                           "scheduler runs other work on their cores (more busy threads "
                           "than cores): lower OPENBLAS_NUM_THREADS/OMP_NUM_THREADS or stop "
                           "the competing jobs")
        if not reasons:
            reasons.append("the shapes are badly laid out for GEMM (a transposed or strided "
                           "input is copied first, an inner dim that is not a multiple of 8, "
                           "grouped/dilated convolution): keep the reduction dim contiguous")
        found.append(Finding(
            "gemm_below_peak", f"{name} {g['shapes']} runs at {frac:.1%} of this machine's "
                               f"sgemm rate at best ({best:.3g} of {peak:.1f} GFLOP/s)", ev,
            "; ".join(reasons), share=ev["share"]))
    return found


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
