"""Teacher-forced scoring under the context rule generation follows."""

import numpy as np
from keras import ops

from keras_tfam.generation.generator import compile_function
from keras_tfam.generation.protocol import check_protocol
from keras_tfam.generation.requests import resolve_window
from keras_tfam.utils import check_positive_int


def windowed_logits(model, token_ids, window=None, batch_size=64):
    """Teacher-forced logits `(B, T, V)` under the rule generation follows.

    Each position sees at most the `window` most recent tokens (itself
    included); `window` defaults to the model's `max_length` (no limit when
    `None`). A model with `sliding_window_cache` runs the sequence once
    over a ring cache; any other model re-encodes, for each position past
    the window, the `window` tokens ending there at positions
    `0 .. window - 1`, exactly as generation does, `batch_size` windows
    at a time through one compiled program.
    """
    check_protocol(model)
    batch_size = check_positive_int("batch_size", batch_size)
    window = resolve_window(model, window)
    token_ids = np.asarray(token_ids, np.int32)
    batch, length = token_ids.shape
    if window is None or length <= window:
        return ops.convert_to_numpy(model.call_with_cache(token_ids, model.init_cache(batch, length), 0).logits)
    if model.sliding_window_cache:
        cache = model.init_cache(batch, length, window=window)
        return ops.convert_to_numpy(model.call_with_cache(token_ids, cache, 0, window=window).logits)
    first = model.call_with_cache(token_ids[:, :window], model.init_cache(batch, window), 0).logits
    starts = np.arange(1, length - window + 1)
    windows = token_ids[:, starts[:, None] + np.arange(window)].reshape(-1, window)  # [B * n, W]
    rows = min(batch_size, len(windows))

    def last_logits(chunk):  # one compiled program for every chunk: the last is padded to `rows`
        return model.call_with_cache(chunk, model.init_cache(rows, window), 0).logits[:, -1]

    compiled = compile_function(last_logits, model)
    last = []
    for start in range(0, len(windows), rows):
        chunk = windows[start : start + rows]
        padded = np.concatenate([chunk, np.zeros((rows - len(chunk), window), np.int32)])
        last.append(ops.convert_to_numpy(compiled(padded))[: len(chunk)])
    rest = np.concatenate(last).reshape(batch, len(starts), -1)
    return np.concatenate([ops.convert_to_numpy(first), rest], axis=1)
