"""The computations of the exported signatures (`pipelines.export` writes them): checks as graph assertions,
then the decoding of `pipelines.served_decoding`."""

import contextlib

import numpy as np
import tensorflow as tf

from keras_tfam.generation import TensorSampler, prompt_checks
from keras_tfam.utils import check_positive_int
from pipelines.served_decoding import DEFAULT_BATCH_SIZES, ServedDecoding
from pipelines.stop_strings import completing_count, contains_stop, cut_before_stop

# How many new tokens `generate_text` decodes between two looks for its stop strings.
STOP_CHECK_TOKENS = 8

# The settings of a `generate` request: one per row, so that TF Serving's batcher can merge requests
# by concatenating every input along its first axis.
ROW_SETTINGS = dict(
    max_new_tokens=tf.TensorSpec([None], tf.int32, name="max_new_tokens"),
    temperature=tf.TensorSpec([None], tf.float32, name="temperature"),
    top_k=tf.TensorSpec([None], tf.int32, name="top_k"),
    top_p=tf.TensorSpec([None], tf.float32, name="top_p"),
    seed=tf.TensorSpec([None], tf.int32, name="seed"),
    stop_token_ids=tf.TensorSpec([None, None], tf.int32, name="stop_token_ids"),
    repetition_penalty=tf.TensorSpec([None], tf.float32, name="repetition_penalty"),
)
GENERATE_SIGNATURE = [
    tf.TensorSpec([None, None], tf.int32, name="token_ids"),
    tf.TensorSpec([None], tf.int32, name="lengths"),
    *ROW_SETTINGS.values(),
]


@contextlib.contextmanager
def asserting(checks):
    """Turns `(ok, message, values)` checks into graph assertions, each under the
    previous ones, and runs the block under all of them.

    A failed check fails the request with its message, values filled in
    (`InvalidArgumentError` in TensorFlow, an error status in TF Serving).
    """
    with contextlib.ExitStack() as stack:
        for ok, message, values in checks:
            values = [tf.cast(v, tf.float32) if v.dtype.is_floating else v for v in map(tf.convert_to_tensor, values)]
            text = tf.strings.format(message, values)
            stack.enter_context(tf.control_dependencies([tf.debugging.Assert(ok, [text], summarize=-1)]))
        yield


def shape_checks(inputs):
    """`(ok, message, values)`: each of `inputs` (`{name: tensor}` of a signature's inputs) has the rank and the
    static dimensions its signature declares, read at run time.

    TF Serving passes a request's tensors on to the graph unchecked against the signature's shapes. The rank is
    read as the place of a negative sentinel after the runtime shape, which no graph rewrite folds into the
    declared rank (as it folds `tf.rank`); every input's first axis (its rows) is dynamic.
    """
    for name, value in inputs.items():
        declared = value.shape.as_list()
        padded = tf.concat([tf.shape(value), tf.fill([len(declared) + 1], -1)], 0)
        ok = tf.equal(tf.argmin(padded, output_type=tf.int32), len(declared))
        fixed = [axis for axis, size in enumerate(declared) if size is not None]
        if fixed:
            sizes = tf.gather(padded, fixed)
            ok = tf.logical_and(ok, tf.reduce_all(tf.equal(sizes, [declared[axis] for axis in fixed])))
        shape = ", ".join(
            "rows" if axis == 0 else "any" if size is None else str(size) for axis, size in enumerate(declared)
        )
        yield ok, f"`{name}` must be a tensor of shape [{shape}]. Received: shape {{}}", [tf.shape(value)]


# `max_new_tokens` a `generate` request may ask for by default: the token buffer and (for a model
# without a fixed context) the caches grow with it, so a request is bounded by what the export allows.
DEFAULT_MAX_NEW_TOKENS = 4096


def resolve_max_new_tokens_limit(model, limit=None):
    """`limit`, checked; by default `DEFAULT_MAX_NEW_TOKENS`, or the model's context if longer."""
    if limit is None:
        return max(DEFAULT_MAX_NEW_TOKENS, getattr(model, "max_length", None) or 0)
    return check_positive_int("max_new_tokens_limit", limit)


def count_checks(rows, settings, prompts="token_ids"):
    """`(ok, message, values)`: `prompts` (the input's name) holds a prompt at least, and every one of `settings`
    (`{name: tensor}`) has one value per prompt."""
    yield rows >= 1, f"`{prompts}` must hold at least one prompt. Received: {{}} prompts.", [rows]
    for name, value in settings.items():
        count = tf.shape(value)[0]
        yield (
            tf.equal(count, rows),
            f"`{name}` must hold one value per prompt ({{}} prompts). Received: {{}} values.",
            [rows, count],
        )


class ServingFunctions:
    """The exported computations, over a model of the generation protocol and a tokenizer."""

    def __init__(
        self,
        model,
        tokenizer=None,
        max_new_tokens_limit=None,
        batch_sizes=DEFAULT_BATCH_SIZES,
        jit_compile=True,
        drafter=None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens_limit = resolve_max_new_tokens_limit(model, max_new_tokens_limit)
        self.decoding = ServedDecoding(model, batch_sizes, jit_compile, drafter)
        # Traced once, here, outside any graph: `generate` and `generate_text` call these traces (a second trace
        # of the loop would multiply the export's time and the SavedModel's graphs).
        self.prefill_trace = tf.function(
            self.prefill, input_signature=GENERATE_SIGNATURE, autograph=False
        ).get_concrete_function()
        state = self.decoding.state_signature(self.prefill_trace)
        self.decode_chunk_trace = tf.function(
            self.decode_chunk,
            input_signature=[*state, tf.TensorSpec([None], tf.int32, name="num_tokens")],
            autograph=False,
        ).get_concrete_function()
        # `generate_text` calls this trace past the context or without stop strings.
        self.generate_trace = tf.function(
            self.generate, input_signature=GENERATE_SIGNATURE, autograph=False
        ).get_concrete_function()

    def _length_checks(self, max_new_tokens):
        """Each row's `max_new_tokens` in `[1, limit]`: checked before anything of that size is allocated."""
        limit = self.max_new_tokens_limit
        worst = tf.gather(max_new_tokens, tf.argmax(tf.abs(max_new_tokens - (1 + limit) // 2)))
        yield (
            tf.reduce_all(tf.logical_and(max_new_tokens >= 1, max_new_tokens <= limit)),
            f"`max_new_tokens` must be in [1, {limit}], the limit of this export (export with a larger "
            "--max-new-tokens-limit for more). Received: max_new_tokens={}",
            [worst],
        )

    def _row_checks(self, rows, settings):
        """Every setting has one value per prompt (`rows`), each stop id is in the vocabulary or negative (none),
        each repetition penalty is a finite number > 0."""
        yield from count_checks(rows, settings)
        vocabulary = self.model.vocabulary_size
        stop = settings["stop_token_ids"]
        yield (
            tf.reduce_all(stop < vocabulary),
            f"`stop_token_ids` must be token ids in [0, {vocabulary}), or negative for none. Received: {{}}",
            [tf.reduce_max(stop)],
        )
        penalty = settings["repetition_penalty"]
        yield (
            # The smallest normal float32, not 0: a subnormal penalty reads as 0 where the CPU flushes subnormals.
            tf.reduce_all(tf.logical_and(tf.math.is_finite(penalty), penalty >= np.finfo(np.float32).tiny)),
            "`repetition_penalty` must be a finite number > 0 (1 switches it off). Received: {}",
            [tf.gather(penalty, tf.argmin(tf.where(tf.math.is_finite(penalty), penalty, -1.0)))],
        )

    def _id_checks(self, token_ids):
        """`serving_default`'s request: a prompt at least, ids in the vocabulary, within the model's context."""
        rows, width = tf.shape(token_ids)[0], tf.shape(token_ids)[1]
        yield from count_checks(rows, {})
        context = self.model.max_length
        if context is not None:
            yield (
                width <= context,
                f"`token_ids` must be at most {context} positions long (the model's context; `generate` slides "
                "its window past it). Received: {} positions.",
                [width],
            )
        yield width >= 1, "`token_ids` must hold at least one position. Received: {} positions.", [width]
        yield from prompt_checks(token_ids, tf.fill([rows], width), 1, self.model.vocabulary_size)

    def serving_default(self, token_ids):
        with asserting(shape_checks({"token_ids": token_ids})), asserting(self._id_checks(token_ids)):
            logits = self.model(token_ids, training=False)
        return {"logits": tf.cast(logits[:, -1], tf.float32)}

    def generate(
        self, token_ids, lengths, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids, repetition_penalty
    ):
        settings = dict(zip(ROW_SETTINGS, (max_new_tokens, temperature, top_k, top_p, seed)))
        settings.update(stop_token_ids=stop_token_ids, repetition_penalty=repetition_penalty)
        with asserting(shape_checks(dict(token_ids=token_ids, lengths=lengths, **settings))):
            return self._checked_generate(token_ids, lengths, settings)

    def _checked_generate(self, token_ids, lengths, settings):
        rows, max_new_tokens = tf.shape(token_ids)[0], settings["max_new_tokens"]
        sampler = TensorSampler(settings["temperature"], settings["top_k"], settings["top_p"])
        checks = prompt_checks(token_ids, lengths, max_new_tokens, self.model.vocabulary_size)
        with asserting(self._row_checks(rows, settings)), asserting(self._length_checks(max_new_tokens)):
            with asserting(checks), asserting(sampler.checks()):
                new_tokens = tf.reduce_max(max_new_tokens)

                def resumed():
                    # Within the model's context: the prefill, then one chunk of every new token.
                    state = self._decode_chunk(self._prefill(token_ids, lengths, settings), new_tokens)
                    width = tf.shape(token_ids)[1] + new_tokens
                    return {
                        "token_ids": state["state_token_ids"][:, :width],
                        "num_generated": state["state_num_generated"],
                        "logprobs": state["state_logprobs"],
                    }

                outputs = tf.cond(
                    self.decoding.fits(token_ids, max_new_tokens),
                    resumed,
                    lambda: self.decoding.generate(token_ids, lengths, settings),
                )
                # Under the checks too: nothing of the requested size is allocated before they pass.
                positions = lengths[:, None] + tf.range(new_tokens)[None, :]
                logprobs = tf.gather(outputs["logprobs"], positions, batch_dims=1)
        return {"token_ids": outputs["token_ids"], "num_generated": outputs["num_generated"], "logprobs": logprobs}

    def _prefill(self, token_ids, lengths, settings):
        """The `prefill` trace's outputs (the state)."""
        return self.prefill_trace(token_ids, lengths, *(settings[name] for name in ROW_SETTINGS))

    def _decode_chunk(self, state, num_tokens):
        """The `decode_chunk` trace's outputs for a state and a scalar `num_tokens`."""
        rows = tf.shape(state["state_index"])[0]
        values = [state[name] for name in self.decoding.state_names()]
        return self.decode_chunk_trace(*values, tf.fill([rows], num_tokens))

    def prefill(
        self, token_ids, lengths, max_new_tokens, temperature, top_k, top_p, seed, stop_token_ids, repetition_penalty
    ):
        settings = dict(zip(ROW_SETTINGS, (max_new_tokens, temperature, top_k, top_p, seed)))
        settings.update(stop_token_ids=stop_token_ids, repetition_penalty=repetition_penalty)
        with asserting(shape_checks(dict(token_ids=token_ids, lengths=lengths, **settings))):
            rows = tf.shape(token_ids)[0]
            checks = prompt_checks(token_ids, lengths, max_new_tokens, self.model.vocabulary_size)
            sampler_checks = TensorSampler(temperature, top_k, top_p).checks()
            with asserting(self._row_checks(rows, settings)), asserting(self._length_checks(max_new_tokens)):
                with asserting(checks), asserting(sampler_checks):
                    with asserting(self.decoding.context_checks(token_ids, max_new_tokens)):
                        return self.decoding.prefill(token_ids, lengths, settings)

    def decode_chunk(self, *values):
        state = dict(zip(self.decoding.state_names(), values[:-1]))
        num_tokens = values[-1]
        with (
            asserting(shape_checks(dict(state, num_tokens=num_tokens))),
            asserting(self._chunk_checks(state, num_tokens)),
        ):
            return self.decoding.decode_chunk(state, num_tokens)

    def _chunk_checks(self, state, num_tokens):
        """A state of at least one row, every tensor with as many, all at one position; `num_tokens` one value per
        row, the same, in `[1, limit]`."""
        rows, limit = tf.shape(state["state_index"])[0], self.max_new_tokens_limit
        yield rows >= 1, "A state must hold at least one row (`state_index`). Received: {} rows.", [rows]
        for name, value in state.items():
            yield (
                tf.equal(tf.shape(value)[0], rows),
                f"`{name}` must hold one value per row of the state ({{}} rows). Received: {{}} rows.",
                [rows, tf.shape(value)[0]],
            )
        yield (
            tf.equal(tf.shape(num_tokens)[0], rows),
            "`num_tokens` must hold one value per row of the state ({} rows). Received: {} values.",
            [rows, tf.shape(num_tokens)[0]],
        )
        yield (
            tf.reduce_all(tf.logical_and(num_tokens >= 1, num_tokens <= limit)),
            f"`num_tokens` must be in [1, {limit}]. Received: {{}}",
            [num_tokens],
        )
        yield (
            tf.reduce_all(tf.equal(num_tokens, num_tokens[0])),
            "`num_tokens` must be the same for every row of a state. Received: {}",
            [num_tokens],
        )
        yield (
            tf.reduce_all(tf.equal(state["state_index"], state["state_index"][0])),
            "The state's rows must be at one position (a `prefill` state, or one `decode_chunk` returned; "
            "do not merge states of several requests). Received: state_index={}",
            [state["state_index"]],
        )

    def generate_text(
        self,
        prompts,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        stop_token_ids,
        repetition_penalty,
        stop_strings,
    ):
        settings = dict(zip(ROW_SETTINGS, (max_new_tokens, temperature, top_k, top_p, seed)))
        settings.update(stop_token_ids=stop_token_ids, repetition_penalty=repetition_penalty)
        with asserting(shape_checks(dict(prompts=prompts, **settings, stop_strings=stop_strings))):
            rows = tf.shape(prompts)[0]
            checks = count_checks(rows, {"stop_strings": stop_strings}, prompts="prompts")
            with asserting(self._length_checks(settings["max_new_tokens"])), asserting(checks):
                return self._generate_text(prompts, dict(settings, stop_strings=stop_strings))

    def _generate_text(self, prompts, settings):
        tokenizer = self.tokenizer
        ids = tokenizer.tokenize_prompt(prompts)
        rows = ids.nrows(out_type=tf.int32)
        start = tf.fill([rows, 1], tf.constant(tokenizer.eos_id, tf.int32))
        ids = tf.concat([tf.RaggedTensor.from_tensor(start), tf.cast(ids, tf.int32)], axis=1)
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        # Each row also stops at the end token, which is never detokenized.
        end = tf.fill([rows, 1], tf.constant(tokenizer.eos_id, tf.int32))
        settings = dict(settings, stop_token_ids=tf.concat([end, settings["stop_token_ids"]], axis=1))

        def text(tokens, lengths, counts):
            """Each row's first `counts` new tokens as text, a final end token left out."""
            positions = tf.minimum(lengths[:, None] + tf.range(tf.reduce_max(counts))[None, :], tf.shape(tokens)[1] - 1)
            new_tokens = tf.gather(tokens, positions, batch_dims=1)
            last = tf.gather(new_tokens, tf.maximum(counts - 1, 0), batch_dims=1)
            kept = counts - tf.cast(tf.logical_and(counts > 0, tf.equal(last, tokenizer.eos_id)), tf.int32)
            return tokenizer.detokenize(tf.RaggedTensor.from_tensor(new_tokens, lengths=kept))

        def should_stop(tokens, lengths, counts, settings):
            return contains_stop(text(tokens, lengths, counts), settings["stop_strings"])

        token_ids = ids.to_tensor()

        def stopping():
            # Chunk by chunk, each row stopping where its text holds one of its stop strings.
            state = self._prefill(token_ids, lengths, settings)
            names = self.decoding.state_names()

            def unfinished(state, finished):
                return tf.reduce_any(tf.logical_not(finished))

            def next_chunk(state, finished):
                out = self._decode_chunk(state, STOP_CHECK_TOKENS)
                stop = should_stop(out["state_token_ids"], lengths, out["state_num_generated"], settings)
                state = {name: out[name] for name in names}
                state["state_done"] = tf.logical_or(state["state_done"], stop)
                return state, tf.logical_or(out["finished"], stop)

            invariants = {name: tf.TensorShape([None] * value.shape.rank) for name, value in state.items()}
            state, _ = tf.while_loop(
                unfinished,
                next_chunk,
                (state, tf.zeros([rows], tf.bool)),
                shape_invariants=(invariants, tf.TensorShape([None])),
            )
            return state["state_token_ids"], state["state_num_generated"]

        def at_once():
            # No stop string, or past the model's context: `generate` (its window slides there).
            generated = self.generate_trace(token_ids, lengths, *(settings[name] for name in ROW_SETTINGS))
            return generated["token_ids"], generated["num_generated"]

        stops = settings["stop_strings"]
        looks = tf.logical_and(
            self.decoding.fits(token_ids, settings["max_new_tokens"]), tf.reduce_any(tf.strings.length(stops) > 0)
        )
        tokens, counts = tf.cond(looks, stopping, at_once)
        counts = completing_count(counts, stops, lambda counts: text(tokens, lengths, counts))
        return {"completions": cut_before_stop(text(tokens, lengths, counts), stops), "num_generated": counts}
