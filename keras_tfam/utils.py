"""Small helpers shared by the layers and models: argument checks, model configs."""

import keras


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
