"""The decoding of the exported `generate`, `prefill` and `decode_chunk`: compiled as the library compiles it.

The library's loop is fast because XLA compiles it for the request's shapes, and the CPU engine picks the
product forms of one row, or a few, when their number is static. A served request's shapes are known at run
time only, so the export traces the loop once per batch size of `batch_sizes` (a request of `B` rows runs at
the smallest size `>= B`, its last row repeated to fill it; past the largest, at a number of rows known at
run time only). The prefill, whose length depends on the prompts' lengths, runs outside XLA; the loop after
it, in XLA, takes only the state's shapes: the rows and the buffer's width, the prompts' width and the
largest `max_new_tokens` rounded up to a power of two (at most the model's context). XLA compiles each
(batch size, buffer bucket) once, on its first request (the warmup requests cover the common ones). A
`generate` request past the model's context slides its window, in a loop TensorFlow's executor runs.

With a drafter (prompt lookup or a draft model, chosen at export time), the loop within the context verifies
its drafts as the library's does, giving the same outputs in fewer passes; its buffer holds the drafted
positions too, so a request fits when its prompt, largest `max_new_tokens` and drafts fit the context (of
both models); past that, `generate` slides the window of plain decoding, whose outputs are the same.
"""

import keras
import tensorflow as tf

from keras_tfam.generation import RepetitionPenalty, Sampling, ServingLoop, TensorSampler

# The batch sizes the exported loop is traced for by default (TF Serving's `allowed_batch_sizes` should
# list the same ones, so that every merged batch runs a loop traced for its size).
DEFAULT_BATCH_SIZES = (1, 2, 4, 8)
# The narrowest buffer (prompts and new tokens) a served loop is compiled for.
MIN_BUFFER = 16
# The per-row settings a resumable state carries besides the loop's own, for the sampler and processors.
CARRIED_SETTINGS = ("temperature", "top_k", "top_p", "repetition_penalty")


def buffer_bucket(width):
    """The buffer width a served loop is compiled for: `width` (a scalar int32 tensor) rounded up to a power of
    two, at least `MIN_BUFFER` (beyond `2 ** 30`, `width` itself)."""
    width = tf.maximum(tf.convert_to_tensor(width, tf.int32), MIN_BUFFER)
    bits = tf.reduce_sum(tf.cast(width - 1 >= tf.bitwise.left_shift(1, tf.range(30)), tf.int32))
    return tf.where(width > 2**30, width, tf.bitwise.left_shift(1, bits))


def check_batch_sizes(batch_sizes):
    """`batch_sizes` as a sorted tuple of distinct positive ints, refused in one line otherwise."""
    sizes = tuple(batch_sizes)
    if not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in sizes):
        raise ValueError(f"`batch_sizes` must be positive integers. Received: batch_sizes={batch_sizes!r}")
    return tuple(sorted(set(sizes)))


def _state_name(path):
    """A state tensor's name in the signatures: `state_` and its path (`state_cache_0_1`)."""
    return "_".join(["state", *map(str, path)])


class ServedDecoding:
    """The exported decoding after its checks: `prefill` and `decode_chunk`, the resumable parts of the loop
    (which the export's `generate` and `generate_text` call), and `generate`, the whole loop past the model's
    context.

    Args:
        model: implements the generation protocol.
        batch_sizes: the static batch sizes to trace the loop for (empty: one loop for any batch).
        jit_compile: compile the loop with XLA (the served model then needs a server that runs XLA on CPU,
            as TF Serving does with `--xla_cpu_compilation_enabled=true`); if false, one loop for any batch,
            run by TensorFlow's executor.
        drafter: a `PromptLookup` or `DraftModel` whose drafts the loop within the context verifies, or `None`.
    """

    def __init__(self, model, batch_sizes=DEFAULT_BATCH_SIZES, jit_compile=True, drafter=None):
        self.model = model
        self.jit_compile = bool(jit_compile)
        self.batch_sizes = check_batch_sizes(batch_sizes) if self.jit_compile else ()
        self.drafter = drafter
        self.drafted = 0 if drafter is None else drafter.num_tokens
        contexts = [model.max_length, getattr(getattr(drafter, "model", None), "max_length", None)]
        contexts = [context for context in contexts if context is not None]
        self.context = min(contexts) if contexts else None  # what the loop within the context runs in
        self.state_structure = None  # the state's structure, known once `prefill` is traced

    def _loop(self, settings, fits_context):
        sampler = TensorSampler(settings["temperature"], settings["top_k"], settings["top_p"])
        processors = (RepetitionPenalty(settings["repetition_penalty"]),)
        drafter = self.drafter if fits_context else None
        return ServingLoop(
            self.model, Sampling(sampler), processors, logprobs=True, fits_context=fits_context, drafter=drafter
        )

    def _total(self, token_ids, max_new_tokens):
        """`(fits, width)`: whether the prompts, the largest `max_new_tokens` and the drafts fit the context, and
        the buffer's room for new tokens (the total rounded up to a bucket, at most the context, less the
        drafts)."""
        prompt_width = tf.shape(token_ids)[1]
        needed = prompt_width + tf.reduce_max(max_new_tokens) + self.drafted
        total = buffer_bucket(needed)
        if self.context is None:
            return tf.constant(True), total - prompt_width - self.drafted
        return needed <= self.context, tf.minimum(total, self.context) - prompt_width - self.drafted

    def _by_size(self, rows, batched, function, *unbatched):
        """`function(*batched, *unbatched)` at the smallest batch size `>= rows`: each of `batched` (structures
        of `(B, ...)` tensors) with its last row repeated to fill it, the outputs cut back to `rows`."""

        def at(size):
            def branch():
                index = tf.minimum(tf.range(size), rows - 1)
                padded = tf.nest.map_structure(lambda x: tf.gather(x, index), batched)
                return tf.nest.map_structure(lambda x: x[:rows], function(*padded, *unbatched))

            return branch

        choice = tf.reduce_sum(tf.cast(rows > tf.constant(self.batch_sizes, tf.int32), tf.int32))
        branches = [at(size) for size in self.batch_sizes] + [lambda: function(*batched, *unbatched)]
        return tf.switch_case(choice, branches)

    def context_checks(self, token_ids, max_new_tokens):
        """`(ok, message, values)`: the prompts and the largest `max_new_tokens` fit the model's context (what
        `prefill` serves)."""
        fits, _ = self._total(token_ids, max_new_tokens)
        drafts = f" plus the {self.drafted} drafted tokens" if self.drafted else ""
        yield (
            fits,
            f"`prefill` serves a prompt width plus the largest `max_new_tokens`{drafts} within the context "
            f"({self.context} tokens); `generate` slides its window past it. Received: {{}} + {{}}",
            [tf.shape(token_ids)[1], tf.reduce_max(max_new_tokens)],
        )

    def fits(self, token_ids, max_new_tokens):
        """Scalar bool: whether the prompts and the largest `max_new_tokens` fit the model's context (what
        `prefill` serves)."""
        return self._total(token_ids, max_new_tokens)[0]

    def generate(self, token_ids, lengths, settings):
        """The dict of `generate_graph` in one loop that slides its window past the model's context, run by
        TensorFlow's executor (`token_ids` as wide as the prompts and the largest `max_new_tokens`)."""
        new_tokens = tf.reduce_max(settings["max_new_tokens"])
        loop = self._loop(settings, fits_context=False)
        state = loop.start(
            token_ids, lengths, settings["max_new_tokens"], settings["seed"], settings["stop_token_ids"], new_tokens
        )
        outputs = loop.finish(loop.run(state, compiled=False))
        outputs["token_ids"] = outputs["token_ids"][:, : tf.shape(token_ids)[1] + new_tokens]
        return outputs

    def prefill(self, token_ids, lengths, settings):
        """The state after the prompts' pass, as named `(B, ...)` tensors (`decode_chunk` takes them back)."""
        _, width = self._total(token_ids, settings["max_new_tokens"])
        loop = self._loop(settings, fits_context=True)
        state = loop.start(
            token_ids, lengths, settings["max_new_tokens"], settings["seed"], settings["stop_token_ids"], width
        )
        state = {name: value for name, value in state.items() if name != "cache_inputs"}
        rows = tf.shape(token_ids)[0]
        state["index"] = tf.fill([rows], state["index"])
        state["sent"] = tf.zeros([rows], tf.int32)
        state.update((name, settings[name]) for name in CARRIED_SETTINGS)
        self.state_structure = tf.nest.map_structure(lambda _: 0, state)
        return {_state_name(path): value for path, value in keras.tree.flatten_with_path(state)}

    def state_names(self):
        """The names of the state's tensors, in the order of `keras.tree.flatten`."""
        return [_state_name(path) for path, _ in keras.tree.flatten_with_path(self.state_structure)]

    def state_signature(self, prefill_function):
        """The `TensorSpec`s of the state, named as `prefill` (a traced concrete function) returns it."""
        outputs = prefill_function.structured_outputs
        return [
            tf.TensorSpec([None, *outputs[name].shape[1:]], outputs[name].dtype, name=name)
            for name in self.state_names()
        ]

    def decode_chunk(self, state, num_tokens):
        """`{"token_ids", "logprobs" (B, num_tokens), "finished" (B,), **next state}` from a `prefill` state:
        each row's next `num_tokens` new tokens (padding past its end)."""
        names = self.state_names()
        rows = tf.shape(state["state_index"])[0]
        count = num_tokens[0]
        loop_state = keras.tree.pack_sequence_as(self.state_structure, [state[name] for name in names])
        advanced = self._by_size(rows, (loop_state,), self._advance, count)
        sent, lengths = advanced["sent"], advanced["prompt_lengths"]
        positions = lengths[:, None] + sent[:, None] + tf.range(count)[None, :]
        generated = positions < (lengths + advanced["num_generated"])[:, None]
        positions = tf.minimum(positions, tf.shape(advanced["token_ids"])[1] - 1)
        chunk = tf.where(generated, tf.gather(advanced["token_ids"], positions, batch_dims=1), 0)
        logprobs = tf.where(generated, tf.gather(advanced["logprobs"], positions, batch_dims=1), 0.0)
        advanced["sent"] = sent + count
        # A row is finished once it generates nothing more and every token it generated was sent (a row can
        # run ahead of the chunks: a shorter prompt, or drafts kept past the chunk's end).
        ended = tf.logical_or(advanced["done"], advanced["index"] >= advanced["limits"])
        finished = tf.logical_and(ended, advanced["sent"] >= advanced["num_generated"])
        flat = dict(zip(names, keras.tree.flatten(advanced)))
        return {"token_ids": chunk, "logprobs": logprobs, "finished": finished, **flat}

    def _advance(self, state, count):
        loop = self._loop({name: state[name] for name in CARRIED_SETTINGS}, fits_context=True)
        until = tf.reduce_max(state["prompt_lengths"]) + state["sent"][0] + count

        def run(state):
            carried = {name: state[name] for name in (*CARRIED_SETTINGS, "sent")}
            loop_state = {name: value for name, value in state.items() if name not in carried}
            advanced = loop.run(dict(loop_state, index=state["index"][0], cache_inputs={}), until, self.jit_compile)
            advanced = {name: value for name, value in advanced.items() if name != "cache_inputs"}
            advanced["index"] = tf.fill(tf.shape(state["index"]), advanced["index"])
            return dict(advanced, **carried)

        return (tf.function(run, jit_compile=True, autograph=False) if self.jit_compile else run)(dict(state))
