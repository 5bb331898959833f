"""The generation as graph functions of tensors of any shape, for exported serving signatures."""

from keras import ops

from keras_tfam.generation.decoding import decode, decoding_variables, plan_decoding
from keras_tfam.generation.generator import loop_rows
from keras_tfam.generation.prompts import pack_prompts
from keras_tfam.generation.protocol import check_protocol
from keras_tfam.generation.requests import resolve_engine, resolve_window


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
):
    """The whole generation as ops on tensors of any (dynamic) shape, unchecked.

    What an exported serving signature embeds: enforce `prompt_checks`
    before it (as assertions), then call this inside the traced function.
    Past the model's context the window slides (`window` defaults to its
    `max_length`). `engine` as for `Generator.generate`, chosen when traced.
    `max_new_tokens`, `seed` and `stop_token_ids` may be per row (`decode`),
    `processors` take per-row settings too. Returns the token ids, or with
    `return_logprobs` the dict of `decode`.
    """
    check_protocol(model)
    engine = resolve_engine(engine)
    window = resolve_window(model, window)
    tokens = pack_prompts(token_ids, lengths, ops.max(max_new_tokens), pad_token_id)
    plan = plan_decoding(model, None, None, window)
    if stop_token_ids is None:
        stop_token_ids = ops.zeros((0,), "int32")
    with engine.decoding(decoding_variables(model), loop_rows(token_ids, search)):
        outputs = decode(
            model,
            tokens,
            lengths,
            max_new_tokens,
            search,
            seed,
            stop_token_ids,
            pad_token_id,
            plan,
            processors=processors,
            logprobs=return_logprobs,
        )
    return outputs if return_logprobs else outputs["token_ids"]
