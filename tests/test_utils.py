"""The argument checks every layer and model shares."""

import keras
import numpy as np
import pytest

from keras_tfam.utils import check_non_negative_int, check_positive_int, check_window


@pytest.mark.parametrize("value", [4, np.int64(4), np.int32(4), np.uint8(4), np.int8(4)])
def test_integers_of_any_integer_type_are_accepted_as_python_ints(value):
    for check in (check_positive_int, check_non_negative_int):
        checked = check("size", value)
        assert checked == 4 and type(checked) is int
    checked = check_window(value)
    assert checked == 4 and type(checked) is int


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        np.int64(0),
        2.5,
        3.0,
        np.float32(3),
        np.float64(2.5),
        True,
        np.bool_(True),
        "3",
        None,
        float("nan"),
        float("inf"),
        [3],
    ],
)
def test_positive_int_refuses_non_integers_and_non_positive_values_in_one_line(value):
    with pytest.raises(ValueError) as error:
        check_positive_int("size", value)
    message = str(error.value)
    assert "\n" not in message and message.endswith(f"Received: size={value!r}")


@pytest.mark.parametrize("value", [0, np.int64(0)])
def test_non_negative_int_accepts_zero(value):
    assert check_non_negative_int("seed", value) == 0


@pytest.mark.parametrize(
    "window, shown",
    [
        (2.5, "2.5"),  # a mask `i - j < 2.5` would be a window of 3
        (np.float32(3), "np.float32(3.0)"),
        (0, "0"),  # a window of 0 would hide every key
        (-2, "-2"),
        (np.int64(0), "np.int64(0)"),
        (True, "True"),
        ("4", "'4'"),
    ],
)
def test_window_refuses_non_integers_and_windows_below_one(window, shown):
    with pytest.raises(ValueError) as error:
        check_window(window)
    message = str(error.value)
    assert "\n" not in message and message.endswith(f"Received: window={shown}")


def test_window_tensors_must_be_scalar_integers_and_positive_when_known():
    assert check_window(None) is None
    assert int(check_window(keras.ops.convert_to_tensor(3, "int32"))) == 3
    for tensor, shown in (
        (keras.ops.convert_to_tensor(2.5), "window=a float32 tensor of shape ()"),
        (keras.ops.convert_to_tensor([3]), "window=a int32 tensor of shape (1,)"),
        (keras.ops.convert_to_tensor(0), "window=0"),
    ):
        with pytest.raises(ValueError) as error:
            check_window(tensor)
        assert "\n" not in str(error.value) and str(error.value).endswith(f"Received: {shown}")
