"""Cost of eager's shape-rule check (registry.check_inputs) per op call: small tensors,
the check on and off (OpDef.eager_check) interleaved in one process, so background load
hits both alike. One JSON line per op: µs per call with the check, without it, and the
difference. Elementwise ops skip the check (their numpy kernels check what the rule
checks), so `add` and `tanh` should show ~0.

    python benchmarks/eager_check.py
"""
from __future__ import annotations

import numpy as np

from common import emit, timeit


def cases():
    import sampan
    r = np.random.default_rng(0)
    a = sampan.tensor(r.standard_normal(8).astype(np.float32))
    b = sampan.tensor(r.standard_normal(8).astype(np.float32))
    m = sampan.tensor(r.standard_normal((2, 4)).astype(np.float32))
    w = sampan.tensor(r.standard_normal((4, 2)).astype(np.float32))
    x = sampan.tensor(r.standard_normal((4, 4)).astype(np.float32))
    t = sampan.tensor(np.array([0, 3, 1, 2]))
    return [("add", "add", lambda: sampan.add(a, b)),
            ("tanh", "tanh", lambda: sampan.tanh(a)),
            ("sum", "sum", lambda: sampan.sum(a)),
            ("reshape", "reshape", lambda: a.reshape(2, 4)),
            ("matmul", "matmul", lambda: sampan.matmul(m, w)),
            ("softmax", "softmax", lambda: sampan.softmax(x, -1)),
            ("getitem", "getitem", lambda: x[1:3]),
            ("cross_entropy", "softmax_cross_entropy", lambda: sampan.cross_entropy(x, t))]


def main():
    from sampan.ops.registry import OPS
    inner = 2000
    for name, op_name, fn in cases():
        op = OPS[op_name]
        default = op.eager_check
        res = {True: [], False: []}
        try:
            for _ in range(5):
                for flag in (False, True):
                    op.eager_check = flag and default
                    res[flag] += [s * 1e6 for s in timeit(fn, reps=3, warmup=1, inner=inner)]
        finally:
            op.eager_check = default
        on, off = min(res[True]), min(res[False])
        emit("eager_check", "sampan", "eager", "us_per_call", res[True], op=name,
             checked=bool(default), without_check_us=round(off, 4),
             overhead_us=round(on - off, 4))


if __name__ == "__main__":
    main()
