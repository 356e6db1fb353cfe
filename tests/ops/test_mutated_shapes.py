"""Every op, every sample, each array input with one dimension grown or shrunk by one:
eager execution must match the op's shape rule or raise a sampan error, never accept what
the rule rejects and never crash the process (numba kernels index without bounds checks).

The sweep runs in a child process, so a crash is reported as a failure naming the case
that was running, not as a dead test runner."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import sampan
from sampan.errors import SampanError, ShapeError

from . import harness as H

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = """
import json, sys
from tests.ops.harness import run_mutated_shapes
print(json.dumps(run_mutated_shapes(sys.argv[1])))
"""


def raised_in_child(code):
    """Run `code` (after sampan, numpy and apply are imported) in a child process; return
    the name of what it raised ("accepted" if nothing, "crashed ..." if the process died).
    Calls that wrote out of bounds on the old code run here first, so they fail the test
    instead of corrupting or killing the runner."""
    child = ("import numpy as np\nimport sampan\nfrom sampan.tensor import apply\n"
             f"try:\n    {code}\n    print('accepted')\n"
             "except Exception as e:\n    print(type(e).__name__)\n"
             "import gc; gc.collect()\n")
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", child], cwd=_ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return f"crashed (exit {p.returncode}): {p.stderr[-1500:]}"
    return p.stdout.strip().splitlines()[-1]


def test_mutated_shapes_every_op(tmp_path):
    progress = tmp_path / "progress.txt"
    env = dict(os.environ, PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONFAULTHANDLER="1")
    p = subprocess.run([sys.executable, "-c", _CHILD, str(progress)], cwd=_ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        lines = progress.read_text().splitlines() if progress.exists() else []
        pytest.fail(f"the mutated-shapes sweep died (exit {p.returncode}) during "
                    f"{lines[-1] if lines else '?'}\n{p.stderr[-3000:]}")
    problems = json.loads(p.stdout.strip().splitlines()[-1])
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:60])


def test_mutation_generator_covers_every_dim():
    a, b = np.zeros((2, 3)), np.zeros((0,))
    muts = [(i, d, delta, tuple(x.shape for x in args[:2]))
            for i, d, delta, args in H.mutated_shapes((a, b, 5))]
    assert muts == [(0, 0, 1, ((3, 3), (0,))), (0, 0, -1, ((1, 3), (0,))),
                    (0, 1, 1, ((2, 4), (0,))), (0, 1, -1, ((2, 2), (0,))),
                    (1, 0, 1, ((2, 3), (1,)))]


def test_eager_checks_the_rule_before_the_kernel():
    # a gradient one row too tall went into max_pool2d_grad's numba loop, which wrote past
    # its buffer; now the op's rule stops it, naming the op and this line
    from sampan.ops.pool import MAX_POOL2D_GRAD
    from sampan.tensor import apply
    attrs = {"kernel_size": (2, 2), "stride": (2, 2), "padding": (0, 0), "dilation": (1, 1)}
    assert raised_in_child(
        "from sampan.ops.pool import MAX_POOL2D_GRAD; apply(MAX_POOL2D_GRAD, "
        f"(sampan.randn(1, 1, 4, 4), sampan.randn(1, 1, 3, 2)), {attrs!r})") == "ShapeError"
    x = sampan.randn(1, 1, 4, 4)
    g = sampan.randn(1, 1, 3, 2)
    with pytest.raises(ShapeError, match=r"max_pool2d_grad.*\(1, 1, 3, 2\)[\s\S]*"
                                         r"test_mutated_shapes\.py:\d+"):
        apply(MAX_POOL2D_GRAD, (x, g), attrs)
    # the right shape still runs, and agrees with torch
    import torch
    g = sampan.randn(1, 1, 2, 2)
    tx = torch.tensor(x.numpy(), requires_grad=True)
    torch.nn.functional.max_pool2d(tx, 2).backward(torch.tensor(g.numpy()))
    np.testing.assert_allclose(apply(MAX_POOL2D_GRAD, (x, g), attrs).numpy(),
                               tx.grad.numpy(), rtol=1e-6)


def test_rule_verdicts_are_cached_per_shape():
    from sampan.ops.reduce import SUM
    x = sampan.randn(3, 4)
    sampan.sum(x, 1)
    n = len(SUM.checked)
    sampan.sum(x, 1)
    assert len(SUM.checked) == n
    with pytest.raises(SampanError):
        sampan.sum(x, 5)


@pytest.mark.parametrize("n_target", [0, 2, 5])
def test_cross_entropy_checks_the_target_length(n_target):
    # a longer target silently used its first N entries; an empty one read past the end
    # (a segfault): first in a child process, then here for the message
    for f in ("sampan.cross_entropy", "sampan.ops.rowwise.softmax_cross_entropy"):
        assert raised_in_child(f"{f}(sampan.randn(3, 4), sampan.tensor(np.zeros({n_target}, "
                               "np.int64)))") == "ShapeError"
    from sampan.ops.rowwise import softmax_cross_entropy
    x = sampan.randn(3, 4)
    t = sampan.tensor(np.zeros(n_target, np.int64))
    with pytest.raises(ShapeError, match=r"cross_entropy[\s\S]*test_mutated_shapes"):
        sampan.cross_entropy(x, t)
    # the row op itself (what the frontend calls): its rule now runs before the kernel
    with pytest.raises(ShapeError, match=r"softmax_cross_entropy[\s\S]*test_mutated_shapes"):
        softmax_cross_entropy(x, t)


def test_cross_entropy_gradient_kernel_checks_targets():
    from sampan.ops.rowwise import XENT_GRAD
    from sampan.tensor import apply
    call = "(sampan.randn(2, 3), sampan.tensor([0, 10**6]), *[sampan.zeros(2)] * 3)"
    assert raised_in_child("from sampan.ops.rowwise import XENT_GRAD; apply(XENT_GRAD, "
                           f"{call}, {{'ignore_index': -100}})") == "ShapeError"
    x = sampan.randn(2, 3)
    row = sampan.zeros(2)
    with pytest.raises(SampanError, match="softmax_cross_entropy"):
        apply(XENT_GRAD, (x, sampan.tensor([0, 10**6]), row, row, row), {"ignore_index": -100})
