"""`sampan.nn.utils.rnn`: padded and packed variable-length sequences, as PyTorch's.

A `PackedSequence` holds the steps of a batch of sequences sorted by length (longest
first), time step after time step: ``data`` is ``(sum(lengths), *)``, ``batch_sizes[t]``
how many sequences are still running at step t, ``sorted_indices`` the batch order used
(``None`` when the input was already sorted) and ``unsorted_indices`` its inverse. The
recurrent layers take one and give one back. Packing and padding are ops (getitem, cat,
stack), so gradients flow through them.

Example::

    >>> from sampan.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    >>> packed = pack_padded_sequence(x, [5, 2, 4], batch_first=True, enforce_sorted=False)
    >>> out, h = lstm(packed)
    >>> out, lengths = pad_packed_sequence(out, batch_first=True)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...errors import SampanValueError, ShapeError, op_error
from ...ops.creation import full
from ...ops.shape import cat, stack, transpose
from ...tensor import Tensor


class PackedSequence(NamedTuple):
    """Steps of sorted sequences, time-major and concatenated (see the module doc)."""
    data: Tensor
    batch_sizes: Tensor
    sorted_indices: Tensor | None = None
    unsorted_indices: Tensor | None = None

    @property
    def is_cuda(self):
        return False

    def to(self, *args, **kwargs):
        return self._replace(data=self.data.to(*args, **kwargs))


def _t(x):
    return x if isinstance(x, Tensor) else Tensor(np.asarray(x))


def _lengths(lengths, op):
    ln = lengths.numpy() if isinstance(lengths, Tensor) else np.asarray(lengths)
    if ln.ndim != 1 or ln.dtype.kind not in "iu" and ln.size:
        raise op_error(ShapeError, op, f"lengths {ln!r}", "a 1-D list or tensor of ints")
    ln = ln.astype(np.int64)
    if ln.size and ln.min() <= 0:
        raise op_error(SampanValueError, op, f"a length of {ln.min()}",
                       "lengths of at least 1 (PyTorch refuses empty sequences too)")
    return ln


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """Stack tensors of shape (L_i, *) into (max L, B, *) (or (B, max L, *)), padding the
    short ones with `padding_value` on the `padding_side`."""
    seqs = [_t(s) for s in sequences]
    if not seqs:
        raise op_error(SampanValueError, "pad_sequence", "no sequences", "at least one")
    if padding_side not in ("right", "left"):
        raise op_error(SampanValueError, "pad_sequence", f"padding_side={padding_side!r}",
                       "'right' or 'left'")
    rest = tuple(seqs[0].shape[1:])
    for i, s in enumerate(seqs):
        if s.ndim < 1 or tuple(s.shape[1:]) != rest or s.dtype != seqs[0].dtype:
            raise op_error(ShapeError, "pad_sequence", f"sequence {i} of {s.dtype}"
                           f"{list(s.shape)}", f"(length, *{rest}) of {seqs[0].dtype} like "
                           "sequence 0")
    T = max(s.shape[0] for s in seqs)
    rows = []
    for s in seqs:
        n = T - s.shape[0]
        if n:
            fill = full((n,) + rest, padding_value, dtype=s.dtype)
            s = cat([s, fill] if padding_side == "right" else [fill, s], 0)
        rows.append(s)
    return stack(rows, 0 if batch_first else 1)


def pack_padded_sequence(input, lengths, batch_first=False, enforce_sorted=True):
    """Pack a padded batch (T, B, *) (or (B, T, *)) of sequences of `lengths`."""
    x = _t(input)
    ln = _lengths(lengths, "pack_padded_sequence")
    if x.ndim < 2:
        raise op_error(ShapeError, "pack_padded_sequence", f"input of shape {tuple(x.shape)}",
                       "(T, B, *) or (B, T, *)")
    B, T = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    if ln.shape != (B,):
        raise op_error(ShapeError, "pack_padded_sequence", f"{ln.size} lengths",
                       f"one per sequence of the batch ({B})")
    if ln.size and ln.max() > T:
        raise op_error(SampanValueError, "pack_padded_sequence", f"a length of {ln.max()}",
                       f"lengths up to the padded length {T}")
    if enforce_sorted:
        if np.any(np.diff(ln) > 0):
            raise op_error(SampanValueError, "pack_padded_sequence", f"lengths {ln.tolist()}",
                           "lengths sorted longest first",
                           "pass enforce_sorted=False to sort them here")
        order = None
    else:
        order = np.argsort(-ln, kind="stable")
    return _pack(x, ln, order, batch_first)


def _pack(x, ln, order, batch_first):
    xs = transpose(x, 0, 1) if batch_first else x       # (T, B, *)
    if order is not None:
        xs = xs[:, Tensor(order)]
        ln = ln[order]
    T = int(ln[0]) if ln.size else 0
    batch_sizes = np.array([(ln > t).sum() for t in range(T)], np.int64)
    data = cat([xs[t, :int(b)] for t, b in enumerate(batch_sizes)], 0)
    sorted_i = unsorted_i = None
    if order is not None:
        sorted_i = Tensor(order.astype(np.int64))
        unsorted_i = Tensor(np.argsort(order, kind="stable").astype(np.int64))
    return PackedSequence(data, Tensor(batch_sizes), sorted_i, unsorted_i)


def _check_packed(seq, op):
    if not isinstance(seq, PackedSequence):
        raise op_error(SampanValueError, op, type(seq).__name__, "a PackedSequence")
    bs = seq.batch_sizes.numpy() if isinstance(seq.batch_sizes, Tensor) else \
        np.asarray(seq.batch_sizes)
    if bs.ndim != 1 or (bs.size and (np.any(np.diff(bs) > 0) or bs.min() <= 0)) or \
            int(bs.sum()) != seq.data.shape[0]:
        raise op_error(ShapeError, op, f"batch_sizes {bs.tolist()} for data of shape "
                       f"{tuple(seq.data.shape)}", "non-increasing positive counts that sum "
                       "to the data's length")
    return bs.astype(np.int64)


def pad_packed_sequence(sequence, batch_first=False, padding_value=0.0, total_length=None):
    """Unpack to a padded batch in the original order: ``(padded, lengths)`` with lengths
    an int64 tensor."""
    bs = _check_packed(sequence, "pad_packed_sequence")
    data = sequence.data
    B = int(bs[0]) if bs.size else 0
    T = bs.size
    if total_length is not None:
        if total_length < T:
            raise op_error(SampanValueError, "pad_packed_sequence", f"total_length="
                           f"{total_length}", f"at least the longest sequence ({T})")
        T = total_length
    rest = tuple(data.shape[1:])
    steps, start = [], 0
    for b in bs:
        b = int(b)
        step = data[start:start + b]
        if b < B:
            step = cat([step, full((B - b,) + rest, padding_value, dtype=data.dtype)], 0)
        steps.append(step)
        start += b
    for _ in range(T - bs.size):
        steps.append(full((B,) + rest, padding_value, dtype=data.dtype))
    padded = stack(steps, 0)                              # (T, B, *), sorted order
    ln = np.array([(bs > j).sum() for j in range(B)], np.int64)
    if sequence.unsorted_indices is not None:
        u = sequence.unsorted_indices.numpy()
        padded = padded[:, Tensor(u)]
        ln = ln[u]
    if batch_first:
        padded = transpose(padded, 0, 1)
    return padded, Tensor(ln)


def _repack(out, lengths, like, batch_first):
    """Pack a layer's padded output with the batch order of the PackedSequence `like`."""
    ln = _lengths(lengths, "pack_padded_sequence")
    order = None if like.sorted_indices is None else like.sorted_indices.numpy()
    return _pack(out, ln, order, batch_first)


def pack_sequence(sequences, enforce_sorted=True):
    """Pack a list of tensors (L_i, *)."""
    ln = [int(_t(s).shape[0]) for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), ln, enforce_sorted=enforce_sorted)


def unpad_sequence(padded_sequences, lengths, batch_first=False):
    """The list of sequences (L_i, *) of a padded batch."""
    x = _t(padded_sequences)
    ln = _lengths(lengths, "unpad_sequence")
    xs = x if batch_first else transpose(x, 0, 1)
    return [xs[i, :int(n)] for i, n in enumerate(ln)]


def unpack_sequence(packed_sequences):
    """The list of sequences (L_i, *) of a PackedSequence, in the original order."""
    padded, ln = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, ln, batch_first=True)


__all__ = ["PackedSequence", "pad_sequence", "pack_padded_sequence", "pad_packed_sequence",
           "pack_sequence", "unpad_sequence", "unpack_sequence"]
