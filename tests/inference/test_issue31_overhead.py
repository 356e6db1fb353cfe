"""Issue 31, per-call Predictor overhead: the no-op model (an identity program, the model of
benchmarks/predictor_overhead.py) runs no kernel, does not copy a shared input, and gives
identical results on every feeding path; the copy path reuses the handle's own buffer.
No timing assertions here: the benchmark measures."""
import os
import sys

import numpy as np
import pytest

import sampan
from sampan import nn
from sampan.inference import Config, create_predictor


class Identity(nn.Layer):
    def forward(self, x):
        return x


@pytest.fixture(scope="module")
def noop(tmp_path_factory):
    path = sampan.jit.save(Identity(), str(tmp_path_factory.mktemp("noop") / "id.sampan"),
                           (sampan.randn(2, 6),), dynamic={"x": {0: "batch"}})
    return create_predictor(Config(path))


def test_noop_program_runs_no_kernel(noop):
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    noop.run([x])
    assert noop.graph.nodes == [] or len(noop.graph.nodes) == 0
    body = [ln for ln in noop.code.splitlines()[1:] if ln.strip()]
    assert body == ["    return (x0,)"], noop.code


def test_shared_input_is_not_copied(noop):
    p = noop.clone()
    h = p.get_input_handle("x")
    o = p.get_output_handle(p.get_output_names()[0])
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    h.share_external_data(x)
    p.run()
    assert o._arr is x                     # the program's output is the caller's array
    x[0, 0] = 42.0                         # a change shows in the next run: no copy
    p.run()
    got = o.copy_to_cpu()
    assert got[0, 0] == 42.0 and not np.shares_memory(got, x)
    np.testing.assert_array_equal(got, x)


def test_every_feeding_path_gives_identical_results(noop):
    p = noop.clone()
    h = p.get_input_handle("x")
    o = p.get_output_handle(p.get_output_names()[0])
    x = np.random.default_rng(1).standard_normal((1, 6)).astype(np.float32)
    (a,) = p.run([x])
    h.copy_from_cpu(x)
    own = h._own
    p.run()
    b = o.copy_to_cpu()
    h.copy_from_cpu(x * 2)                 # the handle's buffer is reused, not remade
    assert h._own is own and o._arr is own
    p.run()
    c = o.copy_to_cpu()
    h.share_external_data(x)
    p.run()
    d = o.copy_to_cpu()
    out = np.empty_like(x)
    o.share_external_data(out)
    p.run()
    for got in (a, b, d, out):
        np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(c, x * 2)
    # a Tensor and a strided view feed alike; a wrong dtype gets the handle's clear error
    h.copy_from_cpu(sampan.tensor(x))
    p.run()
    np.testing.assert_array_equal(out, x)
    wide = np.repeat(x, 2, axis=1)
    h.copy_from_cpu(wide[:, ::2])
    p.run()
    np.testing.assert_array_equal(out, x)
    with pytest.raises(sampan.inference.InferenceError, match="input 'x'.*float64"):
        h.copy_from_cpu(x.astype(np.float64))


def test_overhead_benchmark_runs(tmp_path):
    """benchmarks/predictor_overhead.py prints its JSON lines (a short run)."""
    import io
    from contextlib import redirect_stdout
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.path.insert(0, os.path.join(root, "benchmarks"))
    try:
        import predictor_overhead as bench
        buf = io.StringIO()
        with redirect_stdout(buf):
            assert bench.main(["--calls", "50", "--blocks", "1", "--features", "8"]) == 0
    finally:
        sys.path.remove(os.path.join(root, "benchmarks"))
    import json
    lines = [json.loads(ln) for ln in buf.getvalue().splitlines() if ln.startswith("{")]
    modes = {(r["system"], r["mode"]) for r in lines if r["metric"] == "call_us_p50"}
    assert {("sampan", "zero_copy"), ("sampan", "copy"), ("sampan", "run_list")} <= modes
    assert all("machine" in r for r in lines)
