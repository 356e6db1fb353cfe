"""scikit-learn's digits data set (1,797 8×8 images, shipped with scikit-learn: no download)
as sampan datasets, with a fixed train/test split."""
from __future__ import annotations

import numpy as np

import sampan
from sampan.data import DataLoader, TensorDataset


def digits(seed=0, test_fraction=0.25, image=True):
    """(train_dataset, test_dataset); images are float32 (N, 1, 8, 8) in [0, 1]."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.images / 16.0).astype(np.float32)
    x = x[:, None] if image else x.reshape(len(x), 64)
    y = d.target.astype(np.int64)
    idx = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    te, tr = idx[:n_test], idx[n_test:]
    return (TensorDataset(sampan.tensor(x[tr]), sampan.tensor(y[tr])),
            TensorDataset(sampan.tensor(x[te]), sampan.tensor(y[te])))


def loaders(batch_size=32, image=True, seed=0):
    train, test = digits(seed, image=image)
    return (DataLoader(train, batch_size=batch_size, shuffle=True, seed=seed),
            DataLoader(test, batch_size=256))
