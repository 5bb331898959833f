"""Small helpers shared by the layers and models: argument checks, model configs, static shapes."""

import math

import keras
import numpy as np


def is_integer(value):
    """Whether `value` is an integer of any integer type: a Python int or a NumPy integer, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_positive_int(name, value):
    """`value` as a Python int; a `ValueError` naming `name` unless it is an integer >= 1.

    Integers of any integer type are accepted (`4`, `np.int64(4)`); bools,
    floats (even `3.0`), strings and non-positive values are refused.
    """
    if not is_integer(value) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


def check_non_negative_int(name, value):
    """`value` as a Python int; a `ValueError` naming `name` unless it is an integer >= 0 (not a bool)."""
    if not is_integer(value) or value < 0:
        raise ValueError(f"`{name}` must be a non-negative integer. Received: {name}={value!r}")
    return int(value)


def check_real(name, value, allowed, condition):
    """`value` as a Python float; a `ValueError` naming `name` unless it is a finite real number.

    Python and NumPy scalars (and 0-d arrays) are accepted, bools and
    everything else refused, as are values failing `condition`; `allowed`
    says in words what is allowed (`"> 0"`, `"in (0, 1]"`).
    """
    number = isinstance(value, (int, float, np.integer, np.floating)) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.number)
    )
    try:
        real = float(value) if number and not isinstance(value, (bool, np.bool_)) else None
    except OverflowError:  # an int beyond float range
        real = None
    if real is None or not math.isfinite(real) or not condition(real):
        raise ValueError(f"`{name}` must be a finite number {allowed}. Received: {name}={value!r}")
    return real


def head_size(label, width, num_heads):
    """`width // num_heads`; a `ValueError` naming both values unless it divides evenly."""
    if width % num_heads:
        raise ValueError(
            f"The {label} must be divisible by `num_heads`. Received: {label}={width}, num_heads={num_heads}"
        )
    return width // num_heads


def base_model_config(model):
    """The `keras.Model` part of a functional-subclass model's config.

    Its `dtype` records the quantized layers of a quantized model (see
    `keras_tfam.models.quantization.QuantizedConfigMixin`).
    """
    return {"name": model.name, "trainable": model.trainable, "dtype": model.dtype_policy_config()}


def static_dim(dim):
    """A shape entry as a Python int when it is known, else `None`.

    Symbolic shapes differ by backend: `None` on TensorFlow, symbolic
    dimension objects under JAX's shape polymorphism (which refuse `<`).
    """
    return dim if isinstance(dim, int) else None


def static_int(value):
    """`value` as a Python int when it is known now, else `None`.

    Known now: an int, or a scalar tensor with a concrete value (eager
    execution). Inside a traced function (XLA, `tf.function`, `jax.jit`)
    a tensor has no value yet, and checks that need one are skipped.
    """
    if is_integer(value):
        return int(value)
    try:
        array = keras.ops.convert_to_numpy(value)
    except Exception:  # a symbolic or traced tensor: no value yet
        return None
    return int(array) if np.ndim(array) == 0 and np.issubdtype(array.dtype, np.integer) else None


def check_window(window):
    """`window` checked: `None`, a positive integer (returned as a Python int), or a scalar int tensor.

    A tensor must have an integer dtype and no axes; its value is checked
    (`>= 1`) when it is known now (see `static_int`). Floats (`2.5`,
    `np.float32(3)`, a float tensor), bools and windows below 1 are refused:
    a mask `i - j < 2.5` would silently be a window of 3, and a window of 0
    would hide every key.
    """
    if window is None or is_integer(window):
        return None if window is None else check_positive_int("window", window)
    if hasattr(window, "shape") and hasattr(window, "dtype") and not isinstance(window, np.generic):
        dtype = keras.backend.standardize_dtype(window.dtype)
        if len(window.shape) != 0 or not dtype.startswith(("int", "uint")):
            raise ValueError(
                f"`window` must be a positive integer or a scalar integer tensor. Received: window=a {dtype} "
                f"tensor of shape {tuple(window.shape)}"
            )
        known = static_int(window)
        if known is not None and known < 1:
            raise ValueError(f"`window` must be a positive integer. Received: window={known}")
        return window
    raise ValueError(f"`window` must be a positive integer. Received: window={window!r}")
