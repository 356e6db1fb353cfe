"""float16 autocast + GradScaler trains a small W1-like MLP (ReLU, softmax cross-entropy,
SGD momentum) to the accuracy float32 training reaches on the same planted task."""
import numpy as np

import sampan
from sampan.amp import GradScaler, autocast


def _data(n=512, d=32, k=4, seed=0):
    r = np.random.default_rng(seed)
    w = r.standard_normal((d, k)).astype(np.float32)
    x = r.standard_normal((n, d)).astype(np.float32)
    return x, (x @ w).argmax(1)


def _train(x, y, half, steps=120, batch=64):
    r = np.random.default_rng(1)
    dims = [x.shape[1], 64, 64, 4]
    p = []
    for a, b in zip(dims[:-1], dims[1:]):
        k = 1 / np.sqrt(a)
        p += [sampan.tensor(r.uniform(-k, k, (a, b)).astype(np.float32), requires_grad=True),
              sampan.tensor(np.zeros(b, np.float32), requires_grad=True)]
    opt = sampan.optim.SGD(p, lr=0.05, momentum=0.9)
    scaler = GradScaler(init_scale=2.0 ** 16, growth_interval=50, enabled=half)

    def fwd(xb):
        h = sampan.relu(xb @ p[0] + p[1])
        h = sampan.relu(h @ p[2] + p[3])
        return h @ p[4] + p[5]
    for i in range(steps):
        j = (i * batch) % len(x)
        xb, yb = sampan.tensor(x[j:j + batch]), sampan.tensor(y[j:j + batch])
        opt.zero_grad()
        with autocast(sampan.float16, enabled=half):
            loss = sampan.cross_entropy(fwd(xb), yb)
        assert loss.dtype == np.float32
        scaler.scale(loss).backward()
        assert p[0].grad.dtype == np.float32
        scaler.step(opt)
        scaler.update()
    with autocast(sampan.float16, enabled=half), sampan.no_grad():
        pred = fwd(sampan.tensor(x)).numpy().argmax(1)
    return float((pred == y).mean()), scaler


def test_float16_with_grad_scaler_reaches_float32_accuracy():
    x, y = _data()
    acc32, _ = _train(x, y, half=False)
    acc16, scaler = _train(x, y, half=True)
    assert acc32 > 0.85
    assert acc16 >= acc32 - 0.02, (acc16, acc32)
    assert scaler.get_scale() >= 2.0 ** 10      # the scale stayed useful
