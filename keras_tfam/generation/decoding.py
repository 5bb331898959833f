"""The KV-cached decoding loop: one token per step in a `keras.ops.while_loop`.

Rows of a batch may have prompts of different lengths. Prompts sit
right-padded in a `(R, L)` buffer; every row advances through the same
position `i` each step. A row still inside its prompt keeps its prompt token
(the step only writes its keys/values into the cache), a row past it takes
the chosen token. So all rows share one cache update index, the caches are
static, and nothing is recompiled per prompt length.

How the model sees its context is decided before the loop (`DecodePlan`):

- **full**: a cache for the whole buffer. With a static buffer the caches
  start at half of it and grow once (`segment_ends`), so early steps read
  fewer slots.
- **ring**: the model attends to the last `window` positions only, its
  caches are rings of `window` slots (`init_cache(..., window=W)`): any
  number of tokens in O(window) memory and time per token. For models
  whose positions are relative or absent (`model.sliding_window_cache`).
- **re-encode**: the same rule for models with absolute positions: once the
  buffer passes `window` positions, each step runs the model on the last
  `window` tokens at positions `0 .. window - 1` (nanoGPT's crop).

Everything is `keras.ops`, so the same function runs compiled with XLA, in
`jax.jit`, or inside an exported TensorFlow graph with dynamic shapes. The
loop runs inside the engine the caller entered (`keras_tfam.engine`), which
may prepare loop invariants before it (`Engine.loop`).
"""

import dataclasses
from typing import Optional, Tuple

import keras
from keras import ops

from keras_tfam.engine import current_engine
from keras_tfam.generation.samplers import step_key

MODES = ("full", "ring", "re-encode")
# Caches of static buffers from this many positions start at half the buffer
# and grow once: attention reads every slot, so without it a step early in a
# long buffer costs as much as the last one. Each segment is one more compiled
# loop body to compile.
_SEGMENTED_FROM = 256


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """The static decisions of one generation call.

    Args:
        mode: `"full"`, `"ring"` or `"re-encode"` (see the module).
        window: positions a step attends to (`ring`, `re-encode`), or `None`.
        prefill_length: positions run in one pass before the loop, or `None`
            when the prompt lengths are not static (then `min(lengths) - 1`,
            or `0` when re-encoding would start at once).
        segment_ends: where full caches grow (positions below the buffer length).

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=16)
        >>> plan_decoding(model, buffer_length=10, shortest_prompt=2)
        DecodePlan(mode='full', window=None, prefill_length=1, segment_ends=())
    """

    mode: str
    window: Optional[int] = None
    prefill_length: Optional[int] = None
    segment_ends: Tuple[int, ...] = ()


def plan_decoding(model, buffer_length=None, shortest_prompt=None, window=None):
    """A `DecodePlan` for a model, a buffer and a window.

    Args:
        model: implements the generation protocol.
        buffer_length: static `P + max_new_tokens`, or `None` (dynamic).
        shortest_prompt: static `min(lengths)`, or `None`.
        window: the context each step may see (at most the model's
            `max_length`), or `None` for the whole buffer.
    """
    static = buffer_length is not None and shortest_prompt is not None
    if window is None or (buffer_length is not None and buffer_length <= window):
        prefill = shortest_prompt - 1 if static else None
        ends = ()
        if static and buffer_length >= _SEGMENTED_FROM and -(-buffer_length // 2) > prefill + 1:
            ends = (-(-buffer_length // 2),)
        return DecodePlan("full", None, prefill, ends)
    if model.sliding_window_cache:
        return DecodePlan("ring", window, shortest_prompt - 1 if static else None)
    prefill = None
    if shortest_prompt is not None:
        prefill = shortest_prompt - 1 if shortest_prompt <= window else 0
    return DecodePlan("re-encode", window, prefill)


def decoding_variables(model):
    """The variables a decoding model computes with: its own, or, for a wrapper that is no Keras layer, those
    of the model it wraps (`DecodingWrapper.wrapped`)."""
    while not hasattr(model, "variables") and getattr(model, "wrapped", None) is not None:
        model = model.wrapped
    return list(getattr(model, "variables", ()))


def decode(
    model, tokens, prompt_lengths, max_new_tokens, search, seed, stop_token_ids, pad_token_id, plan, cache_inputs=None
):
    """Fills `tokens` position by position after each row's prompt.

    Args:
        model: implements the generation protocol (`init_cache`,
            `resize_cache`, `call_with_cache`).
        tokens: `(B, L)` int32; row `b` holds its prompt in
            `[0, prompt_lengths[b])`, `pad_token_id` after it.
        prompt_lengths: `(B,)` int32, each at least 1.
        max_new_tokens: scalar; row `b` gets at most this many new tokens.
        search: a `Sampling` or `BeamSearch` strategy.
        seed: scalar int32; step `i` draws with `step_key(seed, i)`.
        stop_token_ids: `(S,)` int32; a row that chooses one of them keeps it
            and is padded from then on.
        pad_token_id: fills rows that stopped and positions never generated.
        plan: the `DecodePlan`.
        cache_inputs: dict of `(B, ...)` tensors for `model.init_cache`
            (e.g. the source of an encoder-decoder model).

    Returns:
        `(B, L)` int32: prompts followed by the generated tokens (each
        prompt's best hypothesis under beam search).
    """
    beams = search.beam_size
    tokens = ops.cast(tokens, "int32")
    prompt_lengths = ops.cast(prompt_lengths, "int32")
    batch = ops.shape(tokens)[0]
    if beams > 1:
        tokens, prompt_lengths = (ops.repeat(x, beams, axis=0) for x in (tokens, prompt_lengths))
        cache_inputs = {k: ops.repeat(v, beams, axis=0) for k, v in (cache_inputs or {}).items()}
    rows, buffer_length = ops.shape(tokens)[0], ops.shape(tokens)[1]
    limits = prompt_lengths + ops.cast(max_new_tokens, "int32")
    stop_token_ids = ops.cast(stop_token_ids, "int32")
    seed = ops.cast(seed, "int32")
    window = plan.window
    ring_options = {"window": window} if plan.mode == "ring" else {}

    def cached_step(tokens, cache, index):
        previous = ops.slice(tokens, (0, index - 1), (rows, 1))
        options = dict(ring_options)
        if model.reads_prompt_rows:
            options["prompt_rows"] = index - 1 < prompt_lengths  # the token fed is a prompt token
        step = model.call_with_cache(previous, cache, index - 1, **options)
        return step.logits[:, -1], step.cache

    def reencode_step(tokens, cache, index):
        recent = ops.slice(tokens, (0, index - window), (rows, window))
        step = model.call_with_cache(recent, model.init_cache(rows, window, **(cache_inputs or {})), 0)
        return step.logits[:, -1], cache

    # Segments of the loop: (end, step) pairs, and the cache each starts with.
    if plan.mode == "full":
        ends = list(plan.segment_ends) + [buffer_length]
        cache_length = ends[0]
        segments = [(end, cached_step) for end in ends]
    elif plan.mode == "ring":
        cache_length = buffer_length
        segments = [(buffer_length, cached_step)]
    else:
        cache_length = window if isinstance(buffer_length, int) else ops.minimum(buffer_length, window)
        segments = [(window + 1, cached_step), (buffer_length, reencode_step)]
    cache = model.init_cache(rows, cache_length, **ring_options, **(cache_inputs or {}))

    shortest = ops.min(prompt_lengths)
    prefill = plan.prefill_length
    if prefill is None:
        prefill = shortest - 1
        if plan.mode == "re-encode":
            prefill = ops.where(shortest <= window, prefill, 0)

        def run_prefill():
            return model.call_with_cache(tokens[:, :prefill], cache, 0, **ring_options).cache

        cache = ops.cond(prefill > 0, run_prefill, lambda: cache)
    elif prefill > 0:
        cache = model.call_with_cache(tokens[:, :prefill], cache, 0, **ring_options).cache
    # Positions below the shortest prompt are prompt in every row. (When
    # re-encoding from the start, the cached segment is skipped.)
    index = shortest

    def unfinished(index, done):
        return ops.logical_and(ops.logical_not(done), index < limits)

    def make_body(step):
        def body(index, tokens, cache, done, state):
            logits, cache = step(tokens, cache, index)
            in_prompt = index < prompt_lengths
            active = ops.logical_and(ops.logical_not(in_prompt), unfinished(index, done))
            chosen, origin, done, state = search.select(
                logits, step_key(seed, index), in_prompt, active, done, state, stop_token_ids, pad_token_id
            )
            if origin is not None:
                tokens = ops.take(tokens, origin, axis=0)
                cache = keras.tree.map_structure(lambda c: ops.take(c, origin, axis=0), cache)
            current = ops.slice(tokens, (0, index), (rows, 1))[:, 0]
            column = ops.where(in_prompt, current, chosen)
            tokens = ops.slice_update(tokens, (0, index), column[:, None])
            return index + 1, tokens, cache, done, state

        return body

    done = ops.zeros((rows,), "bool")
    state = search.init_state(batch)
    # The entered engine may prepare loop invariants here, once, outside the loop.
    with current_engine().loop():
        for i, (end, step) in enumerate(segments):
            if i and plan.mode == "full":
                cache = model.resize_cache(cache, end)

            def cond(index, tokens, cache, done, state, end=end):
                live = ops.logical_and(index < end, index < buffer_length)
                return ops.logical_and(live, ops.any(unfinished(index, done)))

            loop_vars = (index, tokens, cache, done, state)
            index, tokens, cache, done, state = ops.while_loop(cond, make_body(step), loop_vars)
    return search.finalize(tokens, state)
