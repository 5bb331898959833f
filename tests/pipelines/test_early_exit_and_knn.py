"""EarlyExitLM in a SavedModel, and kNN-LM in `tfam eval` (`--knn-split`)."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from pipeline_runs import run_tfam

from keras_tfam.models import GPT2LM, EarlyExitLM
from pipelines.data.wikitext import count_words, split_lines
from pipelines.export import export_model


def test_exported_generate_exits_early_as_the_model_does(tmp_path):
    keras.utils.set_random_seed(1)
    gpt2 = GPT2LM(vocabulary_size=29, num_layers=3, num_heads=2, hidden_dim=16, max_sequence_length=32)
    model = EarlyExitLM(gpt2, threshold=0.0)  # every generated token leaves after the first block
    prompts = np.array([[5, 17, 3, 2], [9, 4, 0, 0]], np.int32)
    expected = model.generate([[5, 17, 3, 2], [9, 4]], 10)
    assert not np.array_equal(expected, gpt2.generate([[5, 17, 3, 2], [9, 4]], 10))  # the exits matter
    signature = tf.saved_model.load(export_model(model, str(tmp_path / "export"))).signatures["generate"]
    out = signature(
        token_ids=tf.constant(prompts), lengths=tf.constant([4, 2]), max_new_tokens=tf.constant(10),
        temperature=tf.constant(0.0), top_k=tf.constant(0), top_p=tf.constant(1.0), seed=tf.constant(0),
    )["token_ids"].numpy()
    np.testing.assert_array_equal(out, expected)


def _eval(run, data_dir, *options):
    result = run_tfam(["eval", run, "--data-dir", data_dir, "--split", "test", "--sequence-length", "32", *options])
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_eval_with_a_datastore_of_the_training_split(trained_run, small_wikitext):
    plain = _eval(trained_run, small_wikitext)
    # lambda = 0 is the LM exactly; the datastore holds every token of the training split (valid).
    same = _eval(trained_run, small_wikitext, "--knn-split", "valid", "--knn-interpolation", "0", "--knn-k", "8")
    assert np.isclose(same["nll"], plain["nll"], rtol=1e-6) and same["tokens"] == plain["tokens"]
    assert same["knn_entries"] == count_words(split_lines(small_wikitext, "valid"))  # word level: a token a word
    # A datastore of the evaluated text itself: retrieval predicts it far better (memorisation).
    memorised = _eval(trained_run, small_wikitext, "--knn-split", "test", "--knn-k", "8")
    assert memorised["word_perplexity"] < 0.5 * plain["word_perplexity"]
    assert memorised["knn_interpolation"] == 0.25 and memorised["knn_k"] == 8


@pytest.mark.parametrize(
    "options, message",
    [
        (["--knn-k", "100000"], "k=100000"),
        (["--knn-interpolation", "1.5"], "Received: knn_interpolation=1.5"),
    ],
)
def test_eval_knn_bad_input_is_one_clear_line(trained_run, small_wikitext, options, message):
    args = ["eval", trained_run, "--data-dir", small_wikitext, "--sequence-length", "32", "--knn-split", "valid"]
    result = run_tfam(args + options, check=False)
    assert result.returncode != 0 and message in result.stderr
