"""The argument checks every layer and model shares."""

import keras
import numpy as np
import pytest

from keras_tfam import utils
from keras_tfam.utils import (
    check_non_negative_int,
    check_positive_int,
    check_window,
    columns_product,
    kernel_rows,
    kernels_as_rows,
    register_row_kernel,
    rows_product,
)


@pytest.mark.parametrize("value", [4, np.int64(4), np.int32(4), np.uint8(4), np.int8(4)])
def test_integers_of_any_integer_type_are_accepted_as_python_ints(value):
    for check in (check_positive_int, check_non_negative_int):
        checked = check("size", value)
        assert checked == 4 and type(checked) is int
    checked = check_window(value)
    assert checked == 4 and type(checked) is int


@pytest.mark.parametrize(
    "value", [0, -1, np.int64(0), 2.5, 3.0, np.float32(3), np.float64(2.5), True, np.bool_(True), "3", None,
              float("nan"), float("inf"), [3]]
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


def test_rows_product_is_the_formula_for_one_row_and_refuses_more():
    rows = np.random.default_rng(0).integers(-127, 128, size=(5, 4)).astype("int8")
    x = np.random.default_rng(1).normal(size=(1, 1, 4)).astype("float32")
    out = keras.ops.convert_to_numpy(rows_product(x, rows, "float32"))
    np.testing.assert_allclose(out, x @ rows.T.astype("float32"), rtol=1e-6)
    with pytest.raises(ValueError, match=r"one row. Received: inputs of shape \(2, 4\)"):
        rows_product(np.ones((2, 4), "float32"), rows, "float32")


@pytest.mark.parametrize("shape", [(2, 4), (8, 1, 4), (4, 16, 4), (5, 4)])
def test_columns_product_is_the_formula_for_a_few_rows(shape):
    """`(rows @ x^T + c)^T` is `x @ rows^T + bias` (or without the bias), eagerly and compiled; also for 5
    rows by 5 weight rows, where Keras' TensorFlow `add` would take the bias column for a row."""
    from backend import compiled

    rng = np.random.default_rng(3)
    rows, bias = rng.normal(size=(5, 4)).astype("float32"), rng.normal(size=(5,)).astype("float32")
    x = rng.normal(size=shape).astype("float32")
    for fn in (columns_product, compiled(columns_product)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(fn(x, rows)), x @ rows.T, rtol=1e-5, atol=1e-6)
        out = keras.ops.convert_to_numpy(fn(x, rows, bias))
        np.testing.assert_allclose(out, x @ rows.T + bias, rtol=1e-5, atol=1e-6)
    # A non-finite input spoils its own row's outputs only.
    x = np.ones((3, 4), "float32")
    x[1, 0] = np.nan
    out = keras.ops.convert_to_numpy(columns_product(x, rows))
    assert np.isnan(out[1]).all() and np.isfinite(out[[0, 2]]).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rows_dtype", ["float32", "same"])
def test_columns_product_of_16_bit_rows_is_the_float32_product_rounded_then_the_bias(dtype, rows_dtype):
    """16-bit inputs: the float32 product of their values (by float32 rows, the copy `kernels_as_rows`
    makes, or by 16-bit rows), rounded to their dtype, then the bias added in it; as XLA's CPU backend
    multiplies 16-bit matrices and Keras' Dense adds its bias."""
    import ml_dtypes
    from backend import compiled

    narrow = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    rng = np.random.default_rng(5)
    x = rng.normal(size=(8, 1, 16)).astype(narrow)
    rows = rng.normal(size=(6, 16)).astype(narrow)
    bias = rng.normal(size=(6,)).astype(narrow)
    product = (x.astype("float64") @ rows.T.astype("float64")).astype(narrow)
    expected = (product.astype("float64") + bias.astype("float64")).astype(narrow).astype("float64")
    rows_in = rows.astype("float32") if rows_dtype == "float32" else rows
    args = [keras.ops.convert_to_tensor(a, dtype) for a in (x, bias)]
    for fn in (columns_product, compiled(columns_product)):
        out = fn(args[0], keras.ops.convert_to_tensor(rows_in), args[1])
        assert keras.backend.standardize_dtype(out.dtype) == dtype
        out = keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")).astype("float64")
        # The float32 sum rounded to 16 bits may differ from the exact sum rounded: one unit in the last place.
        ulp = 2.0 ** (-7 if dtype == "bfloat16" else -10)
        np.testing.assert_allclose(out, expected, rtol=2 * ulp, atol=2 * ulp * np.abs(expected).max())


@pytest.mark.parametrize("shape", [(1, 4), (1, 1, 4), (65, 4), (5, 13, 4)])
def test_columns_product_refuses_one_row_and_many(shape):
    with pytest.raises(ValueError, match=rf"2 to 64 rows. Received: inputs of shape \({shape[0]}, "):
        columns_product(np.ones(shape, "float32"), np.ones((3, 4), "float32"))


@pytest.mark.skipif(keras.backend.backend() not in ("tensorflow", "jax"), reason="PyTorch decodes eagerly: no copies")
def test_kernels_as_rows_transposes_registered_float_kernels_to_float32_within_a_memory_budget(monkeypatch):
    rng = np.random.default_rng(4)
    kernel = keras.Variable(rng.normal(size=(4, 6)).astype("float32"))
    unregistered = keras.Variable(rng.normal(size=(4, 6)).astype("float32"))
    half = keras.Variable(rng.normal(size=(4, 6)).astype("float32"), dtype="bfloat16")
    int8 = keras.Variable(rng.integers(-127, 128, size=(4, 6)).astype("int8"), dtype="int8", trainable=False)
    for variable in (kernel, half, int8):
        register_row_kernel(variable)
    with kernels_as_rows([kernel, unregistered, half, int8]):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(kernel_rows(kernel)), np.asarray(kernel).T)
        widened = kernel_rows(half)  # a bfloat16 kernel's rows, exactly, in float32
        assert keras.backend.standardize_dtype(widened.dtype) == "float32"
        half_values = keras.ops.convert_to_numpy(keras.ops.cast(half, "float32"))
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(widened), half_values.T)
        assert kernel_rows(unregistered) is None and kernel_rows(int8) is None
        with kernels_as_rows([]):  # nested: the inner copies only
            assert kernel_rows(kernel) is None
        assert kernel_rows(kernel) is not None
    assert kernel_rows(kernel) is None
    # Copies larger than a quarter of the machine's memory are not made (a 16-bit kernel's copy: 4 bytes a weight).
    monkeypatch.setattr(utils, "physical_memory_bytes", lambda: 4 * 4 * 48 - 1)
    with kernels_as_rows([kernel, half]):
        assert kernel_rows(kernel) is None and kernel_rows(half) is None
    monkeypatch.setattr(utils, "physical_memory_bytes", lambda: 4 * 4 * 48)
    with kernels_as_rows([kernel, half]):
        assert kernel_rows(kernel) is not None and kernel_rows(half) is not None
    # A loop of one row reads the copies of float32 kernels on TensorFlow only (`one_row_by_rows`): nothing
    # else is copied for it. A few rows, or rows not known, copy as before.
    with kernels_as_rows([kernel, half], rows=1):
        assert (kernel_rows(kernel) is not None) == (keras.backend.backend() == "tensorflow")
        assert kernel_rows(half) is None
    for rows in (2, None):
        with kernels_as_rows([kernel, half], rows=rows):
            assert kernel_rows(kernel) is not None and kernel_rows(half) is not None


def test_bfloat16_rows_are_widened_exactly_and_multiplied_in_float32():
    """bfloat16 rows read as their bits shifted into float32's upper half: the float32 product of the same values."""
    from backend import compiled

    rng = np.random.default_rng(2)
    rows = keras.ops.cast(rng.normal(size=(40, 64)).astype("float32"), "bfloat16")
    widened = keras.ops.convert_to_numpy(keras.ops.cast(rows, "float32"))  # bfloat16 -> float32 is exact
    x = rng.normal(size=(1, 1, 64)).astype("float32")
    expected = x @ widened.T
    for product in (lambda x: rows_product(x, rows, "float32"), compiled(lambda x: rows_product(x, rows, "float32"))):
        out = keras.ops.convert_to_numpy(product(x))
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    out = rows_product(x, rows, "bfloat16")
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")), expected, rtol=1e-2, atol=1e-2)
