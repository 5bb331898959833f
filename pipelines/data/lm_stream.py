"""Language-modelling streams: a split tokenized in order and cut into blocks.

The split's tokens are concatenated in order and read as if preceded by one
end-of-line token, so every token of the split is a target exactly once:
block `i` has inputs `stream[iL : iL + L]` and targets `stream[iL + 1 : iL + L + 1]`
(`L + 1` tokens, consecutive blocks sharing one). No padding inside the
stream; the final partial block is padded and its padding gets weight 0, so
nothing is dropped. Elements are `(inputs, targets, weights)`.
"""

import numpy as np
import tensorflow as tf


def _without_autotuning(dataset):
    """`dataset` without tf.data's autotuning, which has nothing to tune in these streams.

    Deleting an autotuned iterator often waits for its tuning thread's next wake, so a `fit` or an
    evaluation over the stream would end then instead of at its last batch. These streams are slices
    of in-memory arrays, batched and prefetched: nothing to tune but the prefetch buffer, which
    `prefetch(AUTOTUNE)` still grows without it.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def tokenize_lines(tokenizer, lines, chunk=4096):
    """The flat int32 token stream of `lines` (each ending in the end-of-line token)."""
    parts = []
    for start in range(0, len(lines), chunk):
        ids = tokenizer.tokenize(tf.constant(lines[start : start + chunk], dtype=tf.string))
        parts.append(np.asarray(ids.flat_values, np.int32))
    return np.concatenate(parts) if parts else np.zeros((0,), np.int32)


def make_blocks(tokens, sequence_length, start_id):
    """`(inputs, targets, weights)` arrays of shape `(num_blocks, sequence_length)`."""
    if not isinstance(sequence_length, int) or sequence_length < 1:
        raise ValueError(f"`sequence_length` must be a positive integer. Received: sequence_length={sequence_length!r}")
    tokens = np.asarray(tokens, np.int32)
    if tokens.size == 0:
        raise ValueError("The token stream is empty: nothing to make blocks from")
    num_blocks = -(-tokens.size // sequence_length)
    stream = np.zeros(num_blocks * sequence_length + 1, np.int32)
    stream[0] = start_id
    stream[1 : tokens.size + 1] = tokens
    weights = np.zeros(num_blocks * sequence_length, np.float32)
    weights[: tokens.size] = 1.0
    inputs = stream[:-1].reshape(num_blocks, sequence_length)
    targets = stream[1:].reshape(num_blocks, sequence_length)
    return inputs, targets, weights.reshape(num_blocks, sequence_length)


def lm_dataset(
    tokens,
    sequence_length,
    batch_size,
    start_id,
    shuffle=False,
    seed=None,
    drop_remainder=False,
    repeat=False,
):
    """A `tf.data` stream of `(inputs, targets, weights)` batches.

    Args:
        tokens: the split's flat token stream.
        sequence_length: tokens per block.
        batch_size: blocks per batch (the global batch under a strategy).
        start_id: the token read before the first one (end-of-line).
        shuffle: shuffle the blocks, with `seed`, anew each epoch.
        drop_remainder: drop the last partial batch (static shapes for
            training); evaluation keeps it.
        repeat: repeat forever (training by steps).

    The dataset is cached after tokenization and blocking, prefetched with
    AUTOTUNE, and auto-sharded by data so multi-worker training splits it;
    tf.data's autotuning is off (see `_without_autotuning`).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"`batch_size` must be a positive integer. Received: batch_size={batch_size!r}")
    inputs, targets, weights = make_blocks(tokens, sequence_length, start_id)
    dataset = tf.data.Dataset.from_tensor_slices((inputs, targets, weights)).cache()
    if shuffle:
        dataset = dataset.shuffle(len(inputs), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    dataset = dataset.batch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    return _without_autotuning(dataset.with_options(options))


def context_windows(tokens, context_length, start_id):
    """`(windows (N, T), next_tokens (N,))`: one window per token of `tokens`.

    Window `i` holds the `T` tokens before token `i`, the stream read as
    preceded by `start_id` (left-filled with it where the stream is shorter),
    so every token is predicted exactly once.
    """
    tokens = np.asarray(tokens, np.int32)
    padded = np.concatenate([np.full(context_length, start_id, np.int32), tokens])
    index = np.arange(tokens.size)[:, None] + np.arange(context_length)[None, :]
    return padded[index], tokens


def stateful_blocks(tokens, sequence_length, batch_size, start_id):
    """`(inputs, targets, weights)` of shape `(steps, batch_size, sequence_length)`: a stateful stream.

    The stream (read as preceded by `start_id`) is cut into `batch_size`
    consecutive rows of `steps * sequence_length` targets, and batch `n`
    holds positions `n L .. (n + 1) L - 1` of every row: row `b` of batch
    `n + 1` continues row `b` of batch `n`, as a model with a memory of the
    previous segment (Transformer-XL) reads it. Every token is a target
    exactly once; the tail of the last row is padding of weight 0.
    """
    for name, value in (("sequence_length", sequence_length), ("batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    tokens = np.asarray(tokens, np.int32)
    steps = max(1, -(-tokens.size // (batch_size * sequence_length)))
    padded = np.zeros(steps * batch_size * sequence_length, np.int32)
    padded[: tokens.size] = tokens
    inputs, targets, weights = make_blocks(padded, sequence_length, start_id)
    weights.reshape(-1)[tokens.size :] = 0.0
    # Blocks in stream order: row b holds blocks b * steps .. (b + 1) * steps - 1.
    return tuple(a.reshape(batch_size, steps, sequence_length).swapaxes(0, 1) for a in (inputs, targets, weights))


def stateful_lm_dataset(tokens, sequence_length, batch_size, start_id, repeat=False):
    """A `tf.data` stream of `(inputs, targets, weights)` batches, each continuing the previous one per row.

    For models with `stateful_stream` (see `stateful_blocks`): no shuffling
    (the order is the point), every batch full, `.skip(n)` resumes exactly
    where batch `n` left the text. With `repeat` the stream starts over
    after its last batch (the memory then holds the end of the text once).
    """
    dataset = tf.data.Dataset.from_tensor_slices(stateful_blocks(tokens, sequence_length, batch_size, start_id))
    if repeat:
        dataset = dataset.repeat()
    return _without_autotuning(dataset.prefetch(tf.data.AUTOTUNE))
