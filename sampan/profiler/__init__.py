"""Seeing where time goes (issue 21): one timeline of ops, jit kernels, autograd, optimiser
steps, data loading, the rec pipeline and user ranges; a model summary with FLOPs and
memory; and an advisor that reads a profile and says what to change."""

EXPORTS: list = []  # names bound on `sampan` itself (e.g. summary, flops)
