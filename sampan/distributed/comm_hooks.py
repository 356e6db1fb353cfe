"""Communication hooks of `DataParallel`, as PyTorch DDP's (`register_comm_hook`).

A hook is ``hook(state, bucket) -> Work or Future``: called once a bucket's gradients
are all in (during backward), it starts the bucket's reduction and returns a handle
whose `wait()` gives the reduced flat buffer (an array or tensor; None: reduced in place
in `bucket.buffer()`); the result is what every parameter of the bucket gets as its
`.grad`. `bucket` is a `GradBucket`: `index()`, `buffer()` (a tensor over the flat
buffer of its gradients, in the bucket's dtype; `array()` is the numpy array itself),
`gradients()`, `parameters()`, `is_last()`. A hook written for torch ports by renaming
its imports: ``dist.all_reduce(t, async_op=True).get_future().then(cb)`` gives a
`Future` whose callback gets the future, and ``fut.value()[0]`` is the reduced tensor. `state` is what was given
to `register_comm_hook`: for the hooks here, a process group (None: the current one),
as torch's default hooks take `process_group`.

- `allreduce_hook` (the default): the mean over the ranks, in the bucket's dtype (the
  sum divided by the world size).
- `fp16_compress_hook`, `bf16_compress_hook`: torch's compression hooks: the buffer cast
  to float16 (bfloat16) and divided by the world size, all-reduced (sum), and cast back
  into the buffer; the numbers are torch's (a test checks them against torch's hooks
  on gloo). The in-process backend moves no bytes; the MPI backend reduces the
  half-precision buffer in its own 2 bytes (a user MPI op, `mpi.py`), so there the hook
  halves the traffic as in PyTorch.

Example::

    >>> from sampan.distributed import comm_hooks
    >>> dp.register_comm_hook(None, comm_hooks.bf16_compress_hook)
"""
from __future__ import annotations

import numpy as np

from ..dtypes import bfloat16
from . import _comm

__all__ = ["GradBucket", "allreduce_hook", "fp16_compress_hook", "bf16_compress_hook"]


class GradBucket:
    """What a comm hook is given: one bucket of gradients (torch's `GradBucket`)."""

    __slots__ = ("_bucket", "_last", "_tensor")

    def __init__(self, bucket, is_last):
        self._bucket, self._last = bucket, bool(is_last)
        self._tensor = None

    def index(self) -> int:
        return self._bucket.index

    def buffer(self):
        """The bucket's gradients, flattened and concatenated: a sampan Tensor over the
        bucket's flat buffer (writing into it writes the bucket), as torch's."""
        if self._tensor is None:
            from ..tensor import wrap
            self._tensor = wrap(self._bucket.flat)
        return self._tensor

    def array(self) -> np.ndarray:
        """`buffer()` as the numpy array itself."""
        return self._bucket.flat

    def set_buffer(self, buffer) -> None:
        """Replace the bucket's flat buffer's contents (same size)."""
        src = buffer.numpy() if hasattr(buffer, "numpy") else np.asarray(buffer)
        np.copyto(self._bucket.flat, src.reshape(-1))

    def parameters(self) -> list:
        return list(self._bucket.params)

    def gradients(self) -> list:
        """Each parameter's gradient: tensors over views of `buffer()`, shaped as the
        parameter."""
        from ..tensor import wrap
        b = self._bucket
        return [wrap(b.flat[o:o + p._data.size].reshape(p._data.shape))
                for p, o in zip(b.params, b.offsets)]

    def is_last(self) -> bool:
        return self._last

    def __repr__(self):
        return f"<GradBucket {self.index()} of {len(self._bucket.params)} parameters>"


def _world(group):
    return _comm.world_size() if group is None else group.size


def allreduce_hook(process_group, bucket):
    """The default: all-reduce the bucket's buffer (mean over the ranks), in place."""
    buf = bucket.array()
    if process_group is None:
        return _comm.all_reduce_mean(buf)
    from .collectives import all_reduce
    return all_reduce(buf, op="mean", async_op=True, group=process_group)


def _compress_hook(dtype):
    def hook(process_group, bucket):
        from .collectives import all_reduce
        buf = bucket.array()
        small = buf.astype(dtype)
        np.divide(small, _world(process_group), out=small)
        work = all_reduce(small, op="sum", async_op=True, group=process_group)

        def decompress(res):
            np.copyto(buf, small, casting="unsafe")
            return buf
        return work.then(decompress)
    return hook


fp16_compress_hook = _compress_hook(np.dtype(np.float16))
fp16_compress_hook.__name__ = fp16_compress_hook.__qualname__ = "fp16_compress_hook"
fp16_compress_hook.__doc__ = """Cast the bucket to float16 and divide it by the world
size, all-reduce (sum) that, and cast the result back into the buffer (torch's
`fp16_compress_hook`)."""

bf16_compress_hook = _compress_hook(bfloat16)
bf16_compress_hook.__name__ = bf16_compress_hook.__qualname__ = "bf16_compress_hook"
bf16_compress_hook.__doc__ = """As `fp16_compress_hook` with bfloat16 (torch's
`bf16_compress_hook`: float32's range, 8 bits of mantissa)."""
