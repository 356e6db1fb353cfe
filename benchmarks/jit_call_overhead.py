"""The fixed cost of one `sampan.jit` call (signature key, guards, running the generated
code, wrapping results, the tape node of a differentiable call) on tiny inputs, where the
kernels themselves take little. Prints microseconds per call, the minimum over 7 repeats
of 2000 calls; the guard check alone is printed too. Absolute times on a shared VM are
comparable within one run only.

    PYTHONPATH=. .venv/bin/python benchmarks/jit_call_overhead.py
"""
from __future__ import annotations

import timeit

import sampan
from sampan import nn


def per_call_us(f, *args, number=2000):
    for _ in range(50):
        f(*args)
    return min(timeit.repeat(lambda: f(*args), number=number, repeat=7)) / number * 1e6


def main():
    x = sampan.ones(4, 3)
    cfg = {"scale": 2.0}
    f = sampan.jit(lambda x: x * cfg["scale"] + 1.0)
    sampan.manual_seed(0)
    m = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    jm = sampan.jit(m)
    with sampan.no_grad():
        print(f"function, no grad            {per_call_us(f, x):6.1f} us")
        print(f"MLP layer, no_grad           {per_call_us(jm, x):6.1f} us")
        entry = jm._last
        print(f"  of which guard checks      {per_call_us(entry.valid, (x,)):6.1f} us")
    print(f"MLP layer, differentiable    {per_call_us(jm, x):6.1f} us")


if __name__ == "__main__":
    main()
