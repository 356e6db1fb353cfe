"""Pruning: unstructured magnitude pruning whose masks survive fine-tuning, structured
channel pruning that makes the model itself smaller, and a sparsity / accuracy / latency
report.

Example::

    >>> sampan.prune.magnitude(net, amount=0.5)          # masks kept through training
    >>> sampan.prune.remove(net)                          # zeros made permanent
    >>> sampan.prune.channels(cnn, 0.5, example_inputs=(x,))   # half the channels gone
    >>> sampan.prune.report({"dense": a, "pruned": b}, (x,), accuracy=evaluate)
"""
from .channels import ChannelReport, channels
from .magnitude import PruneError, is_pruned, magnitude, mask_of, remove, sparsity
from .report import measure, report

__all__ = ["magnitude", "remove", "sparsity", "is_pruned", "mask_of", "channels",
           "ChannelReport", "report", "measure", "PruneError"]
