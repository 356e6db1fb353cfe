"""Issue 34: under `sampan.profiler`, an eager `while_loop` / `scan` is one "control" span
holding its iteration count, with the ops its body ran nested under it and summarised on
it per op (calls, total and self time); the tables and the advisor still add up."""
import numpy as np

import sampan
from sampan.profiler import profile
from sampan.profiler.tables import self_times


def _inside(e, span):
    return e.tid == span.tid and span.ts <= e.ts and e.end <= span.end


def test_eager_while_loop_is_one_span_with_its_iterations_and_ops():
    i0, s0 = sampan.tensor(np.array(0, np.int64)), sampan.ones(4)
    with profile() as prof:
        i, s = sampan.while_loop(lambda i, s: i < 5, lambda i, s: (i + 1, s * 2.0), (i0, s0))
    assert int(i.numpy()) == 5
    np.testing.assert_array_equal(s.numpy(), np.full(4, 32.0, np.float32))
    loops = [e for e in prof.events if e.cat == "control"]
    assert [(e.name, e.args["iterations"]) for e in loops] == [("while_loop", 5)]
    loop = loops[0]
    ops = [e for e in prof.events if e.cat == "op"]
    assert ops and all(_inside(e, loop) for e in ops)     # every body op folded under it
    summary = loop.args["ops"]
    assert summary["mul"]["calls"] == 5 and summary["add"]["calls"] == 5
    assert summary["lt"]["calls"] == 6                   # the condition runs once more
    assert sum(r["calls"] for r in summary.values()) == len(ops)
    assert summary["mul"]["total_ns"] == sum(e.dur for e in ops if e.name == "mul")
    # self times still add up: the loop's own is its duration less the ops in it
    selfs = self_times(prof.events)
    assert selfs[id(loop)] >= 0
    assert selfs[id(loop)] + sum(r["self_ns"] for r in summary.values()) == loop.dur
    table = prof.key_averages()
    row = table.row("while_loop", "control")
    assert row.calls == 1 and row.self_ns == selfs[id(loop)]
    assert table.row("mul", "op").calls == 5
    assert sum(r.self_ns for r in table) <= prof.wall_ns
    prof.advise()                                          # the rules read it as before


def test_eager_scan_span_nested_loops_and_trace(tmp_path):
    xs = sampan.tensor(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    w = sampan.tensor(np.eye(3, dtype=np.float32) * 0.5)

    def step(h, x):
        j, _ = sampan.while_loop(lambda j, a: j < 2, lambda j, a: (j + 1, a + 1.0),
                                 (sampan.tensor(np.array(0, np.int64)), x))
        h = sampan.tanh(h @ w + x)
        return h, h
    with profile() as prof:
        h, hs = sampan.scan(step, sampan.zeros(3), xs)
    ref = np.zeros(3, np.float32)
    for x in xs.numpy():
        ref = np.tanh(ref @ (np.eye(3, dtype=np.float32) * 0.5) + x)
    np.testing.assert_allclose(h.numpy(), ref, rtol=1e-6)
    ctrl = [e for e in prof.events if e.cat == "control"]
    scans = [e for e in ctrl if e.name == "scan"]
    inner = [e for e in ctrl if e.name == "while_loop"]
    assert [e.args["iterations"] for e in scans] == [4]
    assert len(inner) == 4 and all(e.args["iterations"] == 2 and _inside(e, scans[0])
                                   for e in inner)
    ops = scans[0].args["ops"]
    assert ops["matmul"]["calls"] == 4 and ops["tanh"]["calls"] == 4
    # the inner loops' adds count too: j + 1 and a + 1 twice each, four times; then h @ w + x
    assert ops["add"]["calls"] == 4 * 2 * 2 + 4
    assert all(e.args["ops"]["add"]["calls"] == 4 for e in inner)
    import json
    trace = json.load(open(prof.export_chrome_trace(str(tmp_path / "t.json"))))
    spans = [t for t in trace["traceEvents"] if t.get("cat") == "control"]
    assert len(spans) == 5 and spans[0]["args"]["iterations"] == 4


def test_no_span_outside_a_profile_and_on_error():
    i0 = sampan.tensor(np.array(0, np.int64))
    sampan.while_loop(lambda i: i < 2, lambda i: i + 1, i0)     # not profiling: nothing

    def bad(i):
        raise ValueError("body failed")
    with profile() as prof:
        try:
            sampan.while_loop(lambda i: i < 2, bad, i0)
        except ValueError:
            pass
    loops = [e for e in prof.events if e.cat == "control"]
    assert [(e.name, e.args["iterations"]) for e in loops] == [("while_loop", 0)]
