"""An export whose `generate` drafts (prompt lookup, a draft model) serves what a plain export serves.

Drafted decoding gives plain decoding's outputs (greedy and seeded sampling alike), so every output of a
drafted export's `generate`, `prefill` and `decode_chunk` equals the plain export's, row by row, for requests
of mixed settings, within the model's context and past it (where `generate` slides plain decoding's window).
That the served loop really drafts shows in its state: with a draft that is always right, one `decode_chunk`
of one token moves the position past all the drafts it verified.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_tfam.models import GPT2LM
from pipelines.export import export_model
from pipelines.serving_requests import decode_chunk_request, generate_request

CONTEXT, DRAFTED = 32, 3
REQUESTS = [
    generate_request([[5, 17, 3], [9, 4]], max_new_tokens=[9, 12], seed=[0, 11], temperature=[0.0, 0.9], top_k=[0, 8]),
    generate_request([[1, 2, 3, 4, 1, 2, 3]], max_new_tokens=14, repetition_penalty=1.3, stop_token_ids=[[20, 21]]),
    generate_request([[8], [30, 2, 2, 30, 2]], max_new_tokens=[6, 11], top_p=[1.0, 0.8], temperature=[0.0, 1.1]),
    # The short prompt's row runs ahead of the chunks and ends first: its tokens still come out.
    generate_request([[4, 9, 1, 4, 9, 1, 4, 9], [5]], max_new_tokens=[2, 6]),
    # Past what a drafted loop serves within the context: the prompt, max_new_tokens and the drafts.
    generate_request([list(range(1, 20)), [3, 1]], max_new_tokens=[12, 5], temperature=[0.0, 0.7]),
]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    keras.utils.set_random_seed(2)
    model = GPT2LM(vocabulary_size=37, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=CONTEXT)
    folder = tmp_path_factory.mktemp("exports")
    # The model drafts for itself (every draft is kept) in an XLA-compiled loop; prompt lookup (drafts kept and
    # rejected, rows that keep different numbers) and the plain loop run in TensorFlow's executor.
    options, plain_loop = (
        dict(max_new_tokens_limit=16, batch_sizes=(2,)),
        dict(max_new_tokens_limit=16, jit_compile=False),
    )
    paths = {
        "plain": export_model(model, str(folder / "plain"), **plain_loop),
        "perfect": export_model(model, str(folder / "perfect"), draft_model=model, num_draft_tokens=DRAFTED, **options),
        "lookup": export_model(model, str(folder / "lookup"), prompt_lookup_num_tokens=DRAFTED, **plain_loop),
    }
    return model, {name: tf.saved_model.load(path).signatures for name, path in paths.items()}


def call(signature, request):
    specs = signature.structured_input_signature[1]
    return {
        name: value.numpy()
        for name, value in signature(**{k: tf.constant(v, specs[k].dtype) for k, v in request.items()}).items()
    }


def streamed(signatures, request, chunk):
    """`(new tokens, positions)`: `prefill`, then `decode_chunk` until every row is finished, and the state's
    position after each chunk."""
    state, chunks, positions = call(signatures["prefill"], request), [], []
    while True:
        out = call(signatures["decode_chunk"], decode_chunk_request(state, chunk))
        chunks.append(out["token_ids"])
        positions.append(int(out["state_index"][0]))
        state = {name: value for name, value in out.items() if name.startswith("state_")}
        if out["finished"].all():
            return np.concatenate(chunks, axis=1), positions


@pytest.mark.parametrize("drafting", ["perfect", "lookup"])
def test_a_drafted_export_generates_what_the_plain_export_generates(exports, drafting):
    _, signatures = exports
    for request in REQUESTS:
        plain, drafted = call(signatures["plain"]["generate"], request), call(signatures[drafting]["generate"], request)
        np.testing.assert_array_equal(drafted["num_generated"], plain["num_generated"])
        np.testing.assert_array_equal(drafted["token_ids"], plain["token_ids"])
        np.testing.assert_allclose(drafted["logprobs"], plain["logprobs"], atol=1e-5)


@pytest.mark.parametrize("drafting", ["plain", "perfect", "lookup"])
def test_a_drafted_export_streams_what_generate_returns(exports, drafting):
    _, signatures = exports
    for request in REQUESTS[:4]:
        generated = call(signatures["plain"]["generate"], request)
        chunks, _ = streamed(signatures[drafting], request, chunk=2)
        for row, (length, count) in enumerate(zip(request["lengths"], generated["num_generated"])):
            assert chunks[row, :count].tolist() == generated["token_ids"][row, length : length + count].tolist()
            assert not chunks[row, count:].any()  # padding past the row's end


def test_the_served_loop_verifies_its_drafts(exports):
    # The model drafts for itself: every draft is kept, each pass moves the position by DRAFTED + 1.
    model, signatures = exports
    request = generate_request([[5, 17, 3], [9, 4, 4]], max_new_tokens=12)
    # A chunk of one token runs a pass only when no token is left over from the last one.
    _, positions = streamed(signatures["perfect"], request, chunk=1)
    assert positions == [3 + (DRAFTED + 1) * (1 + i // (DRAFTED + 1)) for i in range(12)]
    _, plain_positions = streamed(signatures["plain"], request, chunk=1)
    assert plain_positions == [4 + i for i in range(12)]


def test_prefill_refuses_what_the_drafts_do_not_leave_room_for(exports):
    _, signatures = exports
    request = generate_request([list(range(1, 20))], max_new_tokens=12)  # 31 positions, 34 with the drafts
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"plus the {DRAFTED} drafted tokens within the context"):
        call(signatures["perfect"]["prefill"], request)
    assert call(signatures["plain"]["prefill"], request)["state_index"].tolist() == [19]
