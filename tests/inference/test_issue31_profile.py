"""Issue 31: the profiler shows where a batch-1 Predictor call's time goes. Each `run()`
is one event (cat "jit", name "run", the program named by its model file) whose children
are the kernels it ran, each saying which kernel was bound (a specialised one such as the
small-GEMM matmul, or the op table's), its IR line and FLOPs; the per-name table and the
Chrome trace read them."""
import json
import os

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.inference import Config, create_predictor
from sampan.profiler import profile


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    sampan.manual_seed(7)
    m = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(4 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10))
    m.eval()
    path = sampan.jit.save(m, str(tmp_path_factory.mktemp("prof") / "small.sampan"),
                           (sampan.randn(2, 1, 16, 16),), dynamic={"x": {0: "batch"}})
    return path


def test_batch1_call_is_one_event_with_its_kernels_as_children(served, tmp_path):
    cfg = Config(served)
    cfg.pass_builder().delete_pass("fuse_layers")     # the specialised nodes themselves
    p = create_predictor(cfg)
    h = p.get_input_handle("x")
    x = np.random.default_rng(0).standard_normal((1, 1, 16, 16)).astype(np.float32)
    h.copy_from_cpu(x)
    p.run()                                     # compiled outside the profile
    plain = p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()
    with profile() as prof:
        for _ in range(3):
            h.copy_from_cpu(x)
            p.run()
    got = p.get_output_handle(p.get_output_names()[0]).copy_to_cpu()
    np.testing.assert_array_equal(got, plain)
    name = "predictor:" + os.path.basename(str(served))
    runs = [e for e in prof.events if e.cat == "jit" and e.name == "run"]
    kern = [e for e in prof.events if e.cat == "kernel"]
    assert len(runs) == 3 and all(r.args["program"] == name for r in runs)
    for r in runs:
        kids = [k for k in kern if r.ts <= k.ts and k.end <= r.end]
        assert len(kids) == len(kern) // 3 >= 5
        assert sum(k.dur for k in kids) <= r.dur
        by_op = {k.name: k for k in kids}
        assert {"conv2d", "max_pool2d", "matmul"} <= set(by_op)
        # which kernel ran: the specialised conv, pool and small-GEMM matmul
        assert by_op["conv2d"].args["kernel"].startswith("s")
        assert by_op["max_pool2d"].args["kernel"].startswith("s")
        mm = [k for k in kids if k.name == "matmul"]
        assert any(k.args["kernel"].startswith("s") and k.args["kernel"].endswith("_matmul")
                   for k in mm), [k.args["kernel"] for k in mm]
        assert all(k.args["flops"] > 0 and k.args["shapes"][0][0] == 1 for k in mm)
    table = prof.key_averages()
    text = str(table)
    assert "matmul" in text and "conv2d" in text
    trace = json.load(open(prof.export_chrome_trace(str(tmp_path / "t.json"))))
    evs = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert any(e.get("args", {}).get("kernel", "").endswith("_matmul") for e in evs)
    # the default list: one event per fused layer (fuse_layers, issue 31)
    q = create_predictor(Config(served))
    hq = q.get_input_handle("x")
    hq.copy_from_cpu(x)
    q.run()
    with profile() as prof2:
        hq.copy_from_cpu(x)
        q.run()
    names = [e.name for e in prof2.events if e.cat == "kernel"]
    assert names == ["conv2d_block", "reshape", "dense", "dense"], names
    blk = next(e for e in prof2.events if e.name == "conv2d_block")
    assert blk.args["flops"] > 0 and blk.args["kernel"].startswith("p")
