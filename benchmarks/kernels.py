"""Kernel candidates per (op, shape class of W1-W3, dtype): each candidate's time (sampan's
numpy kernel with its BLAS and numba loops, oneDNN), the winner the kernel choice keeps,
and PyTorch's same op in the same run. Usage: python kernels.py [--quick] [--dtype f32|bf16]

One JSON line per (op, shapes, dtype): {"workload": "kernels", "system": "sampan", ...,
"value": winner's µs, "candidates_us": {...}, "winner": ..., "pytorch_us": ...}."""
from __future__ import annotations

import argparse
import time

import numpy as np

import common  # noqa: F401  (puts the repository on sys.path)

from sampan import dtypes as _dt
from sampan.backends import choice
from sampan.ops.registry import OPS


def _conv(x, w, s=1, p=0):
    return {"stride": (s, s), "padding": (p, p), "dilation": (1, 1), "groups": 1}


# (workload, op, input shapes, attrs); conv gradients from their forward's geometry
CASES = [
    ("W1", "matmul", [(128, 784), (784, 512)], {}),
    ("W1", "matmul", [(128, 512), (512, 512)], {}),
    ("W1", "matmul", [(128, 512), (512, 10)], {}),
    ("W2", "conv2d", [(64, 1, 28, 28), (6, 1, 5, 5)], _conv(0, 0, 1, 2)),
    ("W2", "conv2d", [(64, 6, 14, 14), (16, 6, 5, 5)], _conv(0, 0)),
    ("W2", "conv2d_grad_weight", [(64, 6, 14, 14), (64, 16, 10, 10)],
     dict(_conv(0, 0), kernel_size=(5, 5))),
    ("W2", "conv_transpose2d", [(64, 16, 10, 10), (16, 6, 5, 5)],
     dict(_conv(0, 0), output_padding=(0, 0))),
    ("W2", "max_pool2d", [(64, 6, 28, 28)],
     {"kernel_size": (2, 2), "stride": (2, 2), "padding": (0, 0), "dilation": (1, 1)}),
    ("W3", "matmul", [(8, 128, 256), (256, 768)], {}),
    ("W3", "matmul", [(8, 128, 256), (256, 1024)], {}),
    ("W3", "matmul", [(8, 128, 1024), (1024, 256)], {}),
    ("W3", "matmul", [(8, 4, 128, 64), (8, 4, 64, 128)], {}),
    ("W3", "matmul", [(1024, 256), (256, 1000)], {}),
]


def _best(fn, reps, budget=0.5):
    fn()
    best, t_end = float("inf"), time.perf_counter() + budget
    for i in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if i >= 2 and time.perf_counter() > t_end:
            break
    return best


def _torch_fn(op, arrays, attrs, dtype):
    import torch
    import torch.nn.functional as F
    td = torch.bfloat16 if dtype == _dt.bfloat16 else torch.float32
    ts = [torch.from_numpy(a.astype(np.float32)).to(td) for a in arrays]
    if op == "matmul":
        return lambda: torch.matmul(*ts)
    if op == "conv2d":
        return lambda: F.conv2d(*ts, stride=attrs["stride"], padding=attrs["padding"])
    if op == "max_pool2d":
        return lambda: F.max_pool2d(ts[0], attrs["kernel_size"], attrs["stride"])
    if op == "conv_transpose2d":
        return lambda: F.conv_transpose2d(*ts, stride=attrs["stride"], padding=attrs["padding"])
    if op == "conv2d_grad_weight":
        x, g = ts
        wshape = (g.shape[1], x.shape[1]) + tuple(attrs["kernel_size"])
        return lambda: torch.ops.aten.convolution_backward(
            g, x, torch.empty(wshape, dtype=td), None, list(attrs["stride"]),
            list(attrs["padding"]), [1, 1], False, [0, 0], 1, [False, True, False])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dtype", action="append", choices=("f32", "bf16"))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(2)
    reps = 5 if args.quick else 15
    r = np.random.default_rng(0)
    for dname in args.dtype or ["f32", "bf16"]:
        dtype = np.dtype(np.float32) if dname == "f32" else _dt.bfloat16
        for wl, op, shapes, attrs in CASES:
            arrays = [r.standard_normal(s).astype(np.float32).astype(dtype) for s in shapes]
            cands = OPS[op].kernel.candidates()
            times = {}
            for name, fn in cands.items():
                try:
                    times[name] = _best(lambda: fn(*arrays, **attrs), reps)
                except Exception as e:  # noqa: BLE001 - Unsupported: not a candidate here
                    times[name] = None
                    print(f"# {op} {shapes} {dname}: {name} unavailable ({type(e).__name__})")
            ok = {k: v for k, v in times.items() if v is not None}
            winner = min(ok, key=ok.get)
            tf = _torch_fn(op, arrays, attrs, dtype)
            pt = _best(tf, reps) if tf else None
            common.emit("kernels", "sampan", "eager", "us", [ok[winner] * 1e6], op=op,
                        workload_of=wl, shapes=shapes, dtype=dname, winner=winner,
                        candidates_us={k: round(v * 1e6, 1) for k, v in ok.items()},
                        pytorch_us=round(pt * 1e6, 1) if pt else None,
                        vs_pytorch=round(pt / ok[winner], 3) if pt else None,
                        **common.blas_info())
    _ = choice


if __name__ == "__main__":
    main()
