"""Data-parallel training (issue 23): process groups and collectives over MPI and
in-process replicas, DataParallel with bucketed all-reduce overlapped with backward, the
`sampan launch` command."""

EXPORTS: list = []  # names bound on `sampan` itself (none: use sampan.distributed.*)
