"""Dispatch modes (sampan/ops/modes.py): what the profiler and autocast build on."""
import threading

import numpy as np
import pytest

import sampan
from sampan.ops import modes


def test_process_mode_sees_every_op_of_every_thread_and_is_removed():
    seen = []

    def mode(op, inputs, attrs, call_next):
        seen.append((threading.get_ident(), op.name))
        return call_next(op, inputs, attrs)

    modes.push_mode(mode, process_wide=True)
    try:
        x = sampan.randn(3, requires_grad=True)
        (x * 2).sum().backward()
        t = threading.Thread(target=lambda: sampan.ones(2) + 1)
        t.start()
        t.join()
    finally:
        modes.pop_mode(mode, process_wide=True)
    names = [n for _, n in seen]
    assert names[:3] == ["normal", "mul", "sum"] and "add" in names
    assert len({tid for tid, _ in seen}) == 2
    assert not modes.HOOKS.active
    n = len(seen)
    sampan.ones(2) * 3
    assert len(seen) == n


def test_thread_mode_changes_inputs_only_in_its_thread():
    def double_inputs(op, inputs, attrs, call_next):
        if op.name == "add":
            inputs = tuple(sampan.mul(t, 2.0) if t.dtype == sampan.float32 else t
                           for t in inputs)
        return call_next(op, inputs, attrs)

    a = sampan.ones(2)
    modes.push_mode(double_inputs)
    try:
        out = []
        t = threading.Thread(target=lambda: out.append((a + a).numpy()))
        t.start()
        t.join()
        np.testing.assert_array_equal((a + a).numpy(), [4.0, 4.0])
        np.testing.assert_array_equal(out[0], [2.0, 2.0])
    finally:
        modes.pop_mode(double_inputs)
    np.testing.assert_array_equal((a + a).numpy(), [2.0, 2.0])
    with pytest.raises(RuntimeError, match="not pushed"):
        modes.pop_mode(double_inputs)
