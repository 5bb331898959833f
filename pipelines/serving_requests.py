"""Requests for the exported `generate`, `prefill`, `decode_chunk` and `generate_text` signatures, as a client
builds them.

NumPy only (a client needs neither TensorFlow nor keras_tfam to build one): every setting has one value per
prompt, as the signatures take them, so that TF Serving's batcher can merge requests.

    >>> request = generate_request([[5, 7, 9], [3]], max_new_tokens=8, stop_token_ids=[2])
    >>> {name: value.shape for name, value in request.items()}["stop_token_ids"]
    (2, 1)
"""

import numpy as np

# The per-row settings of both signatures, with their defaults: greedy, no filter, no stop, no penalty.
SETTINGS = dict(temperature=0.0, top_k=0, top_p=1.0, seed=0, repetition_penalty=1.0)
DTYPES = dict(
    max_new_tokens=np.int32,
    temperature=np.float32,
    top_k=np.int32,
    top_p=np.float32,
    seed=np.int32,
    repetition_penalty=np.float32,
)


def row_settings(rows, max_new_tokens, stop_token_ids=None, **settings):
    """Each setting as a `(rows,)` array (a single value repeated), `stop_token_ids` as `(rows, S)` (`-1` pads
    rows with fewer ids; none at all is one column of `-1`)."""
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise ValueError(f"Unknown settings {sorted(unknown)}; the signatures take {sorted(SETTINGS)}")
    values = dict(SETTINGS, **settings, max_new_tokens=max_new_tokens)
    request = {name: np.broadcast_to(np.asarray(values[name], DTYPES[name]), (rows,)).copy() for name in DTYPES}
    stop = [] if stop_token_ids is None else stop_token_ids
    stop = np.asarray(stop, np.int32)
    if stop.ndim < 2:  # the same ids for every row
        stop = np.broadcast_to(stop.reshape(1, -1), (rows, stop.size))
    if stop.shape[1] == 0:
        stop = np.full((rows, 1), -1, np.int32)
    request["stop_token_ids"] = np.ascontiguousarray(stop, np.int32)
    return request


def generate_request(prompts, max_new_tokens, stop_token_ids=None, **settings):
    """The inputs of `generate` for a list of prompts (token id lists of any lengths): right-padded `token_ids`,
    their `lengths`, and every setting per row."""
    lengths = np.array([len(p) for p in prompts], np.int32)
    token_ids = np.zeros((len(prompts), max(int(lengths.max()), 1)), np.int32)
    for row, prompt in enumerate(prompts):
        token_ids[row, : len(prompt)] = prompt
    request = {"token_ids": token_ids, "lengths": lengths}
    request.update(row_settings(len(prompts), max_new_tokens, stop_token_ids, **settings))
    return request


def generate_text_request(prompts, max_new_tokens, stop_token_ids=None, stop_strings=None, **settings):
    """The inputs of `generate_text` for a list of prompt strings; `stop_strings` the same strings for every
    row, or one list per row (empty strings pad rows with fewer; none at all is one column of `""`)."""
    rows = len(prompts)
    request = {"prompts": np.array(prompts, object)}
    request.update(row_settings(rows, max_new_tokens, stop_token_ids, **settings))
    stop = [] if stop_strings is None else list(stop_strings)
    if not stop or isinstance(stop[0], str):  # the same strings for every row
        stop = [stop] * rows
    width = max(1, max(len(row) for row in stop))
    request["stop_strings"] = np.array([list(row) + [""] * (width - len(row)) for row in stop], object)
    return request


def decode_chunk_request(state, num_tokens):
    """The inputs of `decode_chunk`: the `state_*` outputs of `prefill` (or of the last `decode_chunk`) and the
    number of new tokens to decode, for every row."""
    state = {name: value for name, value in state.items() if name.startswith("state_")}
    rows = len(next(iter(state.values())))
    return dict(state, num_tokens=np.full((rows,), num_tokens, np.int32))
