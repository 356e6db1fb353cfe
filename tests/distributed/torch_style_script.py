"""A tiny torch.distributed program, written for torch. Under torch:
``RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p python torch_style_script.py``
prints its results as JSON; test_torch_port.py runs it so (the oracle) and then, with
its two imports renamed to sampan's, on 2 in-process replicas."""
import json

import torch
import torch.distributed as dist


def run():
    assert dist.is_available()
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(3) * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    m = torch.tensor([float(rank), 10.0 - rank])
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    lo = torch.tensor([float(rank) + 3.0])
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    b = torch.tensor([float(rank) + 0.5])
    dist.broadcast(b, src=1)
    r = torch.tensor([1.0 + rank])
    dist.reduce(r, dst=0)
    solo = dist.new_group([0])
    s = torch.tensor([7.0 + rank])
    if rank == 0:
        dist.all_reduce(s, group=solo)
    pair = dist.new_group([0, 1])
    a = torch.tensor([2.0 * rank + 1])
    work = dist.all_reduce(a, group=pair, async_op=True)
    work.wait()
    parts = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([float(rank), 1.0]))
    dist.barrier()
    out = {"gather": [p.tolist() for p in parts], "rank": rank, "world": world,
           "sum": t.tolist(), "max": m.tolist(),
           "min": lo.tolist(), "bcast": b.tolist(), "reduce": r.tolist(),
           "solo": s.tolist(), "pair": a.tolist(), "pair_size": dist.get_world_size(pair)}
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    print(json.dumps(run()))
