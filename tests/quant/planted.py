"""A tiny planted 10-class image task and the small models the quant tests train on it
(W5's intent, shrunk: 1x12x12 images, a 2-conv CNN and a 2-layer MLP, seconds to train)."""
from __future__ import annotations

import numpy as np

import sampan
from sampan import nn

SIDE = 12


def task(n, seed, noise=1.1):
    """(x float32 (n, 1, SIDE, SIDE), y int64): a class template plus Gaussian noise."""
    t = np.random.default_rng(1234).standard_normal((10, 1, SIDE, SIDE)).astype(np.float32)
    r = np.random.default_rng(seed)
    y = r.integers(0, 10, n)
    x = t[y] + noise * r.standard_normal((n, 1, SIDE, SIDE)).astype(np.float32)
    return x.astype(np.float32), y


def cnn(seed=0):
    sampan.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16 * 9, 10))


def mlp(seed=0, hidden=64):
    sampan.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def train(model, x, y, steps=150, lr=0.05, batch=64, seed=0):
    opt = sampan.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    r = np.random.default_rng(seed)
    model.train()
    for _ in range(steps):
        i = r.integers(0, len(x), batch)
        loss = sampan.cross_entropy(model(sampan.Tensor(x[i])), sampan.Tensor(y[i]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return model


def accuracy(fn, x, y):
    out = fn(sampan.Tensor(x))
    return float(np.mean(np.argmax(out.numpy(), 1) == y))
