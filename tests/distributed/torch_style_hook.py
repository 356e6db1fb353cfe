"""A DDP comm hook written for torch, with torch's API only: bfloat16 compression by
hand. test_comm_hooks.py runs it under torch (two gloo ranks) and, with its imports
renamed to sampan's, as a DataParallel comm hook."""
import torch
import torch.distributed as dist


def bf16_by_hand(process_group, bucket):
    n = dist.get_world_size(process_group)
    small = bucket.buffer().to(torch.bfloat16).div_(n)
    fut = dist.all_reduce(small, group=process_group, async_op=True).get_future()

    def back(fut):
        return bucket.buffer().copy_(fut.value()[0])
    return fut.then(back)
