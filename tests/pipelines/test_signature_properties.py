"""Generated requests thrown at the exported SavedModel's signatures: each is served or refused in one line.

What TF Serving would pass on: any int32 or float32 scalar (negative, zero,
huge, NaN, infinite), prompts with ids outside the vocabulary, lengths that
do not match. A served request returns ids in `[0, V)` of the promised shape;
a refused one fails with an `InvalidArgumentError` whose message names the
argument and what was received. Bounded: one export, 25 requests per property.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from keras_tfam.models import GPT2LM
from pipelines.export import export_model

PROPERTY = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
VOCABULARY = 19
LIMIT = 12  # the export's max_new_tokens limit
INT32 = st.one_of(st.integers(-3, 20), st.integers(-(2**31), 2**31 - 1), st.sampled_from([-(2**31), 2**31 - 1, 0]))
FLOAT32 = st.one_of(
    st.floats(-2.0, 2.0, width=32),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1.0, 1e-30]),
)
REQUEST = {"max_new_tokens": 3, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "repetition_penalty": 1.0}
NAMES = {
    "max_new_tokens": INT32,
    "temperature": FLOAT32,
    "top_k": INT32,
    "top_p": FLOAT32,
    "seed": INT32,
    "repetition_penalty": FLOAT32,
}


@pytest.fixture(scope="module")
def signatures(tmp_path_factory):
    keras.utils.set_random_seed(0)
    model = GPT2LM(vocabulary_size=VOCABULARY, num_layers=1, num_heads=2, hidden_dim=8, max_sequence_length=8)
    path = export_model(
        model, str(tmp_path_factory.mktemp("export") / "model"), max_new_tokens_limit=LIMIT, batch_sizes=(1, 2)
    )
    return tf.saved_model.load(path).signatures


def refused_in_one_line(call, names):
    """Runs a request: `True` if served, `False` if refused with a message naming one of `names`."""
    try:
        call()
    except tf.errors.InvalidArgumentError as error:
        # TensorFlow wraps the assertion's one line: `assertion failed: [<message>]`.
        lines = [line for line in error.message.split("\n") if line.startswith("assertion failed: [")]
        assert len(lines) == 1, error.message
        message = lines[0]
        assert any(name in message for name in names) and "Received" in message, error.message
        return False
    return True


def generate(signatures, token_ids, lengths, stop_token_ids=((-1,),), rows=None, **settings):
    """A request whose settings (`REQUEST`, overridden by `settings`) each hold the same value for every row."""
    request = {**REQUEST, **settings}
    rows = len(token_ids) if rows is None else rows
    floats = ("temperature", "top_p", "repetition_penalty")
    return signatures["generate"](
        token_ids=tf.constant(token_ids, tf.int32),
        lengths=tf.constant(lengths, tf.int32),
        stop_token_ids=tf.constant(
            np.broadcast_to(np.asarray(stop_token_ids), (rows, len(stop_token_ids[0]))), tf.int32
        ),
        **{
            name: tf.fill([rows], tf.constant(v, tf.float32 if name in floats else tf.int32))
            for name, v in request.items()
        },
    )["token_ids"].numpy()


@PROPERTY
@given(data=st.data(), name=st.sampled_from(sorted(NAMES)))
@example(data=None, name="max_new_tokens")
def test_generate_scalars(signatures, data, name):
    value = 2**31 - 1 if data is None else data.draw(NAMES[name])
    prompts, lengths = [[3, 1, 4], [1, 5, 0]], [3, 2]
    result = {}

    def call():
        result["tokens"] = generate(signatures, prompts, lengths, **{name: value})

    if refused_in_one_line(call, [name]):
        tokens, new = result["tokens"], REQUEST["max_new_tokens"] if name != "max_new_tokens" else value
        assert 1 <= new <= LIMIT
        assert tokens.shape == (2, 3 + new) and tokens.min() >= 0 and tokens.max() < VOCABULARY
        assert list(tokens[0, :3]) == [3, 1, 4] and list(tokens[1, :2]) == [1, 5]
    else:
        assert name != "seed" and not (name == "max_new_tokens" and 1 <= value <= LIMIT)
    if name == "repetition_penalty":
        served = np.isfinite(value) and np.float32(value) >= np.finfo(np.float32).tiny  # subnormals are refused
        assert ("tokens" in result) == served


@PROPERTY
@given(stop=st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(-3, VOCABULARY + 2), min_size=1, max_size=3))
@example(stop=[VOCABULARY])
def test_generate_stop_token_ids(signatures, stop):
    result = {}

    def call():
        result["tokens"] = generate(signatures, [[3, 1, 4]], [3], stop_token_ids=(tuple(stop),))

    assert refused_in_one_line(call, ["stop_token_ids"]) == all(i < VOCABULARY for i in stop)


@pytest.mark.parametrize("name", sorted(NAMES) + ["stop_token_ids"])
def test_a_setting_with_another_count_of_rows_is_refused(signatures, name):
    def call():
        request = {**REQUEST, "stop_token_ids": [[-1]] * 2}
        floats = ("temperature", "top_p", "repetition_penalty")
        values = {
            n: tf.fill([2], tf.constant(v, tf.float32 if n in floats else tf.int32))
            for n, v in request.items()
            if n != "stop_token_ids"
        }
        values["stop_token_ids"] = tf.constant(request["stop_token_ids"], tf.int32)
        values[name] = values[name][:1]
        tokens = tf.constant([[3, 1], [4, 1]], tf.int32)
        return signatures["generate"](token_ids=tokens, lengths=tf.constant([2, 2]), **values)

    assert not refused_in_one_line(call, [name])


@PROPERTY
@given(
    prompts=st.lists(
        st.lists(st.integers(-(2**31), 2**31 - 1) | st.integers(-2, VOCABULARY + 2), min_size=3, max_size=3),
        min_size=1,
        max_size=3,
    ),
    lengths=st.lists(st.integers(-2, 5), min_size=0, max_size=4),
)
@example(prompts=[[1, VOCABULARY, 2]], lengths=[3])
@example(prompts=[[1, 2, 3]], lengths=[0])
@example(prompts=[[1, 2, 3], [4, 5, 6]], lengths=[3])
def test_generate_prompts(signatures, prompts, lengths):
    served = refused_in_one_line(lambda: generate(signatures, prompts, lengths), ["`lengths`", "`token_ids`"])
    valid = (
        len(lengths) == len(prompts)
        and all(1 <= n <= 3 for n in lengths)
        and all(0 <= t < VOCABULARY for row, n in zip(prompts, lengths) for t in row[:n])
    )
    assert served == valid


@PROPERTY
@given(prompts=st.lists(st.lists(st.integers(-3, VOCABULARY + 3), min_size=2, max_size=2), min_size=1, max_size=2))
@example(prompts=[[0, -1]])
def test_serving_default(signatures, prompts):
    def call():
        return signatures["serving_default"](token_ids=tf.constant(prompts, tf.int32))["logits"].numpy()

    served = refused_in_one_line(call, ["`token_ids` must be in"])
    assert served == all(0 <= t < VOCABULARY for row in prompts for t in row)
    if served:
        assert np.isfinite(call()).all()


def test_empty_batches_and_long_prompts_are_refused_in_one_line(signatures):
    empty = np.zeros((0, 3), np.int32)
    # The message names the input: `token_ids` must hold at least one prompt.
    assert not refused_in_one_line(lambda: generate(signatures, empty, np.zeros((0,), np.int32)), ["`token_ids`"])
    serving = signatures["serving_default"]
    assert not refused_in_one_line(lambda: serving(token_ids=tf.constant(empty)), ["`token_ids`"])
    assert not refused_in_one_line(lambda: serving(token_ids=tf.zeros((1, 0), tf.int32)), ["`token_ids`"])
    # Past the model's context (8 positions): `serving_default` refuses, `generate` slides its window.
    assert not refused_in_one_line(lambda: serving(token_ids=tf.ones((1, 9), tf.int32)), ["token_ids"])
    assert refused_in_one_line(lambda: generate(signatures, [[1] * 9], [9]), ["token_ids"])


def test_decode_chunk_refuses_merged_states_in_one_line(signatures):
    from pipelines.serving_requests import decode_chunk_request, generate_request

    def prefill(prompts):
        request = generate_request(prompts, 3)
        specs = signatures["prefill"].structured_input_signature[1]
        return signatures["prefill"](**{k: tf.constant(v, specs[k].dtype) for k, v in request.items()})

    # Two clients' states, one at a later position: merged, the rows are not at one position.
    first = signatures["decode_chunk"](**decode_chunk_request(prefill([[3, 1, 4]]), 1))
    second = prefill([[3, 1]])
    merged = {k: tf.concat([first[k], second[k]], 0) for k in second}
    call = signatures["decode_chunk"]
    assert not refused_in_one_line(lambda: call(**decode_chunk_request(merged, 1)), ["one position"])
    state = decode_chunk_request(second, 1)
    assert not refused_in_one_line(lambda: call(**dict(state, num_tokens=tf.constant([0]))), ["num_tokens"])
    empty = {name: value[:0] for name, value in state.items()}
    assert not refused_in_one_line(lambda: call(**empty), ["state_index"])


SHAPED = settings(PROPERTY, max_examples=40)
OTHER_DTYPES = [np.int64, np.float32, np.float64, np.int8, np.bool_, object]


def valid_requests(signatures):
    """`{signature: {input: array}}`: a request each signature serves (`decode_chunk`'s from a `prefill`)."""
    from pipelines.serving_requests import decode_chunk_request, generate_request

    request = {k: np.asarray(v) for k, v in generate_request([[3, 1, 4], [1, 5]], 3).items()}
    specs = signatures["prefill"].structured_input_signature[1]
    state = signatures["prefill"](**{k: tf.constant(v, specs[k].dtype) for k, v in request.items()})
    chunk = {k: np.asarray(v) for k, v in decode_chunk_request({k: v.numpy() for k, v in state.items()}, 2).items()}
    default = {"token_ids": np.array([[3, 1, 4]], np.int32)}
    return {"serving_default": default, "generate": request, "prefill": request, "decode_chunk": chunk}


@pytest.fixture(scope="module")
def requests(signatures):
    return valid_requests(signatures)


@SHAPED
@given(data=st.data(), signature=st.sampled_from(["serving_default", "generate", "prefill", "decode_chunk"]))
@example(data=None, signature="generate")
def test_an_input_of_any_rank_dtype_or_size_is_served_or_refused_naming_it(signatures, requests, data, signature):
    """One input of a served request replaced by a tensor of any rank (0-3), size (0-3 along each axis; a state
    tensor keeps its own shape past its rows) and dtype: served, or refused in one line. A wrong rank or shape
    is refused naming that input (TF Serving passes a request's tensors on unchecked against the signature's
    shapes); another dtype is refused by the signature itself, before any computation, as TF Serving does."""
    request = dict(requests[signature])
    specs = signatures[signature].structured_input_signature[1]
    if data is None:  # a 0-dimensional prompt
        name, value = "token_ids", np.array(3, np.int32)
    else:
        name = data.draw(st.sampled_from(sorted(request)), label="name")
        dtype = data.draw(st.sampled_from([specs[name].dtype.as_numpy_dtype] * 4 + OTHER_DTYPES), label="dtype")
        rank = data.draw(st.integers(0, 3), label="rank")
        shape = data.draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank), label="shape")
        if name.startswith("state_") and rank == request[name].ndim and rank:
            shape = [shape[0], *request[name].shape[1:]]  # another number of rows of the same state
        values = request[name].flat[: int(np.prod(shape))] if request[name].size >= np.prod(shape) else None
        value = np.resize(request[name], shape) if values is None else values.reshape(shape)
        value = value.astype(str).astype(object) if dtype is object else value.astype(dtype)
    request[name] = value
    inputs = {
        k: tf.constant(v) if k != name or v.dtype != object else tf.constant(v.astype(bytes))
        for k, v in request.items()
    }
    expected_dtype = specs[name].dtype
    try:
        outputs = signatures[signature](**inputs)
    except TypeError as error:  # the signature's binding, in Python: names the input and its spec
        assert tf.as_dtype(inputs[name].dtype) != expected_dtype and f"name='{name}'" in str(error), str(error)
        return
    except tf.errors.InvalidArgumentError as error:
        if tf.as_dtype(inputs[name].dtype) != expected_dtype:  # the function's own check, as TF Serving's
            assert "was expected to be a" in error.message and "tensor but is a" in error.message, error.message
            return
        assert not refused_in_one_line(lambda: signatures[signature](**inputs), sorted(request))
        compatible = specs[name].shape.is_compatible_with(value.shape)
        if not compatible:
            assert name in error.message, error.message
        return
    assert tf.as_dtype(inputs[name].dtype) == expected_dtype and specs[name].shape.is_compatible_with(value.shape)
    rows = len(request["token_ids"] if "token_ids" in request else request["state_index"])
    assert all(len(out) == rows for out in outputs.values())
    tokens = outputs.get("token_ids", outputs.get("state_token_ids"))
    if tokens is not None:
        assert tokens.numpy().min() >= 0 and tokens.numpy().max() < VOCABULARY
