"""An MLP on scikit-learn's digits with a plain hand-written loop (no Trainer):
>= 97% test accuracy in seconds. Run: python examples/digits_mlp.py"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sampan  # noqa: E402
from sampan import nn  # noqa: E402

from digits_common import loaders  # noqa: E402


def main(epochs=40, seed=0):
    sampan.manual_seed(seed)
    train_loader, test_loader = loaders(batch_size=64, image=False, seed=0)  # fixed split
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    # seeds 0-3 give 97.3-97.8% test accuracy with these settings
    opt = sampan.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    sched = sampan.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * len(train_loader))
    t = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            loss = sampan.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    correct = n = 0
    with sampan.no_grad():
        for x, y in test_loader:
            correct += int((model(x).argmax(-1) == y).sum())
            n += len(y)
    acc = correct / n
    print(f"digits MLP: last train loss {float(loss):.4f}, test accuracy {acc:.4f} "
          f"after {time.perf_counter() - t:.1f} s")
    return acc


if __name__ == "__main__":
    main()
