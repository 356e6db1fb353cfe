"""Collectives on the profiler's timeline: each one a "collective" span from its start to
its completion on the thread that started it, and the time a thread blocked in wait()."""
import numpy as np

from sampan import distributed as dist
from sampan.profiler import profile


def test_collectives_of_two_replicas_are_spans_on_their_threads():
    def replica():
        a = np.full(4096, float(dist.rank() + 1), np.float32)
        dist.all_reduce(a, async_op=True).wait()
        dist.broadcast(a, src=0)
        return float(a[0])

    with profile(profile_memory=False) as prof:
        assert dist.spawn(replica, 2) == [3.0, 3.0]
    spans = [e for e in prof.events if e.cat == "collective" and e.name != "wait"]
    assert sorted(e.name for e in spans) == ["all_reduce"] * 2 + ["broadcast"] * 2
    assert len({e.tid for e in spans}) == 2 and all(e.args["ranks"] == 2 for e in spans)
    waits = [e for e in prof.events if e.cat == "collective" and e.name == "wait"]
    assert {e.args["op"] for e in waits} >= {"all_reduce"}
    for w in waits:                 # a wait lies inside its collective's span
        c = next(e for e in spans if e.tid == w.tid and e.args["seq"] == w.args["seq"]
                 and e.name == w.args["op"])
        assert c.ts <= w.ts and w.ts + w.dur <= c.ts + c.dur + 10**6
    with profile(profile_memory=False) as quiet:
        dist.spawn(lambda: dist.all_reduce(np.ones(8, np.float32)), 2)
    assert any(e.cat == "collective" for e in quiet.events)
    n = len(quiet.events)
    dist.spawn(lambda: dist.all_reduce(np.ones(8, np.float32)), 2)   # not profiling
    assert len(quiet.events) == n
