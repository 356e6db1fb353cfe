"""`onednn_layout`: float32 conv regions run in oneDNN's blocked layouts (one engine node
per region, `sampan/backends/onednn/blocked.py`), checked against PyTorch in float64,
onnxruntime on the same ONNX file and sampan's eager run of the imported Layer."""
import io
import warnings

import numpy as np
import pytest

from sampan.backends import onednn

pytestmark = pytest.mark.skipif(not onednn.available(),
                                reason=f"oneDNN unavailable: {onednn.why_unavailable()}")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
nn = torch.nn


class Plain(nn.Module):
    """stride, padding, dilation, a residual add, ReLU and SiLU epilogues, a
    projection shortcut (two convs and their biases summed), two outputs."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, 1, 1)
        self.c2 = nn.Conv2d(16, 16, 3, 1, 2, dilation=2)
        self.c3 = nn.Conv2d(16, 32, 3, 2, 1)
        self.dw = nn.Conv2d(32, 32, 3, 1, 1, groups=32)
        self.c4 = nn.Conv2d(32, 32, 1)
        self.c5 = nn.Conv2d(16, 32, 1, 2)

    def forward(self, x):
        a = torch.relu(self.c1(x))
        b = self.c2(a) + a
        c = nn.functional.silu(self.c3(b))
        d = self.c4(self.dw(c)) + self.c5(b)
        return torch.relu(d), a


class Activations(nn.Module):
    """Hardswish, ReLU6 and hardsigmoid epilogues and a squeeze-excite block (PP-OCR's:
    the importer writes the activations as comparisons and selects, the planner reads them
    back as oneDNN's hardswish and clip; the mean is global average pooling, the scale a
    binary primitive)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, 2, 1)
        self.c2 = nn.Conv2d(16, 32, 3, 1, 1)
        self.se1 = nn.Conv2d(32, 8, 1)
        self.se2 = nn.Conv2d(8, 32, 1)
        self.c3 = nn.Conv2d(32, 16, 1)

    def forward(self, x):
        t = self.c1(x)
        a = t * torch.clamp(t + 3, 0, 6) / 6          # hardswish as PP-OCR's files write it
        b = nn.functional.relu6(self.c2(a))
        s = torch.relu(self.se1(torch.mean(b, (2, 3), keepdim=True)))   # squeeze-excite
        b = b * torch.clamp(self.se2(s) * 0.2 + 0.5, 0, 1)             # (a hardsigmoid)
        return torch.tanh(self.c3(b))


class Blocks(nn.Module):
    """A stem with a padded max-pool (ResNet's), a YOLO C2f block (channel split at a
    multiple of 16, SiLU bottleneck with a residual, channel concat), a grouped conv,
    a 5x5 max-pool of stride 1, a nearest 2x upsample concatenated with its skip, and a
    conv whose output leaves the region raw."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(32)
        self.cv1 = nn.Conv2d(32, 64, 1)
        self.m1 = nn.Conv2d(32, 32, 3, 1, 1)
        self.m2 = nn.Conv2d(32, 32, 3, 1, 1)
        self.cv2 = nn.Conv2d(96, 64, 1)
        self.grp = nn.Conv2d(64, 64, 3, 1, 1, groups=4)
        self.down = nn.Conv2d(64, 64, 3, 2, 1)
        self.head = nn.Conv2d(128, 8, 1)

    def forward(self, x):
        s = nn.functional.max_pool2d(torch.relu(self.bn(self.stem(x))), 3, 2, 1)
        y = nn.functional.silu(self.cv1(s))
        a, b = y[:, :32], y[:, 32:]
        m = b + nn.functional.silu(self.m2(nn.functional.silu(self.m1(b))))
        z = nn.functional.silu(self.cv2(torch.cat([a, b, m], 1)))
        z = torch.relu(self.grp(z))
        z = nn.functional.max_pool2d(z, 5, 1, 2)
        up = nn.functional.interpolate(torch.relu(self.down(z)), scale_factor=2.0)
        return self.head(torch.cat([up, z], 1))         # YOLO's neck: upsample + concat


def _export(model, shape, path):
    torch.manual_seed(0)
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    model.eval()
    x = torch.randn(*shape)
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), f, dynamo=False, opset_version=17,
                          input_names=["x"])
    path.write_bytes(f.getvalue())
    with torch.no_grad():
        ref = model.double()(x.double())
    ref = ref if isinstance(ref, tuple) else (ref,)
    return x.numpy(), [r.numpy() for r in ref]


def _predictor(onnx_path, out_dir, providers=None):
    from sampan.inference import Config, create_predictor
    from sampan.onnx.importer import save_program
    p, _ = save_program(str(onnx_path), str(out_dir / "m.sampan"))
    cfg = Config(p)
    if providers:
        cfg.set_providers(providers)
    return create_predictor(cfg)


def _rel(y, ref):
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))


@pytest.mark.parametrize("model,shape", [(Plain, (1, 3, 20, 24)), (Blocks, (1, 3, 64, 48)),
                                         (Blocks, (2, 3, 32, 32)),
                                         (Activations, (1, 3, 40, 40))])
def test_region_matches_float64_onnxruntime_and_eager(tmp_path, model, shape):
    import sampan
    import sampan.onnx
    x, ref = _export(model(), shape, tmp_path / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)     # no region fell back
        pred = _predictor(tmp_path / "m.onnx", tmp_path)
        got = pred.run([x])
    regions = [n for n in pred.graph.nodes if n.op == "engine"]
    assert regions and all(n.attrs["engine"] == "onednn" for n in regions)
    assert not any(n.op == "conv2d" for n in pred.graph.nodes)
    ops = {e[0] for n in regions for e in n.attrs["body"]}
    if model is Blocks:
        assert {"max_pool2d", "getitem", "concat", "conv2d", "index_select"} <= ops
        assert len(regions) == 1
    if model is Activations:             # one region: every epilogue became a post-op
        assert len(regions) == 1
    want = ort.InferenceSession(str(tmp_path / "m.onnx"),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    eager = sampan.onnx.to_layer(str(tmp_path / "m.onnx"))
    eager.eval()
    with sampan.no_grad():
        e = eager(sampan.tensor(x))
    e = e if isinstance(e, (tuple, list)) else (e,)
    for g, r, w, ev in zip(got, ref, want, e):
        assert g.shape == r.shape
        assert _rel(g, r) < 1e-5
        assert _rel(g, w) < 1e-5
        assert _rel(g, np.asarray(ev.numpy())) < 1e-5
    again = pred.run([x * 0.5])                       # buffers reused, handles rebound
    want2 = ort.InferenceSession(str(tmp_path / "m.onnx"),
                                 providers=["CPUExecutionProvider"]).run(None, {"x": x * 0.5})
    for g, w in zip(again, want2):
        assert _rel(g, w) < 1e-5


def test_without_onednn_in_the_list_the_pass_does_nothing(tmp_path):
    x, ref = _export(Plain(), (1, 3, 12, 12), tmp_path / "m.onnx")
    pred = _predictor(tmp_path / "m.onnx", tmp_path, providers=["numba", "numpy"])
    assert not any(n.op == "engine" for n in pred.graph.nodes)
    assert any(n.op == "conv2d" for n in pred.graph.nodes)
    for g, r in zip(pred.run([x]), ref):
        assert _rel(g, r) < 1e-5


def _graph_conv_then(op_fn):
    """conv2d(x, W) then `op_fn(graph, conv_value)` as a traced-like Graph."""
    from sampan.ir.graph import Graph
    g = Graph()
    x = g.add_input((1, 4, 6, 6), np.float32, name="x")
    w = g.add_const(np.random.default_rng(0).standard_normal((16, 4, 3, 3))
                    .astype(np.float32))
    y = g.add_node("conv2d", [x, w], {"stride": (1, 1), "padding": (1, 1),
                                       "dilation": (1, 1), "groups": 1}).outputs[0]
    g.outputs = [op_fn(g, x, y)]
    return g


def test_plan_leaves_out_what_it_cannot_express():
    from sampan.passes import PassManager
    from sampan.passes.onednn_layout import REPORT

    def tail(g, x, y):        # relu(conv) * x-derived tensor of another shape: stays out
        r = g.add_node("relu", [y], {}).outputs[0]
        e = g.add_node("exp", [r], {}).outputs[0]
        return g.add_node("add", [e, r], {}).outputs[0]
    g = _graph_conv_then(tail)
    g2 = PassManager(["onednn_layout"], options={"onednn_layout": {"min_mflops": 0}}).run(g)
    ops = [n.op for n in g2.nodes]
    assert ops == ["engine", "exp", "add"], ops
    rep = dict(g2.meta[REPORT])
    assert any(v.startswith("region") for v in rep.values())
    xv = np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32)
    from sampan.runtime.codegen import compile_graph
    want = compile_graph(_graph_conv_then(tail))(xv)[0]
    got = compile_graph(g2)(xv)[0]
    assert _rel(got, want) < 1e-5


def test_plan_rejects_an_epilogue_on_no_conv():
    from sampan.backends.onednn.plan import PlanError, plan
    body = (("relu", (0,), (), 1),)
    with pytest.raises(PlanError) as e:
        plan(body, [None], (1,), {0: (1, 16, 4, 4), 1: (1, 16, 4, 4)})
    assert e.value.entry == 0


def test_a_region_called_with_other_shapes_says_so(tmp_path):
    from sampan.backends.onednn._lib import OneDNNError
    x, _ = _export(Plain(), (1, 3, 20, 24), tmp_path / "m.onnx")
    pred = _predictor(tmp_path / "m.onnx", tmp_path)
    node = next(n for n in pred.graph.nodes if n.op == "engine")
    from sampan.backends.onednn.provider import bind_region
    run = bind_region(node)
    args = [v.const if v.is_const else x for v in node.inputs]
    want = run(*args)
    assert all(np.isfinite(w).all() for w in want)
    args[0] = np.zeros((1, 3, 20, 20), np.float32)      # a size it was not built for
    with pytest.raises(OneDNNError, match=r"input 0 is \[1, 3, 20, 20\]; expected "):
        run(*args)


def test_a_region_outside_the_onednn_provider_runs_its_body_in_onnxruntime():
    """The engine node a region became, given to the numpy provider (a list without
    "onednn"): onnxruntime runs the same body (`onednn.RegionFallback`)."""
    from sampan.passes import PassManager
    from sampan.passes.partition import assign
    from sampan.runtime.codegen import compile_graph

    def tail(g, x, y):
        return g.add_node("relu", [y], {}).outputs[0]
    xv = np.random.default_rng(2).standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = compile_graph(_graph_conv_then(tail))(xv)[0]
    g = PassManager(["onednn_layout"], options={"onednn_layout": {"min_mflops": 0}}).run(
        _graph_conv_then(tail))
    assert [n.op for n in g.nodes] == ["engine"]
    assign(g, ["numpy"])
    assert g.nodes[0].meta["provider"] == "numpy"
    got = compile_graph(g)(xv)[0]
    assert _rel(got, want) < 1e-5
    assert _rel(got, np.maximum(want, 0)) < 1e-5


def test_a_region_of_small_primitives_races_one_thread_against_the_pool(tmp_path, monkeypatch):
    """`regionrace.fastest`: the region built on one OpenMP thread computes what the region on
    the process's threads computes (float64 PyTorch reference), a call on it leaves the
    caller's OpenMP thread count as it was, and the race keeps the faster build and its
    times; a region over RACE_STEP_US a primitive, or a process on one thread, is not
    raced."""
    import sampan
    from sampan.backends.onednn import blocked, regionrace
    x, ref = _export(Activations(), (1, 3, 40, 40), tmp_path / "m.onnx")
    pred = _predictor(tmp_path / "m.onnx", tmp_path)
    node = next(n for n in pred.graph.nodes if n.op == "engine")
    built = []
    real = blocked.Region.__init__

    def spy(self, node):
        built.append(self.threads)
        real(self, node)
    monkeypatch.setattr(blocked.Region, "__init__", spy)
    g = regionrace.omp()
    n0 = sampan.get_num_threads()
    try:
        sampan.set_num_threads(2)
        args = [v.const if v.is_const else x for v in node.inputs]
        ser = regionrace.ThreadedRegion(node, 1)
        par = blocked.Region(node)
        assert g.omp_get_max_threads() == 2
        ys, yp = ser(*args), par(*args)
        assert g.omp_get_max_threads() == 2          # restored after the one-thread call
        assert ser.threads == 1 and par.threads is None
        assert _rel(ys, ref[0]) < 1e-4 and _rel(yp, ref[0]) < 1e-4
        np.testing.assert_allclose(ys, yp, rtol=1e-5, atol=1e-6)

        built.clear()
        win = regionrace.fastest(node)
        assert built == [None, 1]
        r = win.race
        assert r["parallel_us"] > 0 and r["serial_us"] > 0
        assert (win.threads == 1) == (r["serial_us"] < r["parallel_us"])
        assert _rel(win(*args), ref[0]) < 1e-4

        built.clear()
        monkeypatch.setattr(regionrace, "RACE_STEP_US", 1e-3)   # every region "large"
        assert regionrace.fastest(node).threads is None and built == [None]
        monkeypatch.setattr(regionrace, "RACE_STEP_US", 150.0)
        built.clear()
        sampan.set_num_threads(1)
        assert regionrace.fastest(node).race["serial_us"] is None and built == [None]
        with pytest.raises(ValueError, match="threads=0"):
            regionrace.ThreadedRegion(node, 0)
    finally:
        sampan.set_num_threads(n0)
