"""What `generate` keeps and accepts: a bounded number of compiled loops, ids inside the vocabulary, NumPy scalars."""

import keras
import numpy as np
import pytest
from backend import CHEAP_LOOP

from keras_tfam.generation import generator as generator_module
from keras_tfam.generation.generator import Generator
from keras_tfam.generation.requests import length_bucket
from keras_tfam.models import GPT2LM


def tiny():
    keras.utils.set_random_seed(0)
    return GPT2LM(vocabulary_size=17, num_layers=1, num_heads=2, hidden_dim=8, max_sequence_length=256)


def test_length_buckets_are_four_per_octave():
    assert [length_bucket(n) for n in (1, 16, 17, 20, 21, 33, 129, 200)] == [1, 16, 20, 20, 24, 40, 160, 224]
    for n in range(1, 3000):
        assert n <= length_bucket(n) <= max(n, 1.25 * n)


def test_nearby_lengths_share_one_compiled_loop_and_keep_their_tokens():
    model = tiny()
    longest = model.generate([[1, 2, 3]], 24, **CHEAP_LOOP)
    for n in (17, 19, 21, 23):
        out = model.generate([[1, 2, 3]], n, **CHEAP_LOOP)
        assert out.shape == (1, 3 + n)
        np.testing.assert_array_equal(out, longest[:, : 3 + n])  # greedy: a prefix of the longer run
    # 17 and 19 share the bucket 20, 21 and 23 share 24 (with 24 itself): two loops, not five.
    assert len(Generator.for_model(model)._functions) == 2


def test_the_compiled_loops_kept_are_bounded(monkeypatch):
    # Before: one loop per distinct `max_new_tokens`, kept for ever (+677 MB after 40 lengths).
    monkeypatch.setattr(generator_module, "MAX_COMPILED_LOOPS", 2)
    model = tiny()
    for n in (3, 20, 40, 3):
        model.generate([[1, 2]], n, **CHEAP_LOOP)
    assert len(Generator.for_model(model)._functions) == 2


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            {"stop_token_ids": [3, 17]},
            r"`stop_token_ids` must hold token ids in \[0, 17\).*Received: stop_token_ids=17",
        ),
        ({"stop_token_ids": [-1]}, r"Received: stop_token_ids=-1"),
        ({"pad_token_id": 99}, r"`pad_token_id` must hold token ids in \[0, 17\).*Received: pad_token_id=99"),
        ({"pad_token_id": 1.5}, r"Received: pad_token_id=1.5"),
    ],
)
def test_stop_and_pad_ids_outside_the_vocabulary_are_refused(arguments, message):
    with pytest.raises(ValueError, match=message):
        tiny().generate([[1, 2]], 3, **CHEAP_LOOP, **arguments)


def test_jit_compile_is_a_boolean():
    with pytest.raises(ValueError, match=r"`jit_compile` must be True or False. Received: jit_compile='no'"):
        tiny().generate([[1, 2]], 3, jit_compile="no")
    out = tiny().generate([[1, 2]], 3, jit_compile=np.bool_(CHEAP_LOOP["jit_compile"]))
    assert out.shape == (1, 5)


def test_numpy_scalars_are_accepted():
    model = tiny()
    expected = model.generate([[1, 2]], 5, **CHEAP_LOOP, stop_token_ids=[4], pad_token_id=0)
    out = model.generate([[1, 2]], np.int64(5), **CHEAP_LOOP, stop_token_ids=np.array([4]), pad_token_id=np.int32(0))
    np.testing.assert_array_equal(out, expected)
    sampled = model.generate([[1, 2]], np.int32(4), sampler="top_p", seed=np.int64(3), **CHEAP_LOOP)
    assert sampled.shape == (1, 6)


def test_prompts_of_many_lengths_print_no_retracing_advice():
    # TensorFlow's advice on "frequent retracing" counts traces per function code: each length traces its own loop.
    import io
    import logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logging.getLogger("tensorflow").addHandler(handler)
    try:
        model = tiny()
        for length in range(1, 8):
            model.generate(np.ones((1, length), np.int32), 2, **CHEAP_LOOP)
    finally:
        logging.getLogger("tensorflow").removeHandler(handler)
    assert "retracing" not in stream.getvalue()
