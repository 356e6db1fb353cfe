"""The advisor reads events' fields (op name, shapes, dtypes, FLOPs), and its GEMM list
comes from the op table (`OpDef.gemm`), not from a list of its own."""
import numpy as np
import pytest

import sampan
from sampan.ops.registry import OPS, Spec, defop
from sampan.profiler import advisor
from sampan.profiler.events import Event


def test_gemm_ops_are_the_ops_the_table_marks():
    assert advisor.gemm_ops() == {n for n, op in OPS.items() if op.gemm}
    assert {"matmul", "conv2d", "conv_transpose2d", "conv2d_grad_weight",
            "einsum"} <= advisor.gemm_ops()
    assert "add" not in advisor.gemm_ops()


def _slow_kernel_events(name):
    peak = advisor.machine_peak_gflops()
    fl = 2 * 256 * 256 * 256
    ns = int(fl / (0.001 * peak))
    return [Event(name, "kernel", i * ns, ns, 1,
                  {"flops": fl, "program": "step", "inputs": [0, 1], "outputs": [2],
                   "shapes": [[256, 256]] * 2, "dtypes": ["float32"] * 2,
                   "out_shapes": [[256, 256]], "out_dtypes": ["float32"]})
            for i in range(3)]


def test_a_new_gemm_op_in_the_table_is_judged_without_editing_the_advisor():
    name = "_test_fancy_gemm"
    assert not [f for f in advisor.advise(_slow_kernel_events(name))
                if f.rule == "gemm_below_peak"]
    defop(name, lambda a, b: Spec((a.shape[0], b.shape[1]), a.dtype),
          kernel=lambda a, b: a @ b, flops=lambda a, b: 2 * a.shape[0] * a.shape[1] *
          b.shape[1], gemm=True)
    try:
        (f,) = [f for f in advisor.advise(_slow_kernel_events(name))
                if f.rule == "gemm_below_peak"]
        assert f.evidence["op"] == name and f.evidence["calls"] == 3
        assert f.evidence["shapes"] == "out [256, 256], K=256"
    finally:
        del OPS[name]


def test_jit_kernel_events_carry_the_nodes_fields():
    @sampan.jit
    def f(x, w):
        return sampan.tanh(sampan.matmul(x, w))

    x = sampan.tensor(np.ones((4, 8), np.float32))
    w = sampan.tensor(np.ones((8, 3), np.float32))
    f(x, w)
    with sampan.profiler.profile() as prof:
        f(x, w)
    (mm,) = [e for e in prof.events if e.cat == "kernel" and e.name == "matmul"]
    assert mm.args["shapes"] == [[4, 8], [8, 3]] and mm.args["out_shapes"] == [[4, 3]]
    assert mm.args["dtypes"] == ["float32", "float32"]
    assert mm.args["flops"] == 2 * 4 * 8 * 3
    ids = {e.name: e.args for e in prof.events if e.cat == "kernel"}
    if "tanh" in ids:                       # unfused: tanh reads matmul's output value
        assert set(ids["tanh"]["inputs"]) == set(mm.args["outputs"])


@pytest.mark.parametrize("dt,short", [("float64", "f64"), ("bfloat16", "bf16")])
def test_chain_dtypes_come_from_the_fields(dt, short):
    assert advisor._short_dtypes([dt, "int64"]) == {short}
