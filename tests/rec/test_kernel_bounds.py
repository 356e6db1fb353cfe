"""The sparse-feature kernels validate what their numba loops assume (row indices in range,
one row of values per index, CSR offsets, argmax inside its bag) before they run: an
out-of-range index wrote past the output (silent corruption, SIGSEGV or a glibc abort).

Each bad call runs in a child process too, so a crash fails the test instead of killing
the runner."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from sampan.errors import SampanError, SampanValueError, ShapeError
from sampan.rec.kernels import bag_pool, bag_pool_backward, segment_sum

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_V = np.ones((3, 4), np.float32)
_G = np.ones((2, 4), np.float32)

BAD_CALLS = {
    "segment_sum index past n": "segment_sum([0, 1, 10**6], _V, 2)",
    "segment_sum negative index": "segment_sum([0, -(10**6), 1], _V, 2)",
    "segment_sum short values": "segment_sum([0, 1, 0, 1], _V, 2)",
    "segment_sum negative n": "segment_sum([0, 1, 0], _V, -1)",
    "bag_pool_backward index past n_src": "bag_pool_backward(_G, [0, 10**6, 1], [0, 2, 3], 5)",
    "bag_pool_backward negative index": "bag_pool_backward(_G, [0, -9, 1], [0, 2, 3], 5)",
    "bag_pool_backward grad rows != bags": "bag_pool_backward(_G, [0, 1, 2, 3], [0, 4], 5)",
    "bag_pool_backward offsets past idx": "bag_pool_backward(_G, [0, 1], [0, 1, 10**6], 5)",
    "bag_pool_backward argmax outside bag":
        "bag_pool_backward(_G, [0, 1, 2], [0, 2, 3], 5, 'max', np.full((2, 4), 10**6))",
    "bag_pool_backward argmax shape":
        "bag_pool_backward(_G, [0, 1, 2], [0, 2, 3], 5, 'max', np.zeros((1, 4), np.int64))",
    "bag_pool 1-d source": "bag_pool(np.ones(5, np.float32), [0, 1], [0, 2])",
}


_CHILD = """
import json, sys
import numpy as np
from sampan.errors import SampanError
from sampan.rec.kernels import bag_pool, bag_pool_backward, segment_sum
_V = np.ones((3, 4), np.float32)
_G = np.ones((2, 4), np.float32)
out = {}
for what, code in json.loads(sys.argv[1]).items():
    try:
        eval(code)
        out[what] = "accepted"
    except SampanError as e:
        out[what] = "sampan"
    except Exception as e:
        out[what] = type(e).__name__ + ": " + str(e)
import gc; gc.collect()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def sweep():
    """Every bad call in a fresh child process (nothing else allocated around the buffers):
    before the checks one of them killed it (SIGSEGV or glibc's "free(): invalid pointer")."""
    import json
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(BAD_CALLS)], cwd=_ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        pytest.fail(f"the bad calls crashed a child process (exit {p.returncode}):\n"
                    f"{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("what", sorted(BAD_CALLS))
def test_bad_call_raises_a_sampan_error_naming_the_op(what, sweep):
    assert sweep[what] == "sampan", sweep[what]
    code = BAD_CALLS[what]      # safe in this process now: it raised in the child
    with pytest.raises(SampanError, match=code.split("(")[0] + r"[\s\S]*test_kernel_bounds"):
        eval(compile(code, __file__, "eval"))


def test_error_classes(sweep):
    assert sweep["segment_sum index past n"] == sweep["segment_sum short values"] == "sampan"
    with pytest.raises(SampanValueError, match=r"inverse value 1000000.*\[0, 2\)"):
        segment_sum([0, 1, 10**6], _V, 2)
    with pytest.raises(ShapeError, match=r"one row of values per entry"):
        segment_sum([0, 1, 0, 1], _V, 2)


def test_valid_calls_still_match_torch():
    r = np.random.default_rng(0)
    inv = r.integers(0, 5, 40)
    vals = r.standard_normal((40, 3)).astype(np.float32)
    ref = torch.zeros(5, 3).index_add_(0, torch.from_numpy(inv), torch.from_numpy(vals))
    np.testing.assert_allclose(segment_sum(inv, vals, 5), ref.numpy(), rtol=1e-5, atol=1e-6)
    # bag pooling backward == torch's EmbeddingBag gradient, in each mode
    src = r.standard_normal((6, 3)).astype(np.float32)
    idx, offsets = np.array([0, 5, 5, 2, 1, 3]), np.array([0, 2, 2, 6])
    g = r.standard_normal((3, 3)).astype(np.float32)
    for mode in ("sum", "mean", "max"):
        out, arg = bag_pool(src, idx, offsets, mode)
        w = torch.tensor(src, requires_grad=True)
        y = torch.nn.functional.embedding_bag(torch.from_numpy(idx), w,
                                              torch.from_numpy(offsets[:-1]), mode=mode)
        y.backward(torch.from_numpy(g))
        np.testing.assert_allclose(out, y.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(bag_pool_backward(g, idx, offsets, 6, mode, arg),
                                   w.grad.numpy(), rtol=1e-5, atol=1e-6)
