"""The generation as graph functions of tensors of any shape, for exported serving signatures."""

from keras import ops

from keras_tfam.generation.decoding import DecodingLoop, plan_decoding
from keras_tfam.generation.generator import loop_rows
from keras_tfam.generation.prompts import pack_prompts
from keras_tfam.generation.protocol import check_protocol
from keras_tfam.generation.requests import resolve_engine, resolve_window
from keras_tfam.generation.speculative import DraftedDecodingLoop, drafting_variables
from keras_tfam.utils import static_dim


class ServingLoop:
    """The decoding loop on tensors of any (dynamic) shape, in the parts an exported signature holds apart.

    `start` packs the prompts and runs the prefill, whose length depends on
    the values of `lengths`, in TensorFlow's executor; `run` advances the
    state it returns (a flat dict of tensors) and `finish` turns it into the
    outputs of `decode`. Every shape in `run` and `finish` derives from the
    state's shapes, so they can be XLA-compiled apart from `start`.
    Unchecked: enforce `prompt_checks` before it (as assertions).

    Args:
        model: implements the generation protocol.
        search: a `Sampling` or `BeamSearch` strategy.
        processors: `LogitsProcessor`s, which may take per-row settings.
        pad_token_id: fills rows that stopped and positions never generated.
        window: the context a step sees; past it the window slides
            (default: the model's `max_length`).
        engine: as for `Generator.generate`, chosen when traced.
        logprobs: also return each chosen token's log-probability.
        fits_context: the buffer is known to fit the window, so no step
            slides it.
        drafter: a `PromptLookup` or `DraftModel` whose drafts each step
            verifies (with `fits_context` only): the same outputs in fewer
            passes; the buffer then holds its `num_tokens` more positions.

    Examples:
        >>> model = GPT2LM(vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=16)
        >>> loop = ServingLoop(model, Sampling(GreedySampler()))
        >>> state = loop.start(np.array([[5, 7, 0]]), np.array([2]), np.array([3]), np.array([0]))
        >>> outputs = loop.finish(loop.run(state))
        >>> keras.ops.convert_to_numpy(outputs["token_ids"])[0, :5].tolist() == model.generate([[5, 7]], 3)[0].tolist()
        True
    """

    def __init__(
        self,
        model,
        search,
        processors=(),
        pad_token_id=0,
        window=None,
        engine="auto",
        logprobs=False,
        fits_context=False,
        drafter=None,
    ):
        check_protocol(model)
        self.engine = resolve_engine(engine)
        window = resolve_window(model, window)
        plan = plan_decoding(model, None, None, None if fits_context else window)
        self.variables = drafting_variables(model, drafter)
        self.drafted = 0 if drafter is None else drafter.num_tokens
        if drafter is None:
            self.loop = DecodingLoop(model, search, pad_token_id, plan, processors, logprobs=logprobs)
            return
        if not fits_context:
            raise ValueError("Drafted decoding runs within the model's context: pass `fits_context=True`.")
        self.loop = DraftedDecodingLoop(model, search, pad_token_id, plan, drafter, processors, logprobs=logprobs)

    def _rows(self, rows):
        """The rows a step multiplies for `rows` prompts (`None`: not static): each verifies `drafted + 1`."""
        return None if rows is None else rows * (self.drafted + 1)

    def start(self, token_ids, lengths, max_new_tokens, seed, stop_token_ids=None, width=None):
        """The state after the prefill. `width`: the buffer's room for new tokens (default the largest
        `max_new_tokens`); `max_new_tokens`, `seed` and `stop_token_ids` may be per row (`decode`)."""
        width = ops.max(max_new_tokens) if width is None else width
        tokens = pack_prompts(token_ids, lengths, width + self.drafted, self.loop.pad_token_id)
        if stop_token_ids is None:
            stop_token_ids = ops.zeros((0,), "int32")
        rows = self._rows(loop_rows(token_ids, self.loop.search))
        with self.engine.decoding(self.variables, rows, compiled=False):
            return self.loop.start(tokens, lengths, max_new_tokens, seed, stop_token_ids)

    def run(self, state, until=None, compiled=True):
        """The state advanced to position `until` (exclusive; a drafted step may pass it), or until every row is
        done; `compiled`: whether XLA compiles this call (false: the executor runs it)."""
        with self.engine.decoding(self.variables, self._rows(static_dim(state["token_ids"].shape[0])), compiled):
            return self.loop.run(state, until)

    def finished(self, state):
        """`(B,)` bool: which rows have nothing more to generate."""
        return ops.logical_or(state["done"], state["index"] >= state["limits"])

    def finish(self, state):
        """The outputs of `decode` from a state (without the positions the drafts took)."""
        outputs = self.loop.finish(state)
        if self.drafted:
            width = ops.shape(outputs["token_ids"])[1] - self.drafted
            outputs = {name: value if name == "num_generated" else value[:, :width] for name, value in outputs.items()}
        return outputs


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
    processors=(),
    return_logprobs=False,
    width=None,
    compile_loop=None,
    fits_context=False,
    drafter=None,
):
    """The whole generation as ops on tensors of any (dynamic) shape, unchecked: a `ServingLoop` run to the end.

    What an exported serving signature embeds: enforce `prompt_checks`
    before it (as assertions), then call this inside the traced function.
    Arguments as for `ServingLoop` and its `start`. `compile_loop`, if
    given, wraps the loop after the prefill, a function of the state to the
    outputs, e.g. in an XLA-compiled function. Returns the token ids, or
    with `return_logprobs` the dict of `decode`.
    """
    loop = ServingLoop(model, search, processors, pad_token_id, window, engine, return_logprobs, fits_context, drafter)
    state = loop.start(token_ids, lengths, max_new_tokens, seed, stop_token_ids, width)
    compiled = compile_loop is not None
    outputs = (compile_loop or (lambda f: f))(lambda state: loop.finish(loop.run(state, compiled=compiled)))(state)
    return outputs if return_logprobs else outputs["token_ids"]
