"""The KV-cached decoding loop: one token per step in a graph `while_loop`.

Rows of a batch may have prompts of different lengths. Prompts sit
right-padded in a `(B, L)` buffer; every row advances through the same
position `i` each step. A row still inside its prompt keeps its prompt token
(the step only writes its keys/values into the cache), a row past it takes the
sampled token. So all rows share one cache update index, the cache is static,
and nothing is recompiled per prompt length.

With a static buffer length the loop can run in segments (`segment_ends`):
the caches start short and grow between segments (`resize_state`), so a step
early in the buffer reads only the keys and values of a short cache rather
than of the whole buffer.

The loop body is TensorFlow (`tf.while_loop`, stateless sampling) so the same
function runs compiled with XLA in `generate`, and inside an exported
SavedModel without XLA.
"""

import tensorflow as tf


def decode(
    step,
    tokens,
    prompt_lengths,
    state,
    max_new_tokens,
    sampler,
    seed,
    stop_token_ids=None,
    pad_token_id=0,
    segment_ends=(),
    resize_state=None,
):
    """Fills `tokens` position by position after each row's prompt.

    Args:
        step: `step(token_ids (B, 1), state, index) -> (logits (B, V), state)`
            runs the model on the token at position `index`, writing its
            keys/values at `index`, and returns the logits for `index + 1`.
        tokens: `(B, L)` int32; row `b` holds its prompt in
            `[0, prompt_lengths[b])`, `pad_token_id` after it.
        prompt_lengths: `(B,)` int32, each at least 1.
        state: the caches (any nest of tensors), holding at least the keys
            and values of positions `< min(prompt_lengths) - 1`.
        max_new_tokens: scalar; row `b` gets at most this many new tokens.
        sampler: `sampler(logits, seed) -> (B,)` int32.
        seed: `(2,)` int32 seed; step `i` samples with a seed folded with `i`.
        stop_token_ids: `(S,)` int32; a row that samples one of them keeps it
            and is padded from then on.
        pad_token_id: fills rows that stopped and positions never generated.
        segment_ends: increasing positions `< L` at which the loop pauses to
            call `resize_state(state, next_end)`; `state` must hold positions
            below the first end (the last segment ends at `L`).
        resize_state: `resize_state(state, length) -> state` with room for
            `length` positions.

    Returns:
        `(B, L)` int32: prompts followed by the generated tokens.
    """
    tokens = tf.convert_to_tensor(tokens, tf.int32)
    prompt_lengths = tf.convert_to_tensor(prompt_lengths, tf.int32)
    batch_size, buffer_length = tf.shape(tokens)[0], tf.shape(tokens)[1]
    limits = prompt_lengths + tf.cast(max_new_tokens, tf.int32)
    if stop_token_ids is None:
        stop_token_ids = tf.zeros((0,), tf.int32)
    stop_token_ids = tf.convert_to_tensor(stop_token_ids, tf.int32)
    seed = tf.convert_to_tensor(seed, tf.int32)
    pad = tf.fill([batch_size], tf.constant(pad_token_id, tf.int32))

    def unfinished(index, done):
        return tf.logical_and(tf.logical_not(done), index < limits)

    def cond(index, tokens, state, done):
        return tf.logical_and(index < buffer_length, tf.reduce_any(unfinished(index, done)))

    def body(index, tokens, state, done):
        previous = tf.slice(tokens, [0, index - 1], [batch_size, 1])
        logits, state = step(previous, state, index - 1)
        sampled = sampler(logits, tf.random.experimental.stateless_fold_in(seed, index))
        sampled = tf.ensure_shape(tf.cast(sampled, tf.int32), prompt_lengths.shape)
        in_prompt = index < prompt_lengths
        generating = tf.logical_and(tf.logical_not(in_prompt), unfinished(index, done))
        current = tf.slice(tokens, [0, index], [batch_size, 1])[:, 0]
        chosen = tf.where(in_prompt, current, tf.where(generating, sampled, pad))
        is_stop = tf.reduce_any(tf.equal(sampled[:, None], stop_token_ids[None, :]), axis=-1)
        done = tf.logical_or(done, tf.logical_and(generating, is_stop))
        tokens = tf.tensor_scatter_nd_update(
            tokens,
            tf.stack([tf.range(batch_size), tf.fill([batch_size], index)], axis=1),
            chosen,
        )
        return index + 1, tokens, state, done

    index = tf.reduce_min(prompt_lengths)
    done = tf.zeros([batch_size], tf.bool)
    ends = list(segment_ends) + [buffer_length]
    for i, end in enumerate(ends):
        if i:
            state = resize_state(state, end)

        def segment_cond(index, tokens, state, done, end=end):
            return tf.logical_and(index < end, cond(index, tokens, state, done))

        index, tokens, state, done = tf.while_loop(segment_cond, body, (index, tokens, state, done))
    return tokens
