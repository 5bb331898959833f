"""The one check every token-ids model makes on what it is called with: `(batch, length)` integer ids."""

import keras
import numpy as np

from keras_tfam.utils import static_dim


def check_token_ids(token_ids, name="token_ids", max_length=None):
    """A one-line `ValueError` naming `name` unless `token_ids` is a `(batch, length)` integer array, both >= 1
    (and the length at most `max_length`, when given: a table of learned positions ends there).

    The rank, the dtype and the sizes are static, so the check holds in
    symbolic, traced and compiled calls too; a dict or a list of tensors (a
    functional model's nested inputs) is left to Keras.

    Examples:
        >>> check_token_ids(np.zeros((1, 4), "float32"))
        Traceback (most recent call last):
        ValueError: `token_ids` must be integer token ids. Received: token_ids.dtype=float32
    """
    if isinstance(token_ids, dict):
        return
    if not hasattr(token_ids, "shape"):
        try:
            token_ids = np.asarray(token_ids)
        except ValueError:  # ragged lists: Keras says so
            return
        if token_ids.dtype == object:
            return
    sizes = tuple(static_dim(dim) for dim in tuple(token_ids.shape))
    if len(sizes) != 2 or 0 in sizes:
        raise ValueError(
            f"`{name}` must be (batch, length) token ids, at least one row of one id. Received: {name}.shape={sizes}"
        )
    dtype = keras.backend.standardize_dtype(token_ids.dtype)
    if "int" not in dtype:
        raise ValueError(f"`{name}` must be integer token ids. Received: {name}.dtype={dtype}")
    if max_length is not None and sizes[1] is not None and sizes[1] > max_length:
        raise ValueError(
            f"`{name}` must be at most {max_length} positions long (the model's learned positions; `generate` "
            f"slides its window over longer texts). Received: {name}.shape={sizes}"
        )
