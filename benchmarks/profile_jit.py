"""Where a jit training step's time goes: per-kernel wall time of W1, W2 or W3 under
`sampan.jit`, from timers wrapped around every kernel the generated code calls.

Rows are kernels grouped by kind: unfused ops (`k_<op>`, `out_<op>` for those writing
into a planned buffer) by op, fused kernels by body and shape, matmuls one row per graph
node with its GFLOP/s. "other" is the step's time outside kernels (the generated code's
own lines, the jit call). Timers add ~0.3 us per call. Not part of `make bench` (it prints
absolute times, which on this VM are only comparable within one run).

    .venv/bin/python benchmarks/profile_jit.py W3 [--steps 10] [--top 30]
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_NODE = re.compile(r"#\s*%\d+(?:, %\d+)*: (\S+?)(?:,)? .*?= (\w+)\((.*?)\)\s+#")


def _label(line):
    """(kind label, output shape text, op) from a generated line's IR comment."""
    m = _NODE.search(line)
    if not m:
        return None
    shape, op, rest = m.groups()
    if op == "fused":
        body = "+".join(re.findall(r"\('(\w+)',", rest))
        return f"fused {body}", shape, op
    return op, shape, op


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=["W1", "W2", "W3"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    import w1_w3_train as B

    import sampan.runtime as rt
    import sampan.runtime.codegen as cg

    compiled = []
    orig = cg.compile_graph

    def capture(g, **kw):
        c = orig(g, **kw)
        compiled.append(c)
        return c
    cg.compile_graph = rt.compile_graph = capture
    step = B.build_sampan(args.workload, jit=True)
    step()
    step()
    cg.compile_graph = rt.compile_graph = orig
    c = compiled[-1]
    env = c.fn.__globals__
    times = collections.defaultdict(float)
    calls = collections.Counter()
    flops = {}

    def timed(key, f, k=None):
        def run(*a, **kw):
            t = time.perf_counter()
            r = f(*a, **kw)
            times[key] += time.perf_counter() - t
            calls[key] += 1
            if k is not None and key not in flops:
                flops[key] = 2 * r.size * a[0].shape[-1]
            return r
        return run

    lines = []
    for i, line in enumerate(c.code.splitlines()):
        m = re.search(r"= (_asarray\()?((?:out|k\d*)_\w+)\(", line)
        lab = _label(line) if m else None
        if lab is not None:
            kind, shape, op = lab
            name = m.group(2)
            if op == "matmul":   # one row per node
                key = f"matmul {shape} (line {i})"
                env[f"_t{i}"] = timed(key, env[name], k=True)
            else:
                key = kind if op != "fused" else f"{kind} {shape}"
                env[f"_t{i}"] = timed(key, env[name])
            line = line.replace(name + "(", f"_t{i}(", 1)
        lines.append(line)
    src = "\n".join(lines) + "\n"   # the generated code, each kernel call timed
    exec(compile(src, c.filename, "exec"), env)  # noqa: S102
    c.fn = env["graph_fn"]
    step()
    times.clear()
    calls.clear()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    total = (time.perf_counter() - t0) / args.steps
    per = {k: v / args.steps for k, v in times.items()}
    agg = collections.defaultdict(lambda: [0.0, 0])
    for k, v in per.items():
        a = agg["matmul (all)" if k.startswith("matmul") else k]
        a[0] += v
        a[1] += calls[k] // args.steps
    kern = sum(per.values())
    print(f"{args.workload} jit step {total * 1e3:.2f} ms: kernels {kern * 1e3:.2f} ms, "
          f"other {(total - kern) * 1e3:.2f} ms")
    for k, (v, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{v * 1e3:8.2f} ms  {n:4d} calls  {k}")
    print("matmuls:")
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        if k.startswith("matmul"):
            print(f"{v * 1e3:8.2f} ms  {flops[k] / v / 1e9:6.1f} GFLOP/s  {k}")


if __name__ == "__main__":
    main()
