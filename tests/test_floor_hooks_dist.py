"""The op table's collectives reach the process groups through a hook that
sampan.distributed registers (ops/ is a lower floor and imports nothing of it), and the
dispatch modes forget, by themselves, a thread that ended with a mode pushed."""
from __future__ import annotations

import ast
import gc
import os
import threading

import numpy as np

import sampan
from sampan.ops import collective, modes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _imports(path):
    tree = ast.parse(open(path).read())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return out


def test_the_collective_ops_import_nothing_of_distributed():
    names = _imports(os.path.join(ROOT, "sampan", "ops", "collective.py"))
    assert not [n for n in names if "distributed" in n]
    for name in ("_buckets.py", os.path.join("passes", "distribute.py")):
        assert not [n for n in _imports(os.path.join(ROOT, "sampan", name))
                    if "distributed" in n]


def test_the_ops_run_through_the_registered_group_source():
    import sampan.distributed as dist

    seen = []

    class _Two:
        size, rank = 2, 0

        def run(self, name, arr, **attrs):
            seen.append((name, attrs))
            return dist.Work.completed(self, name, arr * 2)

    prev = dict(collective._SOURCE)
    collective.set_group_source(lambda: _Two(), dist.DistributedError)
    try:
        out = collective.all_reduce(sampan.tensor(np.ones(3, np.float32)), "sum")
    finally:
        collective.set_group_source(prev["current"], prev["error"])
    np.testing.assert_array_equal(out.numpy(), np.full(3, 2.0))
    assert seen == [("all_reduce", {"op": "sum"})]


def test_a_thread_that_ends_with_a_mode_pushed_is_forgotten():
    def mode(op, inputs, attrs, call_next):
        return call_next(op, inputs, attrs)

    t = threading.Thread(target=lambda: modes.push_mode(mode))
    t.start()
    t.join()
    gc.collect()
    assert not modes.HOOKS.active and modes.HOOKS.thread_modes_in_use == 0
    sampan.ones(2) + 1
