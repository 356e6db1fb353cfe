"""W5 pruning figure: the W2 LeNet-5 trained on a planted 10-class 28x28 task, then
(a) 50% unstructured magnitude pruning and (b) 50% structured channel pruning (conv1 6->3,
conv2 16->8, fc1 120->60, fc2 84->42), each fine-tuned briefly; one table of parameters,
sparsity, saved size, test accuracy and the saved program's latency (batch 1 p50/p99, and
batch 64), all in one run. Usage: python benchmarks/w5_prune.py [--steps N] [--repeats N]

The planted task: each class is a fixed random 28x28 pattern (smoothed), an image is its
class pattern at a random shift of up to 2 pixels plus Gaussian noise."""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import sampan  # noqa: E402
from sampan import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models as M  # noqa: E402


def lenet():
    net = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                        nn.Linear(84, 10))
    w = M.w2_weights()
    for layer, (k, b) in zip([net[0], net[3], net[7], net[9], net[11]],
                             [("c1", "c1b"), ("c2", "c2b"), ("f1", "f1b"), ("f2", "f2b"),
                              ("f3", "f3b")]):
        layer.weight._data[...] = w[k]
        layer.bias._data[...] = w[b]
    return net


def planted(n, seed, noise=1.6):
    r0 = np.random.default_rng(1234)
    p = r0.standard_normal((10, 32, 32))
    p = (p + np.roll(p, 1, 1) + np.roll(p, 1, 2) + np.roll(p, (1, 1), (1, 2))) / 2
    r = np.random.default_rng(seed)
    y = r.integers(0, 10, n)
    dy, dx = r.integers(0, 5, n), r.integers(0, 5, n)
    x = np.stack([p[c, a:a + 28, b:b + 28] for c, a, b in zip(y, dy, dx)])[:, None]
    x = x + noise * r.standard_normal(x.shape)
    return x.astype(np.float32), y


def train(net, x, y, steps, lr, batch=64):
    opt = sampan.optim.Adam(net.parameters(), lr=lr)
    net.train()
    n = len(x)
    for i in range(steps):
        j = (i * batch) % (n - batch)
        opt.zero_grad()
        loss = sampan.cross_entropy(net(sampan.from_numpy(x[j:j + batch])),
                                    sampan.from_numpy(y[j:j + batch]))
        loss.backward()
        opt.step()
    net.eval()


def accuracy(net, x, y):
    with sampan.no_grad():
        pred = np.concatenate([net(sampan.from_numpy(x[i:i + 500])).numpy().argmax(1)
                               for i in range(0, len(x), 500)])
    return float((pred == y).mean())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500, help="dense training steps")
    ap.add_argument("--finetune", type=int, default=300, help="fine-tuning steps")
    ap.add_argument("--repeats", type=int, default=2000)
    a = ap.parse_args()
    xtr, ytr = planted(12000, 1)
    xte, yte = planted(3000, 2)
    sampan.manual_seed(0)
    t0 = time.perf_counter()
    dense = lenet()
    train(dense, xtr, ytr, a.steps, 1e-3)
    print(f"dense: {a.steps} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    mag = copy.deepcopy(dense)
    sampan.prune.magnitude(mag, 0.5)
    train(mag, xtr, ytr, a.finetune, 3e-4)
    sampan.prune.remove(mag)
    ch = copy.deepcopy(dense)
    print(sampan.prune.channels(ch, 0.5, example_inputs=(sampan.from_numpy(xte[:1]),)))
    before_ft = accuracy(ch, xte, yte)
    train(ch, xtr, ytr, a.finetune, 3e-4)
    print(f"channel-pruned accuracy before fine-tuning: {before_ft:.2%}", flush=True)
    models = {"dense": dense, "magnitude 50%": mag, "channels 50%": ch}
    acc = lambda m: accuracy(m, xte, yte)  # noqa: E731
    print("\nbatch 1:")
    sampan.prune.report(models, (sampan.from_numpy(xte[:1]),), accuracy=acc,
                        repeats=a.repeats)
    print("\nbatch 64:")
    sampan.prune.report(models, (sampan.from_numpy(xte[:64]),), repeats=a.repeats // 4)


if __name__ == "__main__":
    main()
