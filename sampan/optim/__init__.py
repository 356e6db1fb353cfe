"""Optimisers, learning-rate schedules and gradient clipping.

The eager optimisers update each parameter's numpy storage in place (no allocation
per step beyond one shared scratch buffer); `sampan.optim.functional` holds the same
rules as pure functions over sampan ops, for tracing.

Example::

    >>> opt = sampan.optim.AdamW(model.parameters(), lr=3e-4)
    >>> sched = sampan.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1000)
    >>> loss.backward(); sampan.optim.clip_grad_norm_(model.parameters(), 1.0)
    >>> opt.step(); opt.zero_grad(); sched.step()
"""
from . import functional, lr_scheduler
from .adam import Adam, AdamW
from .adam_variants import Adamax, NAdam, RAdam
from .adaptive import Adagrad, RMSprop
from .classic import ASGD, Adadelta, Rprop
from .clip import clip_grad_norm_, clip_grad_value_
from .lbfgs import LBFGS
from .lr_scheduler import (
    ChainedScheduler,
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingWarmRestarts,
    CyclicLR,
    ExponentialLR,
    LambdaLR,
    LinearLR,
    LinearWarmup,
    LRScheduler,
    MultiplicativeLR,
    MultiStepLR,
    OneCycleLR,
    PolynomialLR,
    ReduceLROnPlateau,
    SequentialLR,
    StepLR,
)
from .optimizer import Optimizer
from .sgd import SGD
from .sparse_adam import SparseAdam

__all__ = [
    "ASGD",
    "LBFGS",
    "SGD",
    "Adadelta",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "ChainedScheduler",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "LinearWarmup",
    "MultiStepLR",
    "MultiplicativeLR",
    "NAdam",
    "OneCycleLR",
    "Optimizer",
    "PolynomialLR",
    "RAdam",
    "RMSprop",
    "ReduceLROnPlateau",
    "Rprop",
    "SequentialLR",
    "SparseAdam",
    "StepLR",
    "clip_grad_norm_",
    "clip_grad_value_",
    "functional",
    "lr_scheduler",
]
