"""Generated bad input, thrown at the command line, the config, the retrieval API and model constructors.

Every value is either accepted or refused with one line of the documented
form: a `ValueError` (or, for the command line, a usage error: exit code 2)
whose message is a single line that names the argument and ends with what
was received. Never a traceback of another kind, never a second line.

Wrong types, NumPy scalars, negative, zero, huge, NaN and infinite values;
bounded to 30 examples per property, in-process (no subprocess per example).
"""

import contextlib
import io
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from keras_tfam.models.presets import PRESETS
from keras_tfam.retrieval import Datastore
from pipelines.cli import build_parser
from pipelines.commands import check_eval_args
from pipelines.config import FIELDS, MODEL_OPTIONS, load_config

# No example database: nothing written into the checkout.
PROPERTY = settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

HUGE = 2**63 + 1
# What a user (or a program) might pass where a number is expected.
numbers = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.sampled_from([HUGE, -HUGE, 10**30, 2**31]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 2.5, -1.5, 1e300, float("nan"), float("inf"), -float("inf")]),
)
numpy_scalars = st.one_of(
    st.integers(-3, 64).flatmap(lambda n: st.sampled_from([np.int64(n), np.int32(n), np.int8(min(n, 127))])),
    st.sampled_from(
        [
            np.uint8(4),
            np.float32(3.0),
            np.float64(2.5),
            np.float32("nan"),
            np.float64("inf"),
            np.bool_(True),
            np.array(4),
            np.array([4]),
        ]
    ),
)
wrong_types = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=6),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
    st.just(object()),
)
values = st.one_of(numbers, numpy_scalars, wrong_types)


def assert_one_line_refusal(error, name):
    """The documented form: one line, naming the argument, ending with what was received."""
    message = str(error)
    assert "\n" not in message and message.strip() == message, message
    assert name in message and "Received" in message, message


def refused_or_accepted(call, name, refusals=(ValueError,)):
    """Calls `call()`; a refusal must be of the documented form. Returns whether it was accepted."""
    try:
        call()
    except refusals as error:
        assert_one_line_refusal(error, name)
        return False
    return True


def parse(argv):
    """`(args, None)`, or `(None, stderr lines)` of a usage error (which must exit with 2)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            return build_parser().parse_args(argv), None
        except SystemExit as exit_:
            assert exit_.code == 2
    return None, stderr.getvalue().splitlines()


def as_flag_text(value):
    """How a value reaches a flag: its text."""
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


PATHS = {"data_dir", "out", "train_split", "eval_split", "export_dir"}  # checked against the file system
TRAIN_FLAGS = sorted((set(FIELDS) | set(MODEL_OPTIONS)) - PATHS)
XL_ONLY = set(PRESETS["transformer_xl_tiny"][0].OPTIONS) - set(PRESETS["gpt2_tiny"][0].OPTIONS)


@PROPERTY
@given(name=st.sampled_from(TRAIN_FLAGS), value=values)
@example(name="use_bias", value="yes")
@example(name="use_bias", value="maybe")
@example(name="tie_embeddings", value=-1e16)  # a value argparse reads as an option (`-1e+16`)
@example(name="memory_length", value=0)
@example(name="norm_epsilon", value=-1e-5)
@example(name="local_layers", value="even")
def test_train_flags(name, value):
    argv = ["train", "--" + name.replace("_", "-"), as_flag_text(value)]
    args, usage_error = parse(argv)
    if args is None:
        [line] = usage_error  # one line, then exit code 2
        assert line.startswith("tfam: error: argument --" + name.replace("_", "-")), line
        return
    overrides = {
        key: getattr(args, key) for key in list(FIELDS) + list(MODEL_OPTIONS) if getattr(args, key, None) is not None
    }
    if name in XL_ONLY:
        overrides["model"] = "transformer_xl_tiny"  # options of Transformer-XL only
    refused_or_accepted(lambda: load_config("gpt2_tiny", overrides), name, (ValueError, FileNotFoundError))


@PROPERTY
@given(name=st.sampled_from(sorted(set(FIELDS) - PATHS)), value=values)
@example(name="batch_size", value=np.int64(4))
@example(name="learning_rate", value=np.float32("nan"))
def test_config_values(name, value):
    # A config file or a program can give any type, not only text.
    accepted = refused_or_accepted(lambda: load_config("gpt2_tiny", {name: value}), name)
    if accepted and isinstance(value, (np.integer, np.floating)):
        config = load_config("gpt2_tiny", {name: value})
        assert type(getattr(config, name)) in (int, float)  # stored as Python numbers: config.json can hold them


EVAL_FLAGS = ["sequence_length", "batch_size", "knn_k", "knn_interpolation", "knn_temperature"]


@PROPERTY
@given(name=st.sampled_from(EVAL_FLAGS), value=values)
@example(name="knn_interpolation", value=1.0)
@example(name="knn_temperature", value=float("inf"))
def test_eval_flags(name, value):
    argv = ["eval", "RUN", "--knn-split", "valid", "--" + name.replace("_", "-"), as_flag_text(value)]
    args, usage_error = parse(argv)
    if args is None:
        [line] = usage_error
        assert line.startswith("tfam: error: argument --" + name.replace("_", "-")), line
        return
    refused_or_accepted(lambda: check_eval_args(args), name)


DATASTORE_ARGUMENTS = ["size", "key_dim", "vocabulary_size", "k", "temperature", "chunk_size"]


@PROPERTY
@given(name=st.sampled_from(DATASTORE_ARGUMENTS), value=values)
@example(name="temperature", value="hot")
@example(name="size", value=np.int64(6))
def test_datastore_arguments(name, value):
    arguments = {"size": 6, "key_dim": 3, "vocabulary_size": 5, "k": 2, "temperature": 1.0, "chunk_size": 4}
    arguments[name] = value
    if refused_or_accepted(lambda: Datastore(**arguments), name):
        assert type(getattr(Datastore(**arguments), name)) in (int, float)


@PROPERTY
@given(
    row=st.integers(0, 5),
    key=st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=32), st.sampled_from([np.nan, np.inf, 1e38])),
    value=st.one_of(st.integers(-(2**40), 2**40), st.sampled_from([np.int64(-1), np.int64(5), 2.5, np.nan])),
)
@example(row=4, key=np.nan, value=0)
@example(row=2, key=3e19, value=1)
@example(row=1, key=0.5, value=-1)
def test_datastore_entries(row, key, value):
    keys = np.random.default_rng(0).normal(size=(6, 3)).astype("float32")
    keys[row, 1] = key
    tokens = [0, 1, 2, 3, 4, 0]
    tokens[row] = value
    tokens = np.array(tokens)  # float64 when `value` is a float
    usable_key = np.isfinite(keys[row]).all() and float(np.sum(keys[row].astype(np.float64) ** 2)) <= 3.4028234e38
    token_id = isinstance(value, (int, np.integer)) and 0 <= value < 5
    datastore = Datastore(6, 3, 5, k=2)
    accepted = refused_or_accepted(lambda: datastore.set_entries(keys, tokens), "keys" if not usable_key else "values")
    assert accepted == (usable_key and token_id)
    if accepted:  # a datastore of usable keys gives probabilities, never NaN
        p_knn = np.asarray(datastore(np.ones((1, 2, 3), "float32")))
        assert np.isfinite(p_knn).all()
        np.testing.assert_allclose(p_knn.sum(-1), 1.0, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------
# Model constructors: the gaps the property found are pinned by an @example.

GPT2 = {"vocabulary_size": 11, "num_layers": 1, "num_heads": 2, "hidden_dim": 8, "max_sequence_length": 8}
GPT2_SIZES = [
    "vocabulary_size",
    "num_layers",
    "num_heads",
    "hidden_dim",
    "max_sequence_length",
    "intermediate_dim",
    "context_length",
    "num_key_value_heads",
    "local_window",
]
small_sizes = st.one_of(st.integers(1, 8), st.integers(1, 8).map(np.int64))


def build_gpt2(**arguments):
    from keras_tfam.models import GPT2LM

    return GPT2LM(**{**GPT2, **arguments})


@PROPERTY
@given(name=st.sampled_from(GPT2_SIZES), value=st.one_of(small_sizes, numbers, wrong_types))
@example(name="hidden_dim", value=np.int64(8))
@example(name="intermediate_dim", value=0)
def test_gpt2_sizes(name, value):
    if name not in ("num_heads", "num_key_value_heads") and isinstance(value, (int, np.integer)) and value > 64:
        value = 64  # accepted sizes build weights: keep them small (huge ones must still be refused elsewhere)
    accepted = refused_or_accepted(lambda: build_gpt2(**{name: value}), name)
    if accepted and name == "intermediate_dim":
        assert value is None or value >= 1  # None: the documented default, 4 * hidden_dim


@PROPERTY
@given(name=st.sampled_from(["dropout", "norm_epsilon"]), value=st.one_of(numbers, numpy_scalars, wrong_types))
@example(name="dropout", value="high")
@example(name="norm_epsilon", value=float("nan"))
def test_gpt2_rates(name, value):
    accepted = refused_or_accepted(lambda: build_gpt2(**{name: value}), name)
    if accepted and name == "norm_epsilon":
        assert value > 0


@pytest.fixture(scope="module")
def knn_parts():
    from keras_tfam.models import GPT2LM

    lm = GPT2LM(**{**GPT2, "vocabulary_size": 5})
    datastore = Datastore(6, 8, 5, k=2)
    datastore.set_entries(np.random.default_rng(0).normal(size=(6, 8)), [0, 1, 2, 3, 4, 0])
    return lm, datastore


@settings(PROPERTY, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.one_of(numbers, numpy_scalars, wrong_types, st.floats(0, 1)))
@example(value="a quarter")
@example(value=1.0)  # p_kNN alone: -inf (probability 0) for the tokens no neighbour holds, never NaN
def test_knn_interpolation(knn_parts, value):
    from keras_tfam.models import KNNLM

    lm, datastore = knn_parts
    holder = []
    if refused_or_accepted(lambda: holder.append(KNNLM(lm, datastore, interpolation=value)), "interpolation"):
        log_probabilities = np.asarray(holder[0](np.array([[1, 2, 3]], "int32")))
        assert not np.isnan(log_probabilities).any()
