"""W5 pruning figure: the W2 LeNet-5 trained on a planted 10-class 28x28 task, then
(a) 50% unstructured magnitude pruning and (b) 50% structured channel pruning (conv1 6->3,
conv2 16->8, fc1 120->60, fc2 84->42), each fine-tuned briefly; one table of parameters,
sparsity, saved size, test accuracy and the saved program's latency (batch 1 p50/p99, and
batch 64), all in one run; then one JSON line per (model, batch) and the ratio lines
(`make bench`'s format, with the machine): dense p50 / pruned p50 at batch 1 and 64 (target
1.3x at batch 1 for 50% channels) and each pruned model's accuracy loss in points (target
<= 1). Usage: python benchmarks/w5_prune.py [--steps N] [--repeats N]

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
from common import emit  # noqa: E402


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


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500, help="dense training steps")
    ap.add_argument("--finetune", type=int, default=300, help="fine-tuning steps")
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--train", type=int, default=12000, help="planted training images")
    ap.add_argument("--test", type=int, default=3000, help="planted test images")
    a = ap.parse_args(argv)
    xtr, ytr = planted(a.train, 1)
    xte, yte = planted(a.test, 2)
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
    rows1 = sampan.prune.report(models, (sampan.from_numpy(xte[:1]),), accuracy=acc,
                                repeats=a.repeats)
    print("\nbatch 64:")
    rows64 = sampan.prune.report(models, (sampan.from_numpy(xte[:64]),),
                                 repeats=a.repeats // 4)
    lines(rows1, rows64, a)


def lines(rows1, rows64, a):
    """The JSON lines of the two tables: latency per (model, batch), then each pruned
    model against the dense one (the first row): p50 speed-up and accuracy loss."""
    for batch, rows, reps in ((1, rows1, a.repeats), (64, rows64, a.repeats // 4)):
        for name, r in rows.items():
            emit("W5", "sampan", name, f"batch{batch}_latency_us_p50", [r["p50_us"]],
                 p99_us=round(r["p99_us"], 2), calls=reps, params=r["params"],
                 sparsity=round(r["sparsity"], 4), saved_bytes=r["bytes"],
                 accuracy=rows1[name]["accuracy"])
    dense = next(iter(rows1))
    for name in list(rows1)[1:]:
        for batch, rows in ((1, rows1), (64, rows64)):
            target = {"target": 1.3} if batch == 1 and name.startswith("channels") else {}
            emit("W5", f"sampan_{name}/sampan_{dense}", name, f"batch{batch}_speedup_p50",
                 [rows[dense]["p50_us"] / rows[name]["p50_us"]], **target)
        emit("W5", f"sampan_{name}/sampan_{dense}", name, "accuracy_loss_points",
             [100 * (rows1[dense]["accuracy"] - rows1[name]["accuracy"])], target=1.0,
             lower_is_better=True)


if __name__ == "__main__":
    main()
