"""PyTorch-style import paths: ``sampan.utils.data`` is `sampan.data` under torch's name.

Example::

    >>> from sampan.utils.data import DataLoader, TensorDataset
"""
from . import data

__all__ = ["data"]
