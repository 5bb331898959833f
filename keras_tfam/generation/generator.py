"""One generator for every model that implements the generation protocol (`protocol.DecodingModel`).

Models get `generate` from `GenerationMixin`.
"""

import collections

import keras
import numpy as np
from keras import ops

from keras_tfam.engine import PLAIN, Engine
from keras_tfam.generation.decoding import decode, decoding_variables, plan_decoding
from keras_tfam.generation.prompts import as_padded_prompts, pack_prompts, prompt_checks, raise_failed_checks
from keras_tfam.generation.protocol import DecodingModel, check_protocol
from keras_tfam.generation.search import get_search
from keras_tfam.utils import check_positive_int, is_integer, static_dim

OVERFLOWS = ("slide", "error")
ENGINES = ("auto", "plain")
# Compiled decoding loops a generator keeps (the least recently used goes first).
MAX_COMPILED_LOOPS = 8


def length_bucket(max_new_tokens):
    """`max_new_tokens` rounded up to one of four steps per octave (16, 20, 24, 28, 32, 40, ...).

    The buffer of a compiled loop has the bucket's width and the loop stops
    at the request's own length, so requests of nearby lengths share one
    compiled loop, for at most 25% more buffer (and no more steps).
    """
    if max_new_tokens <= 16:
        return max_new_tokens
    step = 1 << (max_new_tokens.bit_length() - 3)
    return -(-max_new_tokens // step) * step


def output_vocabulary_size(model):
    """The vocabulary of the ids a model generates (and reads as a prompt)."""
    return model.output_vocabulary_size or model.vocabulary_size


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


def resolve_engine(engine="auto"):
    """The engine a decoding call enters (`keras_tfam.engine`): an `Engine` as it is, `"plain"` (Keras' own
    computation), or `"auto"`: the XLA-CPU engine on TensorFlow and JAX when every device is a CPU, else plain.
    """
    if isinstance(engine, Engine):
        return engine
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ValueError(
            f"`engine` must be one of {ENGINES} or a keras_tfam.engine.Engine. Received: engine={engine!r}"
        )
    if engine == "auto":
        from keras_tfam.engine.xla_cpu import XLA_CPU

        return XLA_CPU if XLA_CPU.runs_here() else PLAIN
    return PLAIN


def compile_function(fn, model, jit_compile=True, engine=PLAIN):
    """`fn` compiled for the running Keras backend, reading the model's current weights.

    The one place that touches a backend's compiler: `tf.function` (XLA
    with `jit_compile`) on TensorFlow; `jax.jit` on JAX (`engine.jax_jit`,
    with the engine's compiler options), with the model's variables passed
    in as arguments (a stateless call), so the compiled function sees the
    weights of the moment it is called; eager under `torch.no_grad` on
    PyTorch. `fn` enters the engine itself.
    """
    backend = keras.config.backend()
    if backend == "tensorflow":
        import tensorflow as tf  # the backend Keras already runs on

        # No autograph: the loop is backend-neutral (keras.ops control flow), and converting it takes long.
        return tf.function(fn, jit_compile=jit_compile, autograph=False)
    if backend == "jax":
        variables = list(getattr(model, "variables", []))

        def stateless(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return fn(*args)

        compiled = engine.jax_jit(stateless) if jit_compile else stateless
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

    Args:
        model: a `DecodingModel`.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=32)
        >>> generator = Generator(model)  # what `model.generate` uses
        >>> generator.generate([[46, 32], [40]], max_new_tokens=8, sampler="top_p", seed=0).shape
        (2, 10)
    """

    def __init__(self, model):
        check_protocol(model)
        self.model = model
        self._functions = collections.OrderedDict()

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
        engine="auto",
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
            engine: how the layers compute in the decoding loop
                (`keras_tfam.engine`): `"auto"` (the XLA-CPU engine on
                TensorFlow and JAX when every device is a CPU, else plain),
                `"plain"` (Keras' own computation) or an `Engine`.

        Returns:
            `(B, T + max_new_tokens)` int32 NumPy array: each prompt, then its
            new tokens, then padding (a shorter prompt's row is padded at the
            end).
        """
        model = self.model
        engine = resolve_engine(engine)
        search = get_search(sampler, beam_size, length_penalty)
        max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
        vocabulary = output_vocabulary_size(model)
        pad_token_id = check_token_id("pad_token_id", pad_token_id, vocabulary)
        if stop_token_ids is None or is_integer(stop_token_ids):  # one id, or none
            stop_token_ids = [] if stop_token_ids is None else [stop_token_ids]
        if not isinstance(stop_token_ids, (list, tuple, np.ndarray)):
            raise ValueError(
                f"`stop_token_ids` must be a token id or a list of them. Received: stop_token_ids={stop_token_ids!r}"
            )
        stop = np.asarray(
            [check_token_id("stop_token_ids", i, vocabulary) for i in np.asarray(stop_token_ids, object).reshape(-1)],
            np.int32,
        )
        padded, lengths = as_padded_prompts(token_ids, pad_token_id)
        if len(lengths) * search.beam_size >= 2**31:
            raise ValueError(
                f"`beam_size` times the number of prompts ({len(lengths)}) must be below 2**31 (the rows are int32 "
                f"indices). Received: beam_size={search.beam_size}"
            )
        if padded.shape[1] + length_bucket(max_new_tokens) >= 2**31:
            raise ValueError(
                f"`max_new_tokens` plus the prompt length ({padded.shape[1]}) must fit the int32 positions "
                f"(below 2**31). Received: max_new_tokens={max_new_tokens}"
            )
        raise_failed_checks(prompt_checks(padded, lengths, max_new_tokens, vocabulary))
        window = resolve_window(model, window, overflow, padded.shape[1], max_new_tokens)
        bucket = length_bucket(max_new_tokens)
        plan = plan_decoding(model, padded.shape[1] + bucket, int(lengths.min()), window)
        if seed is None:
            seed = int(np.random.randint(0, 2**31 - 1))
        if not is_integer(seed):
            raise ValueError(f"`seed` must be an integer or None. Received: seed={seed!r}")
        seed = np.asarray(int(seed) % 2**32, np.uint32).astype(np.int32)  # any int, as 32 bits
        names = tuple(sorted(cache_inputs or {}))
        values = [np.asarray(cache_inputs[name]) for name in names]
        for name, value in zip(names, values):
            if value.ndim == 0 or value.shape[0] != len(lengths):
                raise ValueError(
                    f"`cache_inputs[{name!r}]` must have one row per prompt ({len(lengths)}). "
                    f"Received: shape={value.shape}"
                )
        function = self._function(search, plan, bucket, pad_token_id, jit_compile, names, engine)
        tokens = function(padded, lengths, np.asarray(max_new_tokens, np.int32), seed, stop, *values)
        return ops.convert_to_numpy(tokens)[:, : padded.shape[1] + max_new_tokens]

    def _function(self, search, plan, width, pad_token_id, jit_compile, names, engine):
        """The compiled loop over a buffer of `width` new positions (kept: the last `MAX_COMPILED_LOOPS` used).

        Keyed by the model's variables too: a loop traced before `quantize`
        or `enable_lora` changed them would compute with the old weights.
        """
        key = (search.cache_key(), plan, width, pad_token_id, jit_compile, names, engine, weights_form(self.model))
        if key in self._functions:
            self._functions.move_to_end(key)
        else:

            def generate_fn(token_ids, lengths, max_new_tokens, seed, stop_token_ids, *values):
                tokens = pack_prompts(token_ids, lengths, width, pad_token_id)
                with engine.decoding(decoding_variables(self.model), loop_rows(token_ids, search)):
                    return decode(
                        self.model,
                        tokens,
                        lengths,
                        max_new_tokens,
                        search,
                        seed,
                        stop_token_ids,
                        pad_token_id,
                        plan,
                        dict(zip(names, values)),
                    )

            compiled = compile_function(generate_fn, self.model, jit_compile, engine)
            self._functions[key] = (search, compiled)
            while len(self._functions) > MAX_COMPILED_LOOPS:
                self._functions.popitem(last=False)
        return self._functions[key][1]


def loop_rows(token_ids, search):
    """The rows each decoding step multiplies: prompts times beams, when the prompts' count is static."""
    prompts = static_dim(token_ids.shape[0])
    return None if prompts is None else prompts * search.beam_size


def weights_form(model):
    """The identity of the model's variables: changes when quantizing or LoRA replaces or adds some.

    (A cached loop holds its variables, so their ids are not reused while it is kept.)
    """
    return tuple(id(variable) for variable in getattr(model, "variables", ()))


def check_token_id(name, value, vocabulary_size):
    """`value` as a Python int; a `ValueError` naming `name` unless it is an integer id in `[0, vocabulary_size)`."""
    if not is_integer(value) or not 0 <= value < vocabulary_size:
        shown = value.item() if isinstance(value, np.generic) else value
        raise ValueError(
            f"`{name}` must hold token ids in [0, {vocabulary_size}) (the model's vocabulary). "
            f"Received: {name}={shown!r}"
        )
    return int(value)


def generate_graph(
    model,
    token_ids,
    lengths,
    max_new_tokens,
    search,
    seed,
    stop_token_ids=None,
    pad_token_id=0,
    window=None,
    engine="auto",
):
    """The whole generation as ops on tensors of any (dynamic) shape, unchecked.

    What an exported serving signature embeds: enforce `prompt_checks`
    before it (as assertions), then call this inside the traced function.
    Past the model's context the window slides (`window` defaults to its
    `max_length`). `engine` as for `Generator.generate`, chosen when traced.
    """
    check_protocol(model)
    engine = resolve_engine(engine)
    window = resolve_window(model, window)
    tokens = pack_prompts(token_ids, lengths, max_new_tokens, pad_token_id)
    plan = plan_decoding(model, None, None, window)
    if stop_token_ids is None:
        stop_token_ids = ops.zeros((0,), "int32")
    with engine.decoding(decoding_variables(model), loop_rows(token_ids, search)):
        return decode(model, tokens, lengths, max_new_tokens, search, seed, stop_token_ids, pad_token_id, plan)


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


class GenerationMixin(DecodingModel):
    """A `DecodingModel` with a `generate` method.

    `model.generate(...)` is `Generator.for_model(model).generate(...)`: see
    `Generator.generate` for the arguments.

    Args:
        None: mixed into models whose constructors take their own arguments.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)  # a GenerationMixin
        >>> model.generate([[5, 7], [9]], max_new_tokens=4).shape  # ragged prompts are right-padded
        (2, 6)
    """

    def generate(self, token_ids, max_new_tokens, **options):
        """Generates up to `max_new_tokens` tokens after each prompt (see `Generator.generate`)."""
        return Generator.for_model(self).generate(token_ids, max_new_tokens, **options)
