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
from keras_tfam.generation.processors import DecodeContext, apply_processors, ends_stop_sequence
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
    model,
    tokens,
    prompt_lengths,
    max_new_tokens,
    search,
    seed,
    stop_token_ids,
    pad_token_id,
    plan,
    cache_inputs=None,
    processors=(),
    stop_sequences=None,
    logprobs=False,
):
    """Fills `tokens` position by position after each row's prompt.

    Args:
        model: implements the generation protocol (`init_cache`,
            `resize_cache`, `call_with_cache`).
        tokens: `(B, L)` int32; row `b` holds its prompt in
            `[0, prompt_lengths[b])`, `pad_token_id` after it.
        prompt_lengths: `(B,)` int32, each at least 1.
        max_new_tokens: scalar, or `(B,)` per row; row `b` gets at most
            this many new tokens.
        search: a `Sampling` or `BeamSearch` strategy.
        seed: scalar int32, or `(B,)` per row; step `i` draws with
            `step_key(seed, i)`.
        stop_token_ids: `(S,)` int32, or `(B, S)` per row (negative ids are
            none); a row that chooses one of them keeps it and is padded
            from then on.
        pad_token_id: fills rows that stopped and positions never generated.
        plan: the `DecodePlan`.
        cache_inputs: dict of `(B, ...)` tensors for `model.init_cache`
            (e.g. the source of an encoder-decoder model).
        processors: `LogitsProcessor`s applied to each step's logits.
        stop_sequences: `(N, S)` int32 table (`processors.stop_sequence_table`)
            or `None`: a row whose generated tokens end with one stops.
        logprobs: also return each chosen token's log-probability under the
            model's logits (before processors).

    Returns:
        A dict: `token_ids` `(B, L)` int32, the prompts followed by the
        generated tokens (each prompt's best hypothesis under beam search);
        `num_generated` `(B,)` int32 (a stop token counted); with `logprobs`,
        `logprobs` `(B, L)` float32 at the generated positions, 0 elsewhere.
    """
    loop = DecodingLoop(model, search, pad_token_id, plan, processors, stop_sequences, logprobs)
    state = loop.start(tokens, prompt_lengths, max_new_tokens, seed, stop_token_ids, cache_inputs)
    return loop.finish(loop.run(state))


def per_row_setting(value, rows, dtype):
    """A scalar or `(B,)` setting as `(rows,)`, each prompt's value repeated for its beams."""
    value = ops.cast(value, dtype)
    if len(value.shape) == 0:
        return ops.full((rows,), value, dtype)
    return ops.repeat(value, rows // ops.shape(value)[0], axis=0) if isinstance(rows, int) else value


class DecodingLoop:
    """The decoding loop in three parts: `start` (the prefill) returns the loop's state, `run` advances it (to
    a position, or to the end), `finish` turns it into the outputs. A state is a flat dict of tensors, so
    it can leave a compiled function and come back (streaming, resumable serving).

    Args:
        model, search, pad_token_id, plan, processors, stop_sequences, logprobs: as for `decode`.
    """

    def __init__(self, model, search, pad_token_id, plan, processors=(), stop_sequences=None, logprobs=False):
        self.model, self.search, self.pad_token_id, self.plan = model, search, pad_token_id, plan
        self.processors, self.stop_sequences, self.logprobs = tuple(processors), stop_sequences, logprobs

    def start(self, tokens, prompt_lengths, max_new_tokens, seed, stop_token_ids, cache_inputs=None):
        """The state after the prefill: every position below the shortest prompt is in the caches."""
        model, plan, beams = self.model, self.plan, self.search.beam_size
        tokens = ops.cast(tokens, "int32")
        prompt_lengths = ops.cast(prompt_lengths, "int32")
        batch = ops.shape(tokens)[0]
        stop_token_ids = ops.cast(stop_token_ids, "int32")
        seed = ops.convert_to_tensor(seed, "int32")
        if beams > 1:
            tokens, prompt_lengths = (ops.repeat(x, beams, axis=0) for x in (tokens, prompt_lengths))
            cache_inputs = {k: ops.repeat(v, beams, axis=0) for k, v in (cache_inputs or {}).items()}
            if len(stop_token_ids.shape) == 2:
                stop_token_ids = ops.repeat(stop_token_ids, beams, axis=0)
        rows, buffer_length = ops.shape(tokens)[0], ops.shape(tokens)[1]
        window = plan.window
        ring_options = {"window": window} if plan.mode == "ring" else {}
        if plan.mode == "re-encode":
            cache_length = window if isinstance(buffer_length, int) else ops.minimum(buffer_length, window)
        else:
            cache_length = (list(plan.segment_ends) + [buffer_length])[0] if plan.mode == "full" else buffer_length
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
        # Positions below the shortest prompt are prompt in every row. (When re-encoding from the start, the
        # cached segment is skipped.)
        state = {
            "index": ops.cast(shortest, "int32"),
            "token_ids": tokens,
            "cache": cache,
            "done": ops.zeros((rows,), "bool"),
            "search": self.search.init_state(batch),
            "num_generated": ops.zeros((rows,), "int32"),
            "prompt_lengths": prompt_lengths,
            "limits": prompt_lengths + per_row_setting(max_new_tokens, rows, "int32"),
            "seed": per_row_setting(seed, rows, "int32") if len(seed.shape) else seed,
            "stop_token_ids": stop_token_ids,
            "cache_inputs": dict(cache_inputs or {}),
        }
        if self.logprobs:
            state["logprobs"] = ops.zeros((rows, buffer_length), "float32")
        return state

    def _step(self, state, index, reencode):
        """`(logits (R, V), cache)` for position `index` from the tokens before it."""
        model, plan, tokens, cache = self.model, self.plan, state["token_ids"], state["cache"]
        rows = ops.shape(tokens)[0]
        if reencode:
            window = plan.window
            recent = ops.slice(tokens, (0, index - window), (rows, window))
            step = model.call_with_cache(recent, model.init_cache(rows, window, **state["cache_inputs"]), 0)
            return step.logits[:, -1], cache
        previous = ops.slice(tokens, (0, index - 1), (rows, 1))
        options = {"window": plan.window} if plan.mode == "ring" else {}
        if model.reads_prompt_rows:
            options["prompt_rows"] = index - 1 < state["prompt_lengths"]  # the token fed is a prompt token
        step = model.call_with_cache(previous, cache, index - 1, **options)
        return step.logits[:, -1], step.cache

    def _body(self, state, reencode):
        search, pad_token_id = self.search, self.pad_token_id
        index, tokens, done = state["index"], state["token_ids"], state["done"]
        prompt_lengths, rows = state["prompt_lengths"], ops.shape(tokens)[0]
        logits, cache = self._step(state, index, reencode)
        raw = ops.cast(logits, "float32")
        steered = apply_processors(self.processors, raw, DecodeContext(tokens, index, prompt_lengths))
        in_prompt = index < prompt_lengths
        unfinished = ops.logical_and(ops.logical_not(done), index < state["limits"])
        active = ops.logical_and(ops.logical_not(in_prompt), unfinished)
        chosen, origin, done, search_state = search.select(
            steered,
            step_key(state["seed"], index),
            in_prompt,
            active,
            done,
            state["search"],
            state["stop_token_ids"],
            pad_token_id,
        )
        state = dict(state, cache=cache, done=done, search=search_state)
        generated = active
        if origin is not None:
            generated = ops.take(active, origin, axis=0)
            reordered = ("token_ids", "num_generated", "logprobs") if self.logprobs else ("token_ids", "num_generated")
            state.update({name: ops.take(state[name], origin, axis=0) for name in reordered})
            state["cache"] = keras.tree.map_structure(lambda c: ops.take(c, origin, axis=0), cache)
        tokens = state["token_ids"]
        current = ops.slice(tokens, (0, index), (rows, 1))[:, 0]
        tokens = ops.slice_update(tokens, (0, index), ops.where(in_prompt, current, chosen)[:, None])
        if self.stop_sequences is not None:
            ended = ends_stop_sequence(tokens, index, prompt_lengths, self.stop_sequences)
            state["done"] = ops.logical_or(state["done"], ops.logical_and(generated, ended))
        if self.logprobs:
            # log_softmax at the chosen ids only: each one's logit less its row's logsumexp.
            if origin is not None:
                raw = ops.take(raw, origin, axis=0)
            chosen_logits = ops.take_along_axis(raw, ops.maximum(chosen, 0)[:, None], axis=1)[:, 0]
            chosen_scores = chosen_logits - ops.logsumexp(raw, axis=-1)
            column = ops.where(generated, chosen_scores, 0.0)
            state["logprobs"] = ops.slice_update(state["logprobs"], (0, index), column[:, None])
        state["num_generated"] = state["num_generated"] + ops.cast(generated, "int32")
        state["token_ids"] = tokens
        state["index"] = index + 1
        return state

    def run(self, state, until=None):
        """The state advanced to position `until` (exclusive), or until every row is done.

        A state with `until` keeps its caches' shapes, so a plan that grows its caches (`segment_ends`)
        runs to the end only.
        """
        plan = self.plan
        buffer_length = ops.shape(state["token_ids"])[1]
        if plan.mode == "full":
            segments = [(end, False) for end in list(plan.segment_ends) + [buffer_length]]
        elif plan.mode == "ring":
            segments = [(buffer_length, False)]
        else:
            segments = [(plan.window + 1, False), (buffer_length, True)]
        if until is not None and len(segments) > 1 and plan.mode == "full":
            raise ValueError("A decoding plan that grows its caches runs to the end only (no `until`).")
        # Values that stay the same through the loop travel outside its variables.
        constant = {name: state[name] for name in ("prompt_lengths", "limits", "seed", "stop_token_ids")}
        constant["cache_inputs"] = state["cache_inputs"]
        names = [name for name in state if name not in constant]
        with current_engine().loop():
            for i, (end, reencode) in enumerate(segments):
                if i and plan.mode == "full":
                    state = dict(state, cache=self.model.resize_cache(state["cache"], end))
                bound = end if until is None else ops.minimum(end, until)

                def cond(*values, bound=bound):
                    current = dict(zip(names, values))
                    index = current["index"]
                    unfinished = ops.logical_and(ops.logical_not(current["done"]), index < constant["limits"])
                    live = ops.logical_and(index < bound, index < buffer_length)
                    return ops.logical_and(live, ops.any(unfinished))

                def body(*values, reencode=reencode):
                    updated = self._body(dict(constant, **dict(zip(names, values))), reencode)
                    return tuple(updated[name] for name in names)

                values = ops.while_loop(cond, body, tuple(state[name] for name in names))
                state = dict(constant, **dict(zip(names, values)))
        return state

    def finished(self, state):
        """Scalar bool: whether every row is done or at its limit (nothing more to generate)."""
        unfinished = ops.logical_and(ops.logical_not(state["done"]), state["index"] < state["limits"])
        live = state["index"] < ops.shape(state["token_ids"])[1]
        return ops.logical_not(ops.logical_and(live, ops.any(unfinished)))

    def finish(self, state):
        """The outputs of `decode` from a state."""
        rows = self.search.best_rows(state["search"])
        outputs = {"token_ids": state["token_ids"], "num_generated": state["num_generated"]}
        if self.logprobs:
            outputs["logprobs"] = state["logprobs"]
        if rows is not None:
            outputs = {name: ops.take(value, rows, axis=0) for name, value in outputs.items()}
        return outputs
