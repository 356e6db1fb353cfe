"""The advisor's exposed_communication rule on traces built to show each case, in the
events the distributed package records (a "collective" span from a Work's start to its
completion, a "wait" where the thread blocked on it, a "backward" span around each walk):
reductions left for after backward, reductions started early that make no progress, and
reductions that finish inside backward (no finding)."""
from sampan.profiler import advisor
from sampan.profiler.events import Event

MS = 10 ** 6


def _trace(buckets, steps=3, step_ms=20, backward=(5, 15), tid=1):
    """`buckets`: (start, end, blocked-from) in ms within a step; blocked-from None:
    found done without a wait."""
    evs = []
    for k in range(steps):
        t0 = k * step_ms * MS
        evs.append(Event("backward", "backward", t0 + backward[0] * MS,
                         (backward[1] - backward[0]) * MS, tid, {"nodes": 40}))
        for i, (a, b, w) in enumerate(buckets):
            seq = k * len(buckets) + i
            evs.append(Event("all_reduce", "collective", t0 + int(a * MS),
                             int((b - a) * MS), tid, {"seq": seq, "ranks": 2}))
            if w is not None:
                evs.append(Event("wait", "collective", t0 + int(w * MS), int((b - w) * MS),
                                 tid, {"op": "all_reduce", "seq": seq}))
    return evs


def _rule(evs):
    return [f for f in advisor.advise(evs) if f.rule == "exposed_communication"]


def test_reductions_left_for_after_backward_are_found():
    # the last bucket starts as backward ends and is waited for: 3 of 5 ms exposed
    (f,) = _rule(_trace([(8, 10, None), (14.9, 18, 15)]))
    assert f.evidence["exposed_ms"] == 9.0 and f.evidence["collective_ms"] == 15.3
    assert f.evidence["exposed_share"] == round(9 / 15.3, 3)
    assert f.evidence["done_during_backward"] == 3 and f.evidence["waits"] == 3
    assert "final bucket small" in f.fix and "order they become ready" in f.fix


def test_reductions_that_never_progress_during_backward_are_found():
    # started early in backward, done only after it, while the thread waits
    (f,) = _rule(_trace([(6, 18, 15), (9, 19, 16)]))
    assert f.evidence["started_early"] == 6 and f.evidence["done_during_backward"] == 0
    assert "between the ops of backward" in f.fix


def test_reductions_that_finish_inside_backward_give_no_finding():
    # all but a short tail overlaps backward: 0.2 of 6.2 ms is waited for
    assert _rule(_trace([(6, 9, None), (10, 13, None), (14.9, 15.2, 15)])) == []
    # and a run without collectives has nothing to say about them
    assert _rule([e for e in _trace([(6, 9, None)]) if e.cat == "backward"]) == []
