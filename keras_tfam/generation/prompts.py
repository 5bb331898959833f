"""Prompts: what a generation request must satisfy, and the token buffer it fills.

Prompts arrive right-padded in a `(B, P)` int array with their `(B,)`
lengths: the Python API turns a list of prompts into that form, a serving
signature receives it as is. The checks and the packing are graph ops, so
both run the same code: the Python API evaluates each check at once and
raises a `ValueError`, an exported graph turns each into an assertion
(see `raise_failed_checks`).
"""

import numpy as np
from keras import ops


def as_padded_prompts(token_ids, pad_token_id=0):
    """`(padded (B, P) int32, lengths (B,) int32)` NumPy arrays from the Python API's inputs.

    Accepts one prompt (a list of ids), a list of prompts of different
    lengths, or a `(B, P)` array or tensor (every row a full prompt).
    Raises a `ValueError` for shapes and types that are not prompts; the
    values are checked by `prompt_checks`.
    """
    if isinstance(token_ids, (list, tuple)) and token_ids and np.isscalar(token_ids[0]):
        token_ids = [token_ids]
    if not isinstance(token_ids, (list, tuple, np.ndarray)):
        token_ids = ops.convert_to_numpy(token_ids)
    if isinstance(token_ids, np.ndarray):
        if token_ids.ndim == 1:
            token_ids = token_ids[None]
        if token_ids.ndim != 2:
            raise ValueError(
                f"`token_ids` must be (batch, length) or a list of prompts. Received: shape={token_ids.shape}"
            )
    rows = [np.asarray(row).reshape(-1) for row in token_ids]
    if not rows:
        raise ValueError("`token_ids` holds no prompt. Received: token_ids=[]")
    for b, row in enumerate(rows):
        if row.size and not np.issubdtype(row.dtype, np.integer):
            raise ValueError(f"`token_ids` must be integers. Received dtype {row.dtype} in prompt {b}")
    lengths = np.array([row.size for row in rows], np.int32)
    padded = np.full((len(rows), max(int(lengths.max()), 1)), pad_token_id, np.int64)
    for b, row in enumerate(rows):
        padded[b, : row.size] = row
    if np.abs(padded).max(initial=0) >= 2**31:
        raise ValueError(f"`token_ids` holds an id outside int32. Received: {int(padded[np.abs(padded) >= 2**31][0])}")
    return padded.astype(np.int32), lengths


def prompt_checks(token_ids, lengths, max_new_tokens, vocabulary_size):
    """The conditions of a request, as `(ok, message, values)`, one at a time.

    `ok` is a scalar boolean tensor; `message` a `str.format` template whose
    `{}` take `values` (scalar tensors). A generator: a caller enforces each
    check before asking for the next, whose ops may assume it (in a graph,
    under a control dependency on the assertion).

    Args:
        token_ids: `(B, P)` int32 prompts, right-padded (the padding is ignored).
        lengths: `(B,)` int32 prompt lengths.
        max_new_tokens: scalar int, or `(B,)` per prompt.
        vocabulary_size: Python int `V`; prompt ids must be in `[0, V)`.
    """
    token_ids, lengths = ops.convert_to_tensor(token_ids, "int32"), ops.convert_to_tensor(lengths, "int32")
    batch, width = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
    count = ops.shape(lengths)[0]
    yield (
        ops.equal(count, batch),
        "`lengths` must hold one length per prompt of `token_ids` ({} prompts). Received: {} lengths.",
        [batch, count],
    )
    shortest = ops.argmin(lengths)
    yield (
        ops.all(lengths >= 1),
        "Every prompt needs at least one token (`lengths` >= 1). Received: an empty prompt at row {} (length {}).",
        [shortest, ops.take(lengths, shortest)],
    )
    longest = ops.argmax(lengths)
    yield (
        ops.all(lengths <= width),
        "`lengths` cannot exceed the width of `token_ids` ({}). Received: length {} at row {}.",
        [width, ops.take(lengths, longest), longest],
    )
    real = ops.arange(width)[None, :] < lengths[:, None]
    outside = ops.logical_and(real, ops.logical_or(token_ids < 0, token_ids >= vocabulary_size))
    first = ops.argmax(ops.cast(ops.reshape(outside, (-1,)), "int32"))
    yield (
        ops.logical_not(ops.any(outside)),
        f"`token_ids` must be in [0, {vocabulary_size}) (vocabulary_size={vocabulary_size}). "
        "Received: token id {} at prompt {}, position {}.",
        [ops.take(ops.reshape(token_ids, (-1,)), first), first // width, first % width],
    )
    max_new_tokens = ops.convert_to_tensor(max_new_tokens)
    yield (
        ops.all(max_new_tokens >= 1),
        "`max_new_tokens` must be a positive integer. Received: max_new_tokens={}",
        [ops.min(max_new_tokens)],
    )


def raise_failed_checks(checks):
    """Evaluates `(ok, message, values)` checks now, raising a `ValueError` for the first that fails."""
    for ok, message, values in checks:
        if not bool(ops.convert_to_numpy(ok)):
            raise ValueError(message.format(*(ops.convert_to_numpy(v).item() for v in values)))


def pack_prompts(token_ids, lengths, max_new_tokens, pad_token_id=0):
    """The `(B, P + max_new_tokens)` int32 buffer: each prompt, then `pad_token_id`.

    Anything in `token_ids` beyond a row's length is replaced by padding.
    """
    token_ids = ops.cast(token_ids, "int32")
    shape = ops.shape(token_ids)
    real = ops.arange(shape[1])[None, :] < ops.cast(lengths, "int32")[:, None]
    prompts = ops.where(real, token_ids, pad_token_id)
    padding = ops.full((shape[0], max_new_tokens), pad_token_id, dtype="int32")
    return ops.concatenate([prompts, padding], axis=1)
