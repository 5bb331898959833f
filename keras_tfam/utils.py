"""Small helpers shared by the layers and models: argument checks, model configs."""

import keras
import numpy as np


def check_positive_int(name, value):
    """Raises a `ValueError` naming `name` unless `value` is an int >= 1 (not a bool)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def head_size(label, width, num_heads):
    """`width // num_heads`; a `ValueError` naming both values unless it divides evenly."""
    if width % num_heads:
        raise ValueError(
            f"The {label} must be divisible by `num_heads`. Received: {label}={width}, num_heads={num_heads}"
        )
    return width // num_heads


def base_model_config(model):
    """The `keras.Model` part of a functional-subclass model's config."""
    return {
        "name": model.name,
        "trainable": model.trainable,
        "dtype": keras.dtype_policies.serialize(model.dtype_policy),
    }


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
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    try:
        array = keras.ops.convert_to_numpy(value)
    except Exception:  # a symbolic or traced tensor: no value yet
        return None
    return int(array) if np.ndim(array) == 0 and np.issubdtype(array.dtype, np.integer) else None


def check_window(window):
    """`window` checked: `None`, a positive int, or a scalar int tensor (positive when known)."""
    if window is None:
        return None
    if hasattr(window, "shape"):
        known = static_int(window)
        if known is not None and known < 1:
            raise ValueError(f"`window` must be a positive integer. Received: window={known}")
        return window
    check_positive_int("window", window)
    return window
