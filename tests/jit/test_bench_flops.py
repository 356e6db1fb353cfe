"""The benchmark's GEMM FLOP count per training step (benchmarks/w1_w3_train.py, used for
the fraction of peak GEMM rate each system reaches) against the count by hand."""
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, BENCH)
    try:
        import w1_w3_train
        yield w1_w3_train
    finally:
        sys.path.remove(BENCH)


def test_w1_step_gemm_flops_by_hand(bench):
    b, dims = 128, (784, 512, 512, 10)
    # forward and weight gradient of every layer, input gradient of all but the first
    # (the batch needs none)
    per_layer = [2 * b * i * o for i, o in zip(dims, dims[1:])]
    expect = 2 * per_layer[0] + 3 * sum(per_layer[1:])
    assert bench.gemm_flops_per_step("W1") == expect


def test_w2_step_gemm_flops_by_hand(bench):
    n = 64
    conv1 = 2 * n * 6 * 28 * 28 * 1 * 25     # forward; weight gradient the same
    conv2 = 2 * n * 16 * 10 * 10 * 6 * 25    # forward, weight and input gradients
    fc = [2 * n * i * o for i, o in ((400, 120), (120, 84), (84, 10))]
    assert bench.gemm_flops_per_step("W2") == 2 * conv1 + 3 * conv2 + 3 * sum(fc)
