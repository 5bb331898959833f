"""One generator for every model that implements the generation protocol.

The protocol (what `Generator` asks of a model):

- `vocabulary_size`: ids are in `[0, vocabulary_size)` (or
  `output_vocabulary_size`, when the generated ids have a vocabulary of
  their own: an encoder-decoder model's target side).
- `max_length`: the longest context the model was trained on, or `None`
  when nothing limits it. The generator never attends over more: past it,
  it slides a window of that many positions (or raises, `overflow="error"`).
- `sliding_window_cache`: `True` when `call_with_cache` accepts `window=W`
  with ring caches of `W` slots (relative or no positions); otherwise the
  window is re-encoded at positions `0 .. W - 1` each step.
- `init_cache(batch_size, length, window=None, **cache_inputs)`: empty
  caches, any nest of tensors with the batch on axis 0.
- `resize_cache(cache, length)`: the caches grown to `length` positions.
- `call_with_cache(token_ids (B, T), cache, index, window=None)`:
  `(logits (B, T, V) float32, cache)` for the tokens at positions
  `index .. index + T - 1`.

Models get `generate` from `GenerationMixin`.
"""

import keras
import numpy as np
from keras import ops

from keras_tfam.generation.decoding import decode, plan_decoding
from keras_tfam.generation.prompts import as_padded_prompts, pack_prompts, prompt_checks, raise_failed_checks
from keras_tfam.generation.search import get_search
from keras_tfam.utils import check_positive_int

PROTOCOL = ("init_cache", "resize_cache", "call_with_cache")
OVERFLOWS = ("slide", "error")


def check_protocol(model):
    """Raises a `ValueError` unless `model` implements the generation protocol."""
    missing = [name for name in PROTOCOL if not callable(getattr(model, name, None))]
    missing += [name for name in ("vocabulary_size", "max_length") if not hasattr(model, name)]
    if missing:
        raise ValueError(
            f"The model does not implement the generation protocol (see keras_tfam.generation): it lacks "
            f"{missing}. Received: model={type(model).__name__}"
        )


def output_vocabulary_size(model):
    """The vocabulary of the ids a model generates (and reads as a prompt)."""
    return getattr(model, "output_vocabulary_size", None) or model.vocabulary_size


def resolve_window(model, window=None, overflow="slide", prompt_length=None, max_new_tokens=None):
    """The context each step may see: `window`, else the model's `max_length`, or `None`.

    Raises a `ValueError` for a window longer than the model's context (it
    would attend over untrained distances), and, with `overflow="error"`,
    for a request that does not fit in the context.
    """
    if overflow not in OVERFLOWS:
        raise ValueError(f"`overflow` must be one of {OVERFLOWS}. Received: overflow={overflow!r}")
    limit = model.max_length
    if window is not None:
        check_positive_int("window", window)
        if limit is not None and window > limit:
            raise ValueError(
                f"`window` cannot exceed the {limit} positions the model was trained on (max_length): it would "
                f"attend over untrained distances. Received: window={window}"
            )
    window = window or limit
    if window is None or prompt_length is None:
        return window
    total = prompt_length + max_new_tokens
    if total > window and overflow == "error":
        raise ValueError(
            f"Prompt length {prompt_length} + max_new_tokens {max_new_tokens} = {total} exceeds the model's "
            f"context of {window} positions (max_length={limit}). Use overflow='slide' to keep generating with "
            f"a sliding window of the last {window} tokens."
        )
    return window


def compile_function(fn, model, jit_compile=True):
    """`fn` compiled for the running Keras backend, reading the model's current weights.

    The one place that touches a backend's compiler: `tf.function` (XLA
    with `jit_compile`) on TensorFlow; `jax.jit` on JAX, with the model's
    variables passed in as arguments (a stateless call), so the compiled
    function sees the weights of the moment it is called; eager under
    `torch.no_grad` on PyTorch.
    """
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf  # the backend Keras already runs on

        return tf.function(fn, jit_compile=jit_compile)
    if backend == "jax":
        import jax

        variables = list(getattr(model, "variables", []))

        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return fn(*args)

        compiled = jax.jit(stateless) if jit_compile else stateless
        return lambda *args: compiled([variable.value for variable in variables], *args)
    if backend == "torch":
        import torch

        def no_grad(*args):
            with torch.no_grad():
                return fn(*args)

        return no_grad
    return fn


class Generator:
    """Generates from any model implementing the generation protocol (module docstring).

    Owns prompt packing and checks, the compiled loop (one per sampler or
    beam setting, prompt width and length; reused across calls), cache
    growth, the sliding window past the model's context, stop tokens and
    padding. `Generator.for_model(model)` returns the model's own
    generator, so its compiled functions are reused.

    Example:

    >>> generator = Generator(model)
    >>> generator.generate([[464, 3290], [40]], max_new_tokens=32, sampler="top_p", seed=0)
    """

    def __init__(self, model):
        check_protocol(model)
        self.model = model
        self._functions = {}

    @classmethod
    def for_model(cls, model):
        generator = model.__dict__.get("_keras_tfam_generator")
        if generator is None:
            generator = cls(model)
            model.__dict__["_keras_tfam_generator"] = generator
        return generator

    def generate(
        self,
        token_ids,
        max_new_tokens,
        sampler="greedy",
        beam_size=1,
        length_penalty=0.0,
        seed=None,
        stop_token_ids=None,
        pad_token_id=0,
        window=None,
        overflow="slide",
        jit_compile=True,
        cache_inputs=None,
    ):
        """Generates up to `max_new_tokens` tokens after each prompt.

        The prompts are prefilled in one pass, then one token per step is
        decoded in a compiled loop over static caches.

        Args:
            token_ids: a `(B, T)` int array, a list of prompts of different
                lengths, or one prompt.
            max_new_tokens: new tokens per prompt.
            sampler: `"greedy"`, `"random"`, `"top_k"`, `"top_p"`, a
                `keras_tfam.generation.Sampler` or a keras-hub sampler.
            beam_size: more than 1 for beam search (no sampler).
            length_penalty: beam search's GNMT `alpha`.
            seed: int seed of the sampling (same seed, same tokens, on every
                backend); random when `None`.
            stop_token_ids: ids that end a row (kept, then padding).
            pad_token_id: fills a row after it stops.
            window: attend to at most this many most recent positions;
                default the model's `max_length`. Past it the window slides.
            overflow: `"slide"` (default) or `"error"`: what to do when the
                prompt plus the new tokens exceed the window.
            jit_compile: compile the loop with XLA (TensorFlow, JAX).
            cache_inputs: dict of `(B, ...)` arrays for `model.init_cache`
                (an encoder-decoder model's source).

        Returns:
            `(B, T + max_new_tokens)` int32 NumPy array: each prompt, then its
            new tokens, then padding (a shorter prompt's row is padded at the
            end).
        """
        model = self.model
        search = get_search(sampler, beam_size, length_penalty)
        check_positive_int("max_new_tokens", max_new_tokens)
        padded, lengths = as_padded_prompts(token_ids, pad_token_id)
        raise_failed_checks(prompt_checks(padded, lengths, max_new_tokens, output_vocabulary_size(model)))
        window = resolve_window(model, window, overflow, padded.shape[1], max_new_tokens)
        plan = plan_decoding(model, padded.shape[1] + max_new_tokens, int(lengths.min()), window)
        stop = np.asarray(list(stop_token_ids or []), np.int32).reshape(-1)
        if seed is None:
            seed = int(np.random.randint(0, 2**31 - 1))
        seed = np.asarray(seed, np.int64).astype(np.uint32).astype(np.int32)  # any int, as 32 bits
        names = tuple(sorted(cache_inputs or {}))
        values = [np.asarray(cache_inputs[name]) for name in names]
        for name, value in zip(names, values):
            if value.ndim == 0 or value.shape[0] != len(lengths):
                raise ValueError(
                    f"`cache_inputs[{name!r}]` must have one row per prompt ({len(lengths)}). "
                    f"Received: shape={value.shape}"
                )
        function = self._function(search, plan, int(max_new_tokens), int(pad_token_id), jit_compile, names)
        return ops.convert_to_numpy(function(padded, lengths, seed, stop, *values))

    def _function(self, search, plan, max_new_tokens, pad_token_id, jit_compile, names):
        key = (search.cache_key(), plan, max_new_tokens, pad_token_id, jit_compile, names)
        if key not in self._functions:

            def generate_fn(token_ids, lengths, seed, stop_token_ids, *values):
                tokens = pack_prompts(token_ids, lengths, max_new_tokens, pad_token_id)
                return decode(
                    self.model, tokens, lengths, max_new_tokens, search, seed, stop_token_ids, pad_token_id,
                    plan, dict(zip(names, values)),
                )

            self._functions[key] = (search, compile_function(generate_fn, self.model, jit_compile))
        return self._functions[key][1]


def generate_graph(model, token_ids, lengths, max_new_tokens, search, seed, stop_token_ids=None, pad_token_id=0,
                   window=None):
    """The whole generation as ops on tensors of any (dynamic) shape, unchecked.

    What an exported serving signature embeds: enforce `prompt_checks`
    before it (as assertions), then call this inside the traced function.
    Past the model's context the window slides (`window` defaults to its
    `max_length`).
    """
    check_protocol(model)
    window = resolve_window(model, window)
    tokens = pack_prompts(token_ids, lengths, max_new_tokens, pad_token_id)
    plan = plan_decoding(model, None, None, window)
    if stop_token_ids is None:
        stop_token_ids = ops.zeros((0,), "int32")
    return decode(model, tokens, lengths, max_new_tokens, search, seed, stop_token_ids, pad_token_id, plan)


def windowed_logits(model, token_ids, window=None, batch_size=64):
    """Teacher-forced logits `(B, T, V)` under the rule generation follows.

    Each position sees at most the `window` most recent tokens (itself
    included); `window` defaults to the model's `max_length` (no limit when
    `None`). A model with `sliding_window_cache` runs the sequence once
    over a ring cache; any other model re-encodes, for each position past
    the window, the `window` tokens ending there at positions
    `0 .. window - 1`, exactly as generation does.
    """
    check_protocol(model)
    window = resolve_window(model, window)
    token_ids = np.asarray(token_ids, np.int32)
    batch, length = token_ids.shape
    if window is None or length <= window:
        logits, _ = model.call_with_cache(token_ids, model.init_cache(batch, length), 0)
        return ops.convert_to_numpy(logits)
    if getattr(model, "sliding_window_cache", False):
        cache = model.init_cache(batch, length, window=window)
        return ops.convert_to_numpy(model.call_with_cache(token_ids, cache, 0, window=window)[0])
    first, _ = model.call_with_cache(token_ids[:, :window], model.init_cache(batch, window), 0)
    starts = np.arange(1, length - window + 1)
    windows = token_ids[:, starts[:, None] + np.arange(window)].reshape(-1, window)  # [B * n, W]
    last = []
    for start in range(0, len(windows), batch_size):
        chunk = windows[start : start + batch_size]
        logits, _ = model.call_with_cache(chunk, model.init_cache(len(chunk), window), 0)
        last.append(ops.convert_to_numpy(logits[:, -1]))
    rest = np.concatenate(last).reshape(batch, len(starts), -1)
    return np.concatenate([ops.convert_to_numpy(first), rest], axis=1)


class GenerationMixin:
    """Gives a model implementing the generation protocol a `generate` method.

    `model.generate(...)` is `Generator.for_model(model).generate(...)`: see
    `Generator.generate` for the arguments.
    """

    def generate(self, token_ids, max_new_tokens, **options):
        """Generates up to `max_new_tokens` tokens after each prompt (see `Generator.generate`)."""
        return Generator.for_model(self).generate(token_ids, max_new_tokens, **options)
