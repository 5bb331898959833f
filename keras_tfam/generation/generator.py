"""One generator for every model that implements the generation protocol (`protocol.DecodingModel`).

Models get `generate` from `GenerationMixin`.
"""

import collections
import dataclasses
import functools

import keras
import numpy as np
from keras import ops

from keras_tfam.engine import PLAIN
from keras_tfam.generation.decoding import DecodingLoop
from keras_tfam.generation.prompts import pack_prompts
from keras_tfam.generation.protocol import DecodingModel, check_protocol
from keras_tfam.generation.requests import prepare_request
from keras_tfam.generation.speculative import DraftedDecodingLoop, drafting_variables
from keras_tfam.utils import check_positive_int, static_dim

# Compiled decoding loops a generator keeps (the least recently used goes first).
MAX_COMPILED_LOOPS = 8


def compile_function(fn, model, jit_compile=True, engine=PLAIN, variables=None):
    """`fn` compiled for the running Keras backend, reading the current weights of the model (or of
    `variables`, every variable `fn` reads, when given).

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
        # A partial of its own: TensorFlow counts traces per function code, where each request's shapes trace
        # a new function once, which its "frequent retracing" advice would count as retraces of one.
        return tf.function(functools.partial(fn), jit_compile=jit_compile, autograph=False)
    if backend == "jax":
        variables = list(getattr(model, "variables", []) if variables is None else variables)

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
        repetition_penalty=None,
        no_repeat_ngram_size=None,
        min_new_tokens=None,
        suppress_token_ids=None,
        logit_bias=None,
        presence_penalty=None,
        frequency_penalty=None,
        min_p=None,
        stop_sequences=None,
        logits_processor=None,
        return_logprobs=False,
        prompt_lookup_num_tokens=None,
        max_matching_ngram_size=None,
        draft_model=None,
        num_draft_tokens=None,
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
            repetition_penalty: divides a positive logit (multiplies a
                negative one) of every id in the prompt or generated so far
                (Keskar et al. 2019; transformers' option); 1 is off.
            no_repeat_ngram_size: no n-gram of this size occurs twice in a
                row (prompt included).
            min_new_tokens: the stop ids are banned until a row has this many
                new tokens (stop sequences are not).
            suppress_token_ids: ids never generated.
            logit_bias: `{token id: bias}` added to the logits.
            presence_penalty, frequency_penalty: OpenAI's, over the generated
                tokens: each id's logit less `count * frequency_penalty +
                (count > 0) * presence_penalty`.
            min_p: with a sampler, drops tokens less likely than `min_p` times
                the most likely one (after temperature, top-k and top-p).
            stop_sequences: lists of token ids; a row ends after the token that
                completes the first one among its generated tokens (kept, then
                padding).
            logits_processor: a `LogitsProcessor` or a list, applied after the
                options above: a hook that sees the tokens so far.
            return_logprobs: return a dict (below) instead of the array.
            prompt_lookup_num_tokens: draft this many tokens per step from
                the tokens so far and verify them in one pass
                (`speculative.PromptLookup`; transformers' option): the same
                tokens, greedy or sampled with the same seed, in fewer passes
                where the text repeats itself. One hypothesis per prompt,
                models with positional caches, within the context.
            max_matching_ngram_size: the longest n-gram prompt lookup matches
                (default 2).
            draft_model: a smaller decoding model over the same vocabulary
                whose greedy tokens are drafted and verified `num_draft_tokens`
                at a pass (`speculative.DraftModel`; speculative decoding,
                transformers' `assistant_model`): the same tokens, greedy or
                sampled with the same seed, under the same conditions as prompt
                lookup; the draft's context must hold the whole buffer.
            num_draft_tokens: tokens the draft model drafts per step (default 4).

        The processors run in transformers' order (`processors.py`) on every
        step's logits; under beam search the hypotheses are ranked by the
        log-softmax of the processed logits.

        Returns:
            `(B, T + max_new_tokens)` int32 NumPy array: each prompt, then its
            new tokens, then padding (a shorter prompt's row is padded at the
            end). With `return_logprobs`, a dict of NumPy arrays: `token_ids`
            (that array), `logprobs` `(B, max_new_tokens)` float32, the
            log-probability of each new token under the model's own
            distribution (the log-softmax of its logits before processors and
            temperature), 0 after a row stopped, and `num_generated` `(B,)`
            int32, the new tokens of each row (its stop token counted).
        """
        request = prepare_request(self.model, **{name: value for name, value in locals().items() if name != "self"})
        function = self._function(request)
        outputs = function(*request.arguments())
        width = request.padded.shape[1] + request.max_new_tokens
        tokens = ops.convert_to_numpy(outputs["token_ids"])[:, :width]
        if not return_logprobs:
            return tokens
        positions = request.lengths[:, None] + np.arange(request.max_new_tokens)[None, :]
        return {
            "token_ids": tokens,
            "logprobs": np.take_along_axis(ops.convert_to_numpy(outputs["logprobs"]), positions, axis=1),
            "num_generated": ops.convert_to_numpy(outputs["num_generated"]).astype(np.int32),
        }

    def stream(self, token_ids, max_new_tokens, chunk_size=16, **options):
        """Yields the new tokens as the compiled loop produces them: `(B, n)` int32 NumPy arrays, `n` at most
        `chunk_size`, row `b`'s next new tokens (padding after it stopped).

        The chunks concatenated are the new tokens of `generate` with the same
        arguments (greedy and seeded sampling alike); the stream ends when
        every row has stopped or has `max_new_tokens`. Options as for
        `generate`, but for `beam_size` (the best hypothesis is known at the
        end only) and `return_logprobs`.

        Examples:
            >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
            >>> chunks = list(model.stream([[5, 7]], max_new_tokens=10, chunk_size=4))
            >>> [chunk.shape for chunk in chunks]
            [(1, 4), (1, 4), (1, 2)]
        """
        chunk_size = check_positive_int("chunk_size", chunk_size)
        for name in ("beam_size", "return_logprobs"):
            if options.get(name) not in (None, 1, False):
                raise ValueError(f"`stream` yields tokens as they come: it takes no `{name}`. Received: {options}")
        request = prepare_request(self.model, token_ids, max_new_tokens, **options)
        request = dataclasses.replace(request, plan=dataclasses.replace(request.plan, segment_ends=()))
        start, advance = self._function(request, streaming=True)
        longest = int(request.lengths.max())
        state, sent, finished = None, 0, False
        while sent < request.max_new_tokens and not finished:
            until = np.asarray(longest + min(sent + chunk_size, request.max_new_tokens), np.int32)
            if state is None:
                state = start(*request.arguments(), until)
            else:
                state = advance(state, until)
            tokens = ops.convert_to_numpy(state["token_ids"])
            finished = bool(ops.convert_to_numpy(state["finished"]))
            # A drafted step may pass `until`: once finished, the chunks of the tokens already generated follow.
            ready = int(ops.convert_to_numpy(state["num_generated"]).max()) if finished else 0
            while True:
                count = min(chunk_size, request.max_new_tokens - sent)
                positions = request.lengths[:, None] + sent + np.arange(count)[None, :]
                yield np.take_along_axis(tokens, positions, axis=1)
                sent += count
                if sent >= min(ready, request.max_new_tokens):
                    break

    def _function(self, request, streaming=False):
        """The compiled loop of a request (kept: the last `MAX_COMPILED_LOOPS` used); with `streaming`, the pair
        `(start, advance)` of compiled functions that run it in parts.

        Keyed by the model's variables too: a loop traced before `quantize`
        or `enable_lora` changed them would compute with the old weights.
        """
        model, search, engine, steering = self.model, request.search, request.engine, request.steering
        drafter = request.drafter
        width = request.bucket + (0 if drafter is None else drafter.num_tokens)
        key = (search.cache_key(), request.plan, width, request.pad_token_id, request.jit_compile, request.names)
        key += (engine, weights_form(model), steering.cache_key(), streaming)
        key += (None if drafter is None else drafter.cache_key(),)
        if key in self._functions:
            self._functions.move_to_end(key)
            return self._functions[key][-1]
        options = (steering.processors, steering.stop_sequences, steering.logprobs)
        if drafter is None:
            loop = DecodingLoop(model, search, request.pad_token_id, request.plan, *options)
        else:
            loop = DraftedDecodingLoop(model, search, request.pad_token_id, request.plan, drafter, *options)
        # The rows a step multiplies: every hypothesis, times the positions a drafted step verifies.
        rows = request.padded.shape[0] * search.beam_size * (1 if drafter is None else drafter.num_tokens + 1)

        variables = drafting_variables(model, drafter)

        def decoding():
            return engine.decoding(variables, rows)

        def start(token_ids, lengths, max_new_tokens, seed, stop_token_ids, *values, until=None):
            tokens = pack_prompts(token_ids, lengths, width, request.pad_token_id)
            with decoding():
                state = loop.start(
                    tokens, lengths, max_new_tokens, seed, stop_token_ids, dict(zip(request.names, values))
                )
                state = loop.run(state, until)
            return state if streaming else loop.finish(state)

        def start_streaming(*arguments):
            state = start(*arguments[:-1], until=arguments[-1])
            return dict(state, finished=loop.finished(state))

        def advance(state, until):
            state = {name: value for name, value in state.items() if name != "finished"}
            with decoding():
                state = loop.run(state, until)
            return dict(state, finished=loop.finished(state))

        if streaming:
            compiled = tuple(
                compile_function(f, model, request.jit_compile, engine, variables) for f in (start_streaming, advance)
            )
        else:
            compiled = compile_function(start, model, request.jit_compile, engine, variables)
        self._functions[key] = (search, steering, compiled)
        while len(self._functions) > MAX_COMPILED_LOOPS:
            self._functions.popitem(last=False)
        return compiled


def loop_rows(token_ids, search):
    """The rows each decoding step multiplies: prompts times beams, when the prompts' count is static."""
    prompts = static_dim(token_ids.shape[0])
    return None if prompts is None else prompts * search.beam_size


def weights_form(model):
    """The identity of the model's variables: changes when quantizing or LoRA replaces or adds some.

    (A cached loop holds its variables, so their ids are not reused while it is kept.)
    """
    return tuple(id(variable) for variable in getattr(model, "variables", ()))


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

    def stream(self, token_ids, max_new_tokens, chunk_size=16, **options):
        """Yields the new tokens in chunks as they are generated (see `Generator.stream`)."""
        return Generator.for_model(self).stream(token_ids, max_new_tokens, chunk_size, **options)
