"""ONNX control flow (issue 34): If / Loop / Scan and the sequence ops imported
(sampan/onnx/ops/control.py, sequence.py), checked against the node suite's own outputs
and numpy; under sampan.jit they become cond / while_loop / scan nodes. And the export of
jitted cond / while_loop / scan as If / Loop / Scan, run by onnxruntime against sampan eager
and imported back."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

import sampan  # noqa: E402
from sampan.onnx import OnnxError  # noqa: E402

be = pytest.importorskip("sampan.onnx.backend")

_MODULES = ("if_", "loop", "scan", "sequence_map", "sequenceinsert", "splittosequence",
            "optionalgetelement", "optionalhaselement")
CONTROL = {"If": 3, "Loop": 3, "Scan": 4, "SequenceMap": 12, "SequenceInsert": 2,
           "SplitToSequence": 3, "OptionalGetElement": 4, "OptionalHasElement": 7}


def _suite():
    """Only the case modules of these op types are generated (under a second)."""
    return be.module_cases(_MODULES, CONTROL)


def test_node_suite_control_flow_and_sequence_cases_pass():
    counts, failed = {}, {}
    for op, c in _suite():
        ok, err, _ = be.run_case(be.SampanBackend, c)
        counts[op] = counts.get(op, 0) + 1
        if not ok:
            failed[c.name] = err
    assert not failed, failed
    assert counts == CONTROL


# ---------------------------------------------------------------------- helpers
def _vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def _f(name, shape):
    return _vi(name, TensorProto.FLOAT, shape)


def _model(nodes, inputs, outputs, opset=17, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _const(name, a):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(
        np.asarray(a), name + "_v"))


def _while_model():
    """x doubled while its sum is below `limit` (a data-dependent condition), at most M
    times; M and limit are graph inputs."""
    body = helper.make_graph(
        [_const("two", np.float32(2)), helper.make_node("Mul", ["x_in", "two"], ["x_out"]),
         helper.make_node("ReduceSum", ["x_out"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["c_out"])],
        "body", [_vi("i", TensorProto.INT64, []), _vi("c_in", TensorProto.BOOL, []),
                 _f("x_in", [3])],
        [_vi("c_out", TensorProto.BOOL, []), _f("x_out", [3])])
    loop = helper.make_node("Loop", ["M", "c0", "x"], ["y"], body=body)
    first = [helper.make_node("ReduceSum", ["x"], ["s0"], keepdims=0),
             helper.make_node("Less", ["s0", "limit"], ["c0"])]
    return _model(first + [loop], [_vi("M", TensorProto.INT64, []), _f("limit", []),
                                   _f("x", [3])], [_f("y", [3])])


def _numpy_while(m, limit, x):
    i = 0
    while i < m and x.sum() < limit:
        x = x * 2
        i += 1
    return x


def _scan_model(reverse=False, axis=0):
    """A running sum over axis `axis` of x (optionally backwards), the state a graph
    input, the body reading `scale` from the enclosing graph."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "scale"], ["y_t"])],
        "body", [_f("s_in", [2]), _f("x_t", [2])], [_f("s_out", [2]), _f("y_t", [2])])
    shape = [4, 2] if axis == 0 else [2, 4]
    node = helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[int(reverse)],
                            scan_output_directions=[int(reverse)],
                            scan_input_axes=[axis], scan_output_axes=[axis])
    return _model([_const("scale", np.float32(0.5)), node], [_f("s0", [2]), _f("x", shape)],
                  [_f("s", [2]), _f("ys", shape)])


def _numpy_scan(s, x, reverse, axis):
    xs = np.moveaxis(x, axis, 0)
    order = range(len(xs) - 1, -1, -1) if reverse else range(len(xs))
    ys = np.zeros_like(xs)
    for t in order:
        s = s + xs[t]
        ys[t] = s * 0.5
    return s, np.moveaxis(ys, 0, axis)


# ---------------------------------------------------------------------- eager import
def test_loop_with_a_data_condition_and_trip_count_runs_eagerly():
    layer = sampan.onnx.to_layer(_while_model())
    x = np.array([1, 2, 3], np.float32)
    for m, limit in ((10, 50.0), (2, 1000.0), (0, 50.0), (5, 1.0)):
        y = layer(np.array(m, np.int64), np.array(limit, np.float32), x)
        np.testing.assert_array_equal(y.numpy(), _numpy_while(m, limit, x))


@pytest.mark.parametrize("reverse,axis", [(False, 0), (True, 0), (True, 1)])
def test_scan_directions_and_axes_match_numpy(reverse, axis):
    rng = np.random.default_rng(0)
    s0 = rng.standard_normal(2).astype(np.float32)
    x = rng.standard_normal([4, 2] if axis == 0 else [2, 4]).astype(np.float32)
    s, ys = be.prepare(_scan_model(reverse, axis)).run([s0, x])
    want_s, want_ys = _numpy_scan(s0, x, reverse, axis)
    np.testing.assert_allclose(s, want_s, rtol=1e-6)
    np.testing.assert_allclose(ys, want_ys, rtol=1e-6)


def test_sequence_ops_with_constant_positions():
    """SplitToSequence -> SequenceErase / SequenceInsert at constant positions ->
    SequenceAt, SequenceLength and ConcatFromSequence (new axis)."""
    nodes = [helper.make_node("SplitToSequence", ["x"], ["sq"], axis=0, keepdims=0),
             _const("p0", np.int64(0)), _const("pm1", np.int64(-1)),
             helper.make_node("SequenceErase", ["sq", "p0"], ["sq1"]),
             helper.make_node("SequenceInsert", ["sq1", "z", "pm1"], ["sq2"]),
             helper.make_node("SequenceLength", ["sq2"], ["n"]),
             helper.make_node("SequenceAt", ["sq2", "p0"], ["first"]),
             helper.make_node("ConcatFromSequence", ["sq2"], ["st"], axis=0, new_axis=1)]
    m = _model(nodes, [_f("x", [3, 2]), _f("z", [2])],
               [_vi("n", TensorProto.INT64, []), _f("first", [2]), _f("st", [3, 2])])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    z = np.array([-1, -2], np.float32)
    n, first, st = be.prepare(m).run([x, z])
    assert int(n) == 3
    np.testing.assert_array_equal(first, x[1])
    np.testing.assert_array_equal(st, np.stack([x[1], z, x[2]]))


def test_sequence_position_from_data_is_refused_under_jit():
    """Eagerly a position computed from data is known; in a traced program a sequence
    has no place to be, so the node is named."""
    nodes = [helper.make_node("SplitToSequence", ["x"], ["sq"], axis=0),
             helper.make_node("ArgMax", ["v"], ["p"], keepdims=0),
             helper.make_node("SequenceAt", ["sq", "p"], ["y"], name="pick")]
    m = _model(nodes, [_f("x", [3, 2]), _f("v", [3])], [_f("y", [1, 2])])
    layer = sampan.onnx.to_layer(m)
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    v = np.array([0, 5, 1], np.float32)
    np.testing.assert_array_equal(layer(x, v).numpy(), x[1:2])
    with pytest.raises(OnnxError, match=r"'pick' \(SequenceAt.*position must be known"):
        sampan.onnx.load(m)


def test_malformed_bodies_are_refused_when_read():
    body = helper.make_graph([], "b", [_f("only", [1])], [_f("only", [1])])
    m = _model([helper.make_node("Loop", ["", "", "x"], ["y"], name="lp", body=body)],
               [_f("x", [1])], [_f("y", [1])])
    with pytest.raises(OnnxError, match=r"'lp' \(Loop\): the body takes 1 inputs"):
        sampan.onnx.to_layer(m)


# ---------------------------------------------------------------------- traced import
def _if_model():
    """y = x * 2 if sum(x) > 0 else x - scale (scale read from the enclosing graph)."""
    then_b = helper.make_graph([_const("two", np.float32(2)),
                                helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                               [_f("t", [3])])
    else_b = helper.make_graph([helper.make_node("Sub", ["x", "scale"], ["e"])], "else", [],
                               [_f("e", [3])])
    nodes = [_const("scale", np.float32(0.5)),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), _const("z", np.float32(0)),
             helper.make_node("Greater", ["s", "z"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_b, else_branch=else_b)]
    return _model(nodes, [_f("x", [3])], [_f("y", [3])])


def _jit(m, *args):
    layer = sampan.onnx.to_layer(m)
    layer.eval()
    ts = tuple(sampan.tensor(a) for a in args)
    f = sampan.onnx.importer.compile_layer(layer, ts)
    return layer, f


@pytest.mark.parametrize("kind", ["if", "while", "scan"])
def test_traced_import_holds_one_control_flow_node_and_matches_eager(kind):
    rng = np.random.default_rng(1)
    if kind == "if":
        m, op = _if_model(), "cond"
        feeds = [[np.array([1, 2, 3], np.float32)], [np.array([-1, -2, 0.5], np.float32)]]
    elif kind == "while":
        m, op = _while_model(), "while_loop"
        x = np.array([1, 2, 3], np.float32)
        feeds = [[np.array(10, np.int64), np.array(50, np.float32), x],
                 [np.array(2, np.int64), np.array(1e4, np.float32), x]]
    else:
        m, op = _scan_model(True, 1), "scan"
        feeds = [[rng.standard_normal(2).astype(np.float32),
                  rng.standard_normal((2, 4)).astype(np.float32)] for _ in range(2)]
    layer, f = _jit(m, *feeds[0])
    assert [n.op for n in f.graph.nodes].count(op) == 1
    for args in feeds:
        want = layer(*args)
        got = f(*[sampan.tensor(a) for a in args])
        np.testing.assert_allclose(got.numpy() if not isinstance(got, tuple) else
                                   got[0].numpy(), (want if not isinstance(want, tuple)
                                                    else want[0]).numpy(), rtol=1e-6)


def test_node_suite_cases_traced_are_control_flow_nodes():
    """The suite's If and Scan cases under sampan.jit: one cond / scan node each, equal to
    the suite's outputs; its Loop cases take the trip count M as a graph input and stack
    scan outputs, so a traced program (statically shaped) refuses them naming M."""
    from onnx import numpy_helper
    cases = {c.name: c for _, c in _suite()}
    for name, op in (("test_if", "cond"), ("test_scan9_sum", "scan"),
                     ("test_scan9_multi_state", "scan"), ("test_scan_sum", "scan")):
        ins, refs = cases[name].data_sets[0]
        ins = [numpy_helper.to_array(a) if not isinstance(a, np.ndarray) else a for a in ins]
        refs = [numpy_helper.to_array(a) if not isinstance(a, np.ndarray) else a for a in refs]
        layer, f = _jit(cases[name].model, *ins)
        assert op in [n.op for n in f.graph.nodes], name
        out = f(*[sampan.tensor(a) for a in ins])
        _same([t.numpy() for t in (out if isinstance(out, tuple) else (out,))], refs)
    loop11 = cases["test_loop11"]
    with pytest.raises(OnnxError, match=r"Loop.*the trip count M is computed from data"):
        sampan.onnx.load(loop11.model)
    # with M and the condition constants, its body still slices at the iteration number
    # (a Slice start must be known when the graph is built): the loop unrolls
    (m, c, y), refs = [[np.asarray(a) for a in d] for d in loop11.data_sets[0]]
    layer, f = _jit(be._bind_inputs(loop11.model, {"trip_count": m, "cond": c}), y)
    assert not [n for n in f.graph.nodes if n.blocks]
    _same([t.numpy() for t in f(sampan.tensor(y))], refs)


def test_loop_with_a_fixed_trip_count_is_one_scan_node():
    """A Loop with a constant M and its condition passed through unchanged, traced: one
    scan over the iteration numbers, carrying the accumulator and stacking the rows."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["acc_in", "fi"], ["acc_out"]),
         helper.make_node("Mul", ["acc_out", "w"], ["row"])],
        "body", [_vi("i", TensorProto.INT64, []), _vi("c_in", TensorProto.BOOL, []),
                 _f("acc_in", [2])], [_vi("c_out", TensorProto.BOOL, []), _f("acc_out", [2]),
                                      _f("row", [2])])
    nodes = [_const("M", np.int64(5)), _const("T", np.bool_(True)),
             helper.make_node("Loop", ["M", "T", "a"], ["acc", "rows"], body=body)]
    m = _model(nodes, [_f("a", [2]), _f("w", [2])], [_f("acc", [2]), _f("rows", [5, 2])])
    a, w = np.array([1, -1], np.float32), np.array([0.5, 2], np.float32)
    layer, f = _jit(m, a, w)
    assert [n.op for n in f.graph.nodes] == ["scan"]
    acc, rows = f(sampan.tensor(a), sampan.tensor(w))
    want_rows, s = [], a.copy()
    for i in range(5):
        s = s + i
        want_rows.append(s * w)
    np.testing.assert_allclose(acc.numpy(), s)
    np.testing.assert_allclose(rows.numpy(), np.stack(want_rows))


# ---------------------------------------------------------------------- export
ort = pytest.importorskip("onnxruntime")


def _export_run(fn, args, tmp_path, name, **kw):
    """Export jitted `fn` at `args`, run it in onnxruntime and back through sampan's own
    importer, eagerly and traced (where If/Loop/Scan become cond/while_loop/scan nodes
    again); returns (the model, onnxruntime's outputs, sampan-imported outputs)."""
    ts = tuple(sampan.tensor(a) for a in args)
    p = str(tmp_path / f"{name}.onnx")
    with sampan.no_grad():
        model = sampan.onnx.export(sampan.jit(fn), ts, p, **kw)
    sess = ort.InferenceSession(p)
    feeds = {i.name: a for i, a in zip(sess.get_inputs(), args)}
    got = sess.run(None, feeds)
    back = be.prepare(model).run(list(args))
    layer, f = _jit(model, *args)
    assert [n.op for n in f.graph.nodes if n.blocks], "the traced import lost the node"
    with sampan.no_grad():
        traced = f(*[sampan.tensor(a) for a in args])
    _same([t.numpy() for t in (traced if isinstance(traced, tuple) else (traced,))], got)
    return model, got, list(back)


def _eager(fn, args):
    with sampan.no_grad():
        out = fn(*[sampan.tensor(a) for a in args])
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def _ops(model):
    return [n.op_type for n in model.graph.node]


def _same(got, want, rtol=1e-5):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)


def test_export_cond_is_if_and_onnxruntime_takes_each_branch(tmp_path):
    w = np.array([0.5, -1.0, 2.0], np.float32)

    def f(x):
        wt = sampan.tensor(w)     # read by one branch: a captured input
        return sampan.cond(x.sum() > 0, lambda a: a * wt, lambda a: a - 1.0, x)
    for k, x in enumerate((np.array([1, 2, 3], np.float32), np.array([-4, 2, 1], np.float32))):
        model, got, back = _export_run(f, (x,), tmp_path, f"cond{k}")
        assert "If" in _ops(model)
        _same(got, _eager(f, (x,)))
        _same(back, _eager(f, (x,)))


@pytest.mark.parametrize("limit", [None, 3])
def test_export_while_loop_is_loop(tmp_path, limit):
    x = np.array([1, -2, 3], np.float32)

    def f(x):
        def cond(i, s):
            return s.sum() < 100.0
        def body(i, s):
            return i + 1, s * 2.0 + x
        return sampan.while_loop(cond, body, (sampan.tensor(np.array(0, np.int64)), x),
                                 max_iterations=limit)
    model, got, back = _export_run(f, (x,), tmp_path, "while")
    loop = [n for n in model.graph.node if n.op_type == "Loop"]
    assert len(loop) == 1 and (loop[0].input[0] != "") == (limit is not None)
    want = _eager(f, (x,))
    _same(got, want)
    _same(back, want)


@pytest.mark.parametrize("reverse", [False, True])
def test_export_scan_is_scan_with_directions(tmp_path, reverse):
    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 3)).astype(np.float32) * 0.3
    h0 = rng.standard_normal((2, 3)).astype(np.float32)
    xs = rng.standard_normal((6, 2, 3)).astype(np.float32)

    def f(h, xs):
        wt = sampan.tensor(w)
        def step(h, x):
            h2 = sampan.tanh(h @ wt + x)
            return h2, h2 * 2.0
        return sampan.scan(step, h, xs, reverse=reverse)
    model, got, back = _export_run(f, (h0, xs), tmp_path, "scan")
    (scan,) = [n for n in model.graph.node if n.op_type == "Scan"]
    dirs = {a.name: list(a.ints) for a in scan.attribute}
    assert dirs.get("scan_input_directions", [0]) == [int(reverse)]
    want = _eager(f, (h0, xs))
    _same(got, want)
    _same(back, want)


def test_export_greedy_decode_with_a_transformer_body(tmp_path):
    """A greedy decode: a while_loop (stop at end-of-text or a full buffer) whose body runs
    a small transformer on the token buffer; onnxruntime's tokens equal sampan's."""
    from sampan import nn
    block, eot = 8, 3
    rng = np.random.default_rng(0)

    class Tiny(nn.Layer):
        def __init__(self, vocab=11, d=16):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(block, d)
            self.blk, self.ln = nn.TransformerDecoderBlock(d, 2), nn.LayerNorm(d)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(sampan.arange(idx.shape[1]))
            return self.ln(self.blk(x)) @ self.tok.weight.transpose(0, 1)
    model = Tiny()
    model.eval()

    def decode(buf, start):
        pos = sampan.arange(block)

        def cond(i, b, last):
            return sampan.logical_and(i < block, last != eot)

        def body(i, b, last):
            logits = model(b)
            at = sampan.cast(sampan.reshape(pos == i - 1, (1, block, 1)), logits.dtype)
            nxt = sampan.argmax(sampan.sum(logits * at, dim=1), dim=-1)
            b = sampan.where(sampan.reshape(pos == i, (1, block)), sampan.reshape(nxt, (1, 1)),
                             b)
            return i + 1, b, sampan.reshape(nxt, ())
        _, b, _ = sampan.while_loop(cond, body, (start, buf, sampan.tensor(np.array(0))),
                                    max_iterations=block)
        return b
    buf = np.zeros((1, block), np.int64)
    buf[0, :2] = rng.integers(0, 11, 2)
    args = (buf, np.array(2, np.int64))
    onnx_model, got, back = _export_run(decode, args, tmp_path, "decode")
    assert "Loop" in _ops(onnx_model)
    want = _eager(decode, args)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(back[0], want[0])


def test_export_nested_control_flow(tmp_path):
    """A cond inside a scan body inside a while_loop body: subgraphs in subgraphs, each
    reading the enclosing graphs' values by name."""
    w = np.array([0.5, 2.0, -1.0], np.float32)

    def inner(h, xs):
        wt = sampan.tensor(w)

        def step(h, x):
            h2 = sampan.cond(x.sum() > 0, lambda a, b: a + b * wt, lambda a, b: a - b, h, x)
            return h2, h2 * 1.0
        return sampan.scan(step, h, xs)

    def f(x):
        def body(i, s):
            s2, ys = inner(s, sampan.stack([s, -s * 0.5, s + 1.0]))
            return i + 1, s2 + ys.sum(0)
        return sampan.while_loop(lambda i, s: i < 3, body, (sampan.tensor(np.array(0)), x))
    x = np.array([1, -2, 0.5], np.float32)
    model, got, back = _export_run(f, (x,), tmp_path, "nested")
    want = _eager(f, (x,))
    _same(got, want)
    _same(back, want)


def test_branches_of_different_shapes_run_eagerly_and_are_refused_traced():
    then_b = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                               [_f("t", [3])])
    else_b = helper.make_graph([_const("k", np.array([0, 1], np.int64)),
                                helper.make_node("Gather", ["x", "k"], ["e"])], "else", [],
                               [_f("e", [2])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             _const("z", np.float32(0)), helper.make_node("Greater", ["s", "z"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="branchy", then_branch=then_b,
                              else_branch=else_b)]
    m = _model(nodes, [_f("x", [3])], [_f("y", [None])])
    layer = sampan.onnx.to_layer(m)
    assert layer(np.ones(3, np.float32)).shape == (3,)
    assert layer(-np.ones(3, np.float32)).shape == (2,)
    with pytest.raises(OnnxError, match=r"'branchy' \(If.*f32\[3\].*f32\[2\]"):
        sampan.onnx.load(m)


def test_saved_program_with_a_while_loop_exports(tmp_path):
    """A program saved by sampan.jit.save with a while_loop converts to ONNX (the CLI's
    `sampan onnx export` path) and onnxruntime runs it."""
    from sampan.onnx.export import save_model, saved_to_model

    def f(x):
        return sampan.while_loop(lambda i, s: s.sum() < 50.0,
                                 lambda i, s: (i + 1, s * 2.0 + 1.0),
                                 (sampan.tensor(np.array(0, np.int64)), x), max_iterations=10)
    x = np.array([1, 2, 3], np.float32)
    prog = sampan.jit.save(f, str(tmp_path / "prog"), (sampan.tensor(x),))
    path = save_model(saved_to_model(prog), str(tmp_path / "m.onnx"))
    sess = ort.InferenceSession(path)
    _same(sess.run(None, {sess.get_inputs()[0].name: x}), _eager(f, (x,)))
