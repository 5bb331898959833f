import keras
import numpy as np
import pytest
from reference import softmax

from keras_tfam.models import GPT2LM, KNNLM, EarlyExitLM
from keras_tfam.retrieval import Datastore
from keras_tfam.retrieval.datastore import logits_and_hidden_states

rng = np.random.default_rng(0)
TINY = dict(vocabulary_size=61, num_layers=2, num_heads=4, hidden_dim=32, max_sequence_length=48)


def lm(**overrides):
    """A GPT-2: the generation protocol, with hidden states."""
    keras.utils.set_random_seed(1)
    return GPT2LM(**{**TINY, **overrides})


def corpus(blocks=6, length=12, seed=0):
    stream = np.random.default_rng(seed).integers(0, 61, size=blocks * length + 1)
    return stream[:-1].reshape(blocks, length), stream[1:].reshape(blocks, length)


def greedy_with_cache(model, prompt, new_tokens):
    """A small greedy loop over `call_with_cache`: the tokens and every step's log-probabilities."""
    tokens = np.array([prompt], "int32")
    cache = model.init_cache(1, len(prompt) + new_tokens)
    outputs, cache, _ = model.call_with_cache(tokens, cache, 0)
    steps = [np.asarray(outputs)[:, -1]]
    for _ in range(new_tokens - 1):
        tokens = np.concatenate([tokens, [[int(steps[-1][0].argmax())]]], axis=1).astype("int32")
        outputs, cache, _ = model.call_with_cache(tokens[:, -1:], cache, tokens.shape[1] - 1)
        steps.append(np.asarray(outputs)[:, -1])
    return list(tokens[0]) + [int(steps[-1][0].argmax())], np.stack(steps, 1)


def test_datastore_from_model_holds_the_final_hidden_states():
    model = lm()
    inputs, targets = corpus()
    weights = np.ones(inputs.shape)
    weights[-1, 8:] = 0  # padding: left out
    datastore = Datastore.from_model(model, inputs, targets, weights, batch_size=4, k=4)
    x = model.token_embedding(inputs)
    x = x + model.position_embedding(x)
    for block in model.transformer_blocks:
        x = block(x)
    hidden = model.final_norm(x)  # the input of the softmax
    keep = weights > 0
    np.testing.assert_allclose(np.asarray(datastore.keys), np.asarray(hidden)[keep], atol=1e-5)
    np.testing.assert_array_equal(np.asarray(datastore.values), targets[keep])
    with pytest.raises(ValueError, match="datastore would be empty"):
        Datastore.from_model(model, inputs, targets, np.zeros(inputs.shape))


def test_interpolation_zero_is_the_lm_exactly_cached_and_not():
    model = lm()
    inputs, targets = corpus()
    knn = KNNLM(model, Datastore.from_model(model, inputs, targets, k=8), interpolation=0.0)
    tokens = rng.integers(0, 61, size=(2, 9))
    logits, _, _ = model.call_with_cache(tokens, model.init_cache(2, 9), 0)
    np.testing.assert_array_equal(np.asarray(knn(tokens)), np.asarray(keras.ops.log_softmax(logits, axis=-1)))
    generated, steps = greedy_with_cache(knn, [4, 9, 2], 8)
    lm_generated, lm_steps = greedy_with_cache(model, [4, 9, 2], 8)
    assert generated == lm_generated
    np.testing.assert_allclose(steps, np.asarray(keras.ops.log_softmax(lm_steps, axis=-1)), atol=1e-6)
    # generate (compiled loop, sampling) draws the LM's tokens: log-softmax keeps the distribution.
    prompts = [[4, 9, 2], [7]]
    np.testing.assert_array_equal(
        knn.generate(prompts, 6, sampler="random", seed=2), model.generate(prompts, 6, sampler="random", seed=2)
    )


def test_interpolation_matches_numpy_and_cached_equals_uncached():
    model = lm()
    inputs, targets = corpus()
    datastore = Datastore.from_model(model, inputs, targets, k=8, temperature=4.0)
    knn = KNNLM(model, datastore, interpolation=0.3)
    tokens = rng.integers(0, 61, size=(1, 9))
    logits, hidden = (np.asarray(x, np.float64) for x in logits_and_hidden_states(model, tokens))
    keys, values = np.asarray(datastore.keys, np.float64), np.asarray(datastore.values).astype(int)
    d = ((hidden[..., None, :] - keys) ** 2).sum(-1)
    nearest = np.argsort(d, axis=-1)[..., :8]
    w = softmax(-np.take_along_axis(d, nearest, -1) / 4.0)
    p_knn = np.zeros(logits.shape)
    for t in range(9):
        np.add.at(p_knn[0, t], values[nearest[0, t]], w[0, t])
    expected = np.log(0.3 * p_knn + 0.7 * softmax(logits))
    out = np.asarray(knn(tokens))
    np.testing.assert_allclose(out, expected, atol=2e-5)
    generated, steps = greedy_with_cache(knn, list(tokens[0, :3]), 6)
    np.testing.assert_allclose(steps[0], np.asarray(knn(np.array([generated[:-1]], "int32")))[0, 2:], atol=1e-4)
    assert list(knn.generate([list(tokens[0, :3])], 6)[0]) == generated[:9]


def test_over_an_early_exit_lm_that_never_exits():
    gpt2 = lm(position="rotary")
    inputs, targets = corpus()
    early_exit = EarlyExitLM(gpt2, threshold=1.0)
    datastore = Datastore.from_model(gpt2, inputs, targets, k=4)
    tokens = rng.integers(0, 61, size=(2, 7))
    np.testing.assert_allclose(
        np.asarray(KNNLM(early_exit, datastore, 0.5)(tokens)),
        np.asarray(KNNLM(gpt2, datastore, 0.5)(tokens)),
        atol=1e-5,
    )
    prompts = [[3, 5, 8], [2]]
    np.testing.assert_array_equal(
        KNNLM(early_exit, datastore, 0.5).generate(prompts, 5), KNNLM(gpt2, datastore, 0.5).generate(prompts, 5)
    )


def test_a_datastore_of_the_text_lowers_its_perplexity():
    # Memorisation: retrieving from a datastore of the same text predicts it better.
    model = lm()
    inputs, targets = corpus(blocks=8)
    knn = KNNLM(model, Datastore.from_model(model, inputs, targets, k=4), interpolation=0.5)
    logits, _ = logits_and_hidden_states(model, inputs)
    lm_nll = -np.take_along_axis(np.asarray(keras.ops.log_softmax(logits)), targets[..., None], -1).mean()
    knn_nll = -np.take_along_axis(np.asarray(knn(inputs)), targets[..., None], -1).mean()
    assert knn_nll < lm_nll - 0.5


def test_save_load(tmp_path):
    model = lm()
    inputs, targets = corpus()
    knn = KNNLM(model, Datastore.from_model(model, inputs, targets, k=4), interpolation=0.25)
    tokens = rng.integers(0, 61, size=(2, 5))
    expected = np.asarray(knn(tokens))
    path = str(tmp_path / "knn.keras")
    knn.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, KNNLM) and loaded.interpolation == 0.25
    np.testing.assert_allclose(np.asarray(loaded(tokens)), expected, atol=1e-5)


def test_bad_arguments():
    model = lm()
    inputs, targets = corpus()
    datastore = Datastore.from_model(model, inputs, targets, k=4)
    with pytest.raises(ValueError, match="Received: interpolation=1.5"):
        KNNLM(model, datastore, interpolation=1.5)
    with pytest.raises(ValueError, match="datastore.vocabulary_size=7, lm.vocabulary_size=61"):
        KNNLM(model, Datastore(4, 32, 7, k=2))
    with pytest.raises(ValueError, match="Received: datastore=None"):
        KNNLM(model, None)
    with pytest.raises(ValueError, match=r"`token_ids` must be \(batch, length\) token ids.*token_ids.shape=\(3,\)"):
        KNNLM(model, datastore)(np.zeros((3,), "int32"))


def test_a_datastore_of_another_width_is_refused_in_one_line():
    # Before: a raw MatMul error at call time.
    model = lm()
    datastore = Datastore(size=4, key_dim=16, vocabulary_size=61, k=2)
    knn = KNNLM(model, datastore, interpolation=0.5)
    with pytest.raises(ValueError, match=r"key_dim=16 features but the LM's hidden states have 32"):
        knn(np.zeros((1, 3), "int32"))
    with pytest.raises(ValueError, match=r"key_dim=16 features but the LM's hidden states have 32"):
        knn.call_with_cache(np.zeros((1, 3), "int32"), knn.init_cache(1, 3), 0)
