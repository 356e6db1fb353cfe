"""Seeing where time goes (issue 21): one timeline of ops, jit kernels, autograd, optimiser
steps, data loading, the rec pipeline and user ranges; a model summary with FLOPs and
memory; and an advisor that reads a profile and says what to change.

    >>> import sampan, sampan.profiler
    >>> with sampan.profiler.profile() as prof:
    ...     with sampan.profiler.record("step"):
    ...         _ = sampan.ones(4) * 3
    >>> sorted({e.cat for e in prof.events} - {"memory"})
    ['op', 'user']

`recorder` is what instrumented code calls (one flag check when not profiling); the
`Event` schema is in `events`. Both live below every floor (`sampan._recorder`,
`sampan._events`) so that the code they instrument need not import this package.
"""

from . import events, recorder  # noqa: F401  (the old paths of sampan._events, sampan._recorder)
from .session import Profile, ProfilerError, profile, record
from .summary import flops, summary

__all__ = ["Profile", "ProfilerError", "flops", "profile", "record", "summary"]

EXPORTS: list = ["summary", "flops"]  # names bound on `sampan` itself
