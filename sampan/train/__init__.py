"""Training loop with hooks: `Trainer` (fit / evaluate / predict) and built-in hooks.

Plain hand-written loops stay first-class; the Trainer only saves the boilerplate.

Example::

    >>> from sampan.train import Trainer, ProgressBar, Checkpoint, accuracy
    >>> trainer = Trainer(model, opt, sampan.cross_entropy, train_loader, eval_loader,
    ...                   hooks=[ProgressBar(), Checkpoint("ckpt", every_n_steps=200)],
    ...                   metrics={"acc": accuracy})
    >>> trainer.fit(epochs=5)
"""
from .hooks import Checkpoint, DebugStep, EarlyStopping, Hook, JSONLLogger, ProgressBar
from .trainer import Trainer, accuracy

__all__ = ["Checkpoint", "DebugStep", "EarlyStopping", "Hook", "JSONLLogger", "ProgressBar",
           "Trainer", "accuracy"]
