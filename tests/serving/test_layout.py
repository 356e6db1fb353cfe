"""serving's module layout (issue 30): one padding helper that the program/onnxruntime
and dlrm kinds both use, padding checked against numpy; errors and metrics in their own
modules with the old import paths still working; no file over 600 lines."""
import os

import numpy as np

import sampan.serving as serving
from sampan.serving import batcher, errors, metrics, model, ops, padding, program, rec


def test_buckets_and_padding_match_a_numpy_reference():
    assert padding.buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    assert padding.buckets(64, [24, 100, 0, True]) == [1, 2, 4, 8, 16, 24, 32, 64]
    assert padding.buckets(1) == [1]
    b = padding.buckets(48)
    assert [padding.bucket_of(b, n) for n in (1, 3, 17, 48, 50)] == [1, 4, 32, 48, 50]
    assert padding.bucket_of(None, 7) == 7
    a = np.arange(12, dtype=np.int64).reshape(3, 2, 2)
    p = padding.pad_rows(a, 5)
    np.testing.assert_array_equal(p, np.concatenate([a, np.zeros((2, 2, 2), np.int64)]))
    assert p.dtype == a.dtype and padding.pad_rows(a, 3) is a
    assert padding.preferred_sizes({"dynamic_batching": {"preferred_batch_sizes": [8]}}) \
        == (8,)
    assert padding.preferred_sizes({}) == ()


def test_both_kinds_pad_through_the_one_helper():
    assert program.buckets is padding.buckets
    for mod in (program, rec):
        assert mod.pad_rows is padding.pad_rows and mod.bucket_of is padding.bucket_of
    assert not hasattr(rec, "_buckets")


def test_errors_and_metrics_have_one_home_and_the_old_paths_work():
    assert batcher.RequestError is errors.RequestError is serving.RequestError
    assert model.ServingError is errors.ServingError is serving.ServingError
    assert issubclass(errors.ModelNotFound, errors.RequestError)
    assert errors.ClientGone().status == 499 and errors.ModelNotFound("x").status == 404
    assert ops.Metrics is metrics.Metrics and ops.ModelMetrics is metrics.ModelMetrics


def test_no_serving_file_is_over_600_lines():
    folder = os.path.dirname(serving.__file__)
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                assert sum(1 for _ in f) <= 600, name
