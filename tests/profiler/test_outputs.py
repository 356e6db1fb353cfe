"""The profiler's outputs: the Chrome trace against the trace-event format, the
key_averages table's arithmetic, the memory timeline against a hand count, and the
`sampan profile` command."""
import json
import threading

import pytest

import sampan
from sampan import profiler
from sampan.cli import main as sampan_main


def _check_chrome_trace(doc):
    """A checker of the Chrome trace-event format (the subset ui.perfetto.dev reads):
    required keys per phase, microsecond ts/dur >= 0, per-thread time order, names."""
    assert set(doc) >= {"traceEvents"} and isinstance(doc["traceEvents"], list)
    need = {"X": {"name", "ph", "ts", "dur", "pid", "tid", "cat"},
            "C": {"name", "ph", "ts", "pid", "args"},
            "i": {"name", "ph", "ts", "pid", "tid", "s"},
            "M": {"name", "ph", "pid", "args"}}
    last, named = {}, set()
    for e in doc["traceEvents"]:
        assert e["ph"] in need, e
        assert need[e["ph"]] <= set(e), e
        assert isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "thread_sort_index")
            if e["name"] == "thread_name":
                assert isinstance(e["args"]["name"], str)
                named.add(e["tid"])
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
        key = (e["pid"], e.get("tid"))
        assert e["ts"] >= last.get(key, 0), "not in time order on its thread"
        last[key] = e["ts"]
    assert {t for _, t in last} <= named | {None}
    return doc["traceEvents"]


def _work():
    x = sampan.randn(16, 16, requires_grad=True)
    with profiler.record("step"):
        y = (x @ x).relu().sum()
        y.backward()
    t = threading.Thread(target=lambda: sampan.ones(4) * 2, name="helper")
    t.start()
    t.join()


def test_chrome_trace_is_valid_and_matches_the_events(tmp_path):
    with profiler.profile() as prof:
        _work()
    path = prof.export_chrome_trace(str(tmp_path / "t.json"))
    evs = _check_chrome_trace(json.loads(open(path).read()))
    xs = [e for e in evs if e["ph"] == "X"]
    spans = [e for e in prof.events if e.cat != "memory"]
    assert len(xs) == len(spans)
    for e, x in zip(spans, xs):          # same order, the clock in microseconds
        assert x["name"] == e.name and x["tid"] == e.tid
        assert x["ts"] == pytest.approx((e.ts - prof.start_ns) / 1e3)
        assert x["dur"] == pytest.approx(e.dur / 1e3)
    names = {e["args"]["name"] for e in evs if e["name"] == "thread_name"}
    assert {"MainThread", "helper"} <= names
    counters = [e for e in evs if e["ph"] == "C"]
    assert counters and all(e["name"] == "memory" for e in counters)
    mm = next(x for x in xs if x["name"] == "matmul")
    assert mm["args"]["shapes"] == [[16, 16], [16, 16]]


def test_key_averages_self_time_and_totals():
    with profiler.profile() as prof:
        _work()
    table = prof.key_averages()
    spans = [e for e in prof.events if e.cat != "memory"]
    assert sum(r.calls for r in table) == len(spans)
    assert sum(r.total_ns for r in table) == sum(e.dur for e in spans)
    for r in table:
        assert 0 <= r.self_ns <= r.total_ns
    # self time of the step = its duration less its direct children (on its thread)
    step = next(e for e in prof.events if e.name == "step")
    kids = [e for e in spans if e is not step and e.tid == step.tid
            and step.ts <= e.ts and e.ts + e.dur <= step.ts + step.dur]
    direct = [k for k in kids if not any(o is not k and o.ts <= k.ts and
                                         k.ts + k.dur <= o.ts + o.dur for o in kids)]
    assert table.row("step").self_ns == step.dur - sum(k.dur for k in direct)
    # per thread, self times add up to the thread's top-level span time
    main = threading.get_ident()
    top = [e for e in spans if e.tid == main and not any(
        o is not e and o.tid == main and o.ts <= e.ts and e.ts + e.dur <= o.ts + o.dur
        for o in spans)]
    from sampan.profiler.tables import self_times
    st = self_times(prof.events)
    assert sum(st[id(e)] for e in spans if e.tid == main) == sum(e.dur for e in top)
    mm = table.row("matmul")
    assert mm.flops == 2 * 16 ** 3 * 3 and mm.gflops == pytest.approx(mm.flops / mm.total_ns)
    text = table.table(sort_by="self_time", row_limit=3)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["name", "cat", "calls"] and len(lines) == 2 + 3 + 1
    selfs = [float(ln.split()[4]) for ln in lines[2:5]]
    assert selfs == sorted(selfs, reverse=True)
    by_shape = prof.key_averages(group_by_input_shape=True)
    assert any(r.shapes for r in by_shape) and len(by_shape) >= len(table)
    with pytest.raises(sampan.errors.SampanError, match="sort_by"):
        table.table(sort_by="bogus")


def test_memory_timeline_against_a_hand_count():
    a = sampan.ones(1000)                            # before the profile: not counted
    with profiler.profile() as prof:
        b = a * a                                    # +4000 (mul)
        c = b + a                                    # +4000 (add)   -> 8000
        d = c.reshape(10, 100)                       # a view: +0
        e = sampan.exp(a)                            # +4000 (exp)   -> 12000 peak
        del b, c, d                                  # -8000          -> 4000
        f = sampan.tanh(a[:500])                     # +2000 (tanh)  -> 6000
        del e                                        # -4000          -> 2000
    tl = prof.memory_timeline()
    assert tl.peak_bytes == 12000
    assert tl.peak_ops == {"mul": 4000, "add": 4000, "exp": 4000}
    # b and c are freed one after the other (in either order: 4000 bytes each)
    assert tl.bytes_live == [4000, 8000, 12000, 8000, 4000, 6000, 2000]
    assert tl.allocations == 4 and tl.allocated_bytes == 14000
    assert tl.times_ns == sorted(tl.times_ns)
    assert "peak 11.7 KiB" in str(tl)
    assert f.shape == (500,)


def test_profile_command_runs_a_script(tmp_path, capsys):
    script = tmp_path / "work.py"
    script.write_text("import sys\nimport sampan\nx = sampan.ones(8)\n"
                      "for _ in range(int(sys.argv[1])):\n    x = x + 1\n"
                      "print('result', x.sum().item(), sys.argv[2:])\n")
    out = tmp_path / "trace.json"
    rc = sampan_main(["profile", str(script), "4", "--keep", "-o", str(out),
                      "--sort", "calls"])
    text = capsys.readouterr().out
    assert rc == 0
    assert "result 40.0 ['--keep']" in text                   # the script's own output
    row = next(ln for ln in text.splitlines() if ln.startswith("add "))
    assert row.split()[2] == "4"                              # calls
    assert "memory: peak" in text and str(out) in text
    evs = _check_chrome_trace(json.loads(out.read_text()))
    assert sum(1 for e in evs if e.get("name") == "add" and e["ph"] == "X") == 4


def test_profile_command_reports_a_failing_script(tmp_path, capsys):
    script = tmp_path / "bad.py"
    script.write_text("import sampan\nsampan.ones(2) + 1\nraise SystemExit(3)\n")
    out = tmp_path / "t.json"
    assert sampan_main(["profile", "-o", str(out), str(script)]) == 3
    assert out.exists() and "add" in capsys.readouterr().out
    assert not profiler.recorder.ACTIVE
