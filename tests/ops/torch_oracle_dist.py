"""(issue 23) PyTorch oracles for the collective ops. The op table's samples run without a
process group, i.e. on one rank, where every collective is the identity (torch.distributed
on a world of one gives the same); the multi-rank checks are tests/distributed."""


def _identity(torch, a, at):
    return a[0].clone()


ORACLE = {name: _identity for name in ("all_reduce", "broadcast", "reduce", "all_gather",
                                       "reduce_scatter")}
COMPOSITE_ORACLE = {}
