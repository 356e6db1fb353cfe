"""Errors name the op, what it got, what it expected and the user's own line."""
import os

import pytest

import sampan

HERE = os.path.basename(__file__)


def _line_of(marker):
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "_line_of" not in line:
                return i


def test_broadcast_error_names_op_shapes_and_user_line():
    a, b = sampan.ones(2, 3), sampan.ones(4)
    with pytest.raises(sampan.ShapeError) as e:
        a + b  # MARK-ADD
    msg = str(e.value)
    assert "add" in msg and "(2, 3)" in msg and "(4,)" in msg and "broadcast" in msg
    assert f"{HERE}:{_line_of('MARK-ADD')}" in msg


def test_matmul_error():
    with pytest.raises(sampan.ShapeError) as e:
        sampan.ones(2, 3) @ sampan.ones(4, 5)  # MARK-MM
    msg = str(e.value)
    assert "matmul" in msg and "(2, 3)" in msg and "(4, 5)" in msg
    assert f"{HERE}:{_line_of('MARK-MM')}" in msg


def test_reshape_error():
    with pytest.raises(sampan.ShapeError, match=r"reshape.*\(2, 3\).*6 elements"):
        sampan.ones(2, 3).reshape(4, 2)


def test_dtype_errors():
    with pytest.raises(sampan.SampanError, match="floating"):
        sampan.tensor([1, 2]).requires_grad_()
    with pytest.raises(sampan.DTypeError, match="index_select.*integer"):
        sampan.index_select(sampan.ones(3, 2), sampan.ones(2), 0)


def test_errors_are_one_family():
    for cls in (sampan.ShapeError, sampan.DTypeError, sampan.DeviceError,
                sampan.SampanValueError, sampan.AutogradError):
        assert issubclass(cls, sampan.SampanError)
