"""EarlyExitLM in a SavedModel, and kNN-LM in `tfam eval` (`--knn-split`)."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from pipeline_runs import run_tfam

from keras_tfam.models import GPT2LM, KNNLM, EarlyExitLM, TransformerXLLM
from keras_tfam.retrieval import Datastore
from pipelines.data.wikitext import count_words, split_lines
from pipelines.export import export_model
from pipelines.serving_requests import generate_request


def test_exported_generate_exits_early_as_the_model_does(tmp_path):
    keras.utils.set_random_seed(1)
    gpt2 = GPT2LM(vocabulary_size=29, num_layers=3, num_heads=2, hidden_dim=16, max_sequence_length=32)
    model = EarlyExitLM(gpt2, threshold=0.0)  # every generated token leaves after the first block
    prompts = np.array([[5, 17, 3, 2], [9, 4, 0, 0]], np.int32)
    expected = model.generate([[5, 17, 3, 2], [9, 4]], 10)
    assert not np.array_equal(expected, gpt2.generate([[5, 17, 3, 2], [9, 4]], 10))  # the exits matter
    signature = tf.saved_model.load(export_model(model, str(tmp_path / "export"), batch_sizes=(1,))).signatures[
        "generate"
    ]
    request = dict(generate_request([[5, 17, 3, 2], [9, 4]], 10), token_ids=prompts)
    out = signature(**{name: tf.constant(value) for name, value in request.items()})["token_ids"].numpy()
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


def _greedy_request(signature, prompts, lengths, max_new_tokens):
    request = generate_request([p[:n] for p, n in zip(prompts, lengths)], max_new_tokens)
    return signature(**{name: tf.constant(value) for name, value in request.items()})["token_ids"].numpy()


def test_models_used_only_through_generate_export(tmp_path):
    # A subclassed model whose own `call` never ran was "not built" for the export.
    keras.utils.set_random_seed(2)
    xl = TransformerXLLM(vocabulary_size=31, num_layers=1, num_heads=2, hidden_dim=16, memory_length=8)
    gpt2 = GPT2LM(vocabulary_size=31, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=16)
    blocks = np.random.default_rng(0).integers(0, 31, size=(3, 16)).astype("int32")
    knn = KNNLM(gpt2, Datastore.from_model(gpt2, blocks[:, :-1], blocks[:, 1:], k=8), interpolation=0.5)
    for name, model in (("xl", xl), ("knn", knn)):
        expected = model.generate([[3, 1, 4]], 6)
        assert not model.built
        signature = tf.saved_model.load(export_model(model, str(tmp_path / name), batch_sizes=(1,))).signatures[
            "generate"
        ]
        np.testing.assert_array_equal(_greedy_request(signature, [[3, 1, 4]], [3], 6), expected)


def test_generate_signature_refuses_max_new_tokens_past_the_export_limit(tmp_path):
    # Asking for 2^31 - 1 tokens tried to allocate 8 GB; the export has a limit, named in the error.
    keras.utils.set_random_seed(3)
    model = GPT2LM(vocabulary_size=29, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=16)
    loaded = tf.saved_model.load(
        export_model(model, str(tmp_path / "export"), max_new_tokens_limit=20, batch_sizes=(1,))
    )
    np.testing.assert_array_equal(
        _greedy_request(loaded.signatures["generate"], [[5, 2]], [2], 20), model.generate([[5, 2]], 20)
    )
    for asked in (21, 2**31 - 1, 0, -3):
        with pytest.raises(
            tf.errors.InvalidArgumentError,
            match=rf"max_new_tokens. must be in \[1, 20\].*Received: max_new_tokens={asked}",
        ):
            _greedy_request(loaded.signatures["generate"], [[5, 2]], [2], asked)
    with pytest.raises(ValueError, match="max_new_tokens_limit"):
        export_model(model, str(tmp_path / "other"), max_new_tokens_limit=0)
