"""Grad-ready hooks (a leaf's .grad is final: fired during backward, not after it) and
end-of-backward callbacks, which DataParallel builds its overlap on."""
import numpy as np

import sampan
from sampan.autograd.hooks import READY, queue_callback, register_grad_ready_hook


def test_ready_hooks_fire_during_backward_in_dependency_order_then_callbacks():
    w1 = sampan.tensor(np.ones(3, np.float32), requires_grad=True)
    w2 = sampan.tensor(np.full(3, 2.0, np.float32), requires_grad=True)
    x = sampan.tensor(np.arange(3, dtype=np.float32))
    events = []

    def on_ready(name):
        def hook(t):
            events.append((name, t.grad.numpy().copy()))
            if name == "w2":
                queue_callback(lambda: events.append(("end", None)))
        return hook

    before = READY["leaves"]
    h1 = register_grad_ready_hook(w1, on_ready("w1"))
    h2 = register_grad_ready_hook(w2, on_ready("w2"))
    assert READY["leaves"] == before + 2
    # w2 is used last in forward (first in backward), and twice: its hook sees the sum
    y = ((x * w1).exp() * w2 * w2).sum()
    y.backward()
    assert [e[0] for e in events] == ["w2", "w1", "end"]
    e = np.exp(np.arange(3.0))
    np.testing.assert_allclose(events[0][1], 2 * 2.0 * e, rtol=1e-6)     # d/dw2 = 2 w2 e^x
    np.testing.assert_allclose(events[1][1], np.arange(3.0) * e * 4.0, rtol=1e-6)
    h1.remove()
    h2.remove()
    assert READY["leaves"] == before
    events.clear()
    ((x * w1).exp() * w2).sum().backward()
    assert events == []


def test_queue_callback_outside_backward_runs_at_once_and_nested_backward_keeps_its_own():
    ran = []
    queue_callback(lambda: ran.append("now"))
    assert ran == ["now"]
    a = sampan.tensor(np.ones(2, np.float32), requires_grad=True)

    def hook(g):
        b = sampan.tensor(np.ones(2, np.float32), requires_grad=True)
        queue_callback(lambda: ran.append("outer"))
        with sampan.enable_grad():        # a backward inside a hook: its own queue
            (b * 3).sum().backward()
        assert ran == ["now"]
        return g
    z = a * 2
    z.register_hook(hook)
    z.sum().backward()
    assert ran == ["now", "outer"]
