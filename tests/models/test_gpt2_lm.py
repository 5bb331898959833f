import keras
import numpy as np
import pytest
from backend import greedy_rows_by_full_passes

from keras_tfam.generation import Generator, GreedySampler, TopKSampler
from keras_tfam.models import GPT2LM

rng = np.random.default_rng(0)
TINY = dict(vocabulary_size=61, num_layers=2, num_heads=4, hidden_dim=32, max_sequence_length=48)


def tiny(**overrides):
    keras.utils.set_random_seed(1)
    return GPT2LM(**{**TINY, **overrides})


def test_gpt2_small_has_the_original_parameter_count():
    # A stateless scope defers the variables' initialisation: the count needs their shapes only. (On
    # TensorFlow alone: tests/conftest.py.)
    with keras.StatelessScope():
        model = GPT2LM.from_preset("gpt2_small")
    assert model.count_params() == 124_439_808


def test_output_head_is_the_token_embedding():
    model = tiny()
    tokens = rng.integers(0, 61, size=(2, 9))
    embeddings = [w for w in model.weights if "embeddings" in w.path and "token" in w.path]
    assert len(embeddings) == 1
    hidden = keras.Model(model.input, model.final_norm.output)(tokens)
    np.testing.assert_allclose(
        model(tokens), np.asarray(hidden) @ np.asarray(model.token_embedding.embeddings).T, rtol=1e-5, atol=1e-5
    )


def test_gpt2_initialisation():
    keras.utils.set_random_seed(0)
    model = GPT2LM(vocabulary_size=500, num_layers=8, num_heads=4, hidden_dim=128, max_sequence_length=64)
    block = model.transformer_blocks[0]
    np.testing.assert_allclose(np.std(block.self_attention_layer.query_dense.kernel), 0.02, rtol=0.05)
    np.testing.assert_allclose(np.std(model.token_embedding.embeddings), 0.02, rtol=0.05)
    residual = 0.02 / np.sqrt(2 * 8)
    np.testing.assert_allclose(np.std(block.self_attention_layer.output_dense.kernel), residual, rtol=0.05)
    np.testing.assert_allclose(np.std(block.feed_forward.output_dense.kernel), residual, rtol=0.05)


def test_causal_logits():
    model = tiny()
    tokens = rng.integers(0, 61, size=(1, 12))
    changed = tokens.copy()
    changed[0, 7:] = (changed[0, 7:] + 1) % 61
    np.testing.assert_allclose(np.asarray(model(tokens))[:, :7], np.asarray(model(changed))[:, :7], atol=1e-5)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"position": "rotary", "norm": "rms", "activation": "swiglu", "num_key_value_heads": 2},
        {"position": "alibi", "norm": "scale"},
        {"position": "none"},
        {"attention": "linear", "position": "rotary", "norm": "rms"},
    ],
    ids=["gpt2", "modern", "alibi", "nopos", "linear"],
)
def test_fit_compiled_then_cached_greedy_equals_uncached(options):
    model = tiny(**options)
    # A learnable stream: each token is the previous one plus 3.
    start = rng.integers(0, 61, size=(32, 1))
    stream = (start + 3 * np.arange(17)) % 61
    x, y = stream[:, :-1], stream[:, 1:]
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    history = model.fit(x, y, batch_size=8, epochs=15, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0]
    prompts = [[5, 8, 11], [40, 43, 46, 49, 52]]
    generated = model.generate(prompts, max_new_tokens=10)
    for row, expected in zip(generated, greedy_rows_by_full_passes(model, prompts, 10)):
        assert list(row[: len(expected)]) == expected
        assert list(row[len(expected) :]) == [0] * (len(row) - len(expected))


def test_the_first_fit_traces_its_step_once_and_trains_as_keras_does():
    # Keras' TensorFlow trainer builds the optimizer inside the first trace (so
    # `tf.function` traces the step twice); ours builds it first. Same training on every backend.
    x = rng.integers(0, 61, size=(16, 12))
    models, traces = [], []
    for fit in (GPT2LM.fit, keras.Model.fit):
        model = tiny()
        if fit is GPT2LM.fit and keras.config.backend() == "tensorflow":
            train_step = model.train_step
            model.train_step = lambda data: (traces.append(data), train_step(data))[1]
        model.compile(
            optimizer=keras.optimizers.AdamW(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        )
        fit(model, x, x, batch_size=8, epochs=2, verbose=0)
        models.append(model)
    assert len(traces) == (1 if keras.config.backend() == "tensorflow" else 0)
    # Bit for bit on a CPU. A GPU sums some gradients with atomic adds in no fixed order, so two runs of one
    # program differ there in the last bits (up to 3.7e-8 on weights of ~0.05 on an H200, JAX), which
    # Adam's g / sqrt(v) carries into the weights.
    on_gpu = any(device.lower().startswith(("gpu", "cuda")) for device in keras.distribution.list_devices())
    tolerance = 1e-6 if on_gpu else 0.0
    for ours, keras_own in zip(models[0].weights, models[1].weights):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(keras_own), rtol=0, atol=tolerance)


@pytest.mark.parametrize(
    "options", [{}, {"position": "alibi"}, {"attention": "linear"}], ids=["gpt2", "alibi", "linear"]
)
def test_cached_logits_across_a_cache_resize_equal_the_full_pass(options):
    model = tiny(max_sequence_length=160, **options)
    tokens = rng.integers(0, 61, size=(2, 100)).astype("int32")
    caches = model.init_cache(2, 64)
    first, caches, _ = model.call_with_cache(tokens[:, :50], caches, 0)
    caches = model.resize_cache(caches, 128)
    second, caches, _ = model.call_with_cache(tokens[:, 50:], caches, 50)
    cached = np.concatenate([first, second], axis=1)
    np.testing.assert_allclose(cached, np.asarray(model(tokens)), atol=1e-4)


@pytest.mark.parametrize(
    "options", [{}, {"position": "alibi"}, {"attention": "linear"}], ids=["gpt2", "alibi", "linear"]
)
def test_greedy_over_a_buffer_whose_caches_grow_in_segments(options):
    # Prompts of 3 and 70 tokens + 200 new: a 270-position buffer, caches grown at 135.
    model = tiny(max_sequence_length=300, **options)
    prompts = [[5, 8, 11], list(rng.integers(0, 61, size=70))]
    generated = model.generate(prompts, max_new_tokens=200)
    logits = np.asarray(model(generated))  # one uncached pass over what was generated
    for row, prompt in enumerate(prompts):
        np.testing.assert_array_equal(generated[row, : len(prompt)], prompt)
        positions = np.arange(len(prompt), len(prompt) + 200)
        chosen = logits[row, positions - 1, generated[row, positions]]
        # Each new token is the full pass's argmax (up to float ties).
        np.testing.assert_allclose(chosen, logits[row, positions - 1].max(axis=-1), atol=1e-5)
    assert np.all(generated[0, 203:] == 0)


def test_mixed_precision_logits_and_loss_are_float32():
    model = tiny(dtype="mixed_bfloat16")
    tokens = rng.integers(0, 61, size=(4, 9))
    logits = model(tokens)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert model.transformer_blocks[0].self_attention_layer.query_dense.kernel.dtype == "float32"
    model.compile(optimizer="adamw", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    loss = model.fit(tokens[:, :-1], tokens[:, 1:], verbose=0).history["loss"][0]
    assert np.isfinite(loss)


def test_stop_tokens_end_rows_independently():
    model = tiny()
    prompts = [[1, 2, 3], [7, 8, 9]]
    free = model.generate(prompts, max_new_tokens=8)
    stop = int(free[0, 5])  # the third new token of row 0
    stopped = model.generate(prompts, max_new_tokens=8, stop_token_ids=[stop], pad_token_id=60)
    first = list(free[0, 3:]).index(stop) + 3
    np.testing.assert_array_equal(stopped[0, : first + 1], free[0, : first + 1])
    assert np.all(stopped[0, first + 1 :] == 60)
    if stop not in free[1, 3:]:
        np.testing.assert_array_equal(stopped[1], free[1])


def test_sampling_is_seeded_and_restricted_by_top_k():
    model = tiny()
    a = model.generate([[1, 2, 3]], 12, sampler=TopKSampler(k=3), seed=7)
    b = model.generate([[1, 2, 3]], 12, sampler=TopKSampler(k=3), seed=7)
    np.testing.assert_array_equal(a, b)
    for sampler in ("random", "top_p"):
        assert model.generate([[1, 2, 3]], 12, sampler=sampler, seed=1).shape == (1, 15)
    # Every sampled token is among the 3 most likely at its step.
    logits = np.asarray(model(a[:, :-1]))[0, 2:]
    top3 = np.argsort(-logits, axis=-1)[:, :3]
    assert all(token in top for token, top in zip(a[0, 3:], top3))


def test_compiled_loop_is_reused_for_equal_shapes():
    model = tiny()
    sampler = GreedySampler()
    model.generate([[1, 2, 3]], 5, sampler=sampler)
    model.generate([[4, 5, 6]], 5, sampler=sampler)
    (function,) = [entry[-1] for entry in Generator.for_model(model)._functions.values()]
    if keras.backend.backend() == "tensorflow":
        assert function.experimental_get_tracing_count() == 1


def test_generate_bad_input():
    model = tiny()
    with pytest.raises(
        ValueError, match=r"`token_ids` must be in \[0, 61\).*Received: token id 61 at prompt 1, position 2"
    ):
        model.generate([[1, 2], [3, 4, 61]], 4)
    with pytest.raises(ValueError, match=r"Received: token id -1 at prompt 0, position 0"):
        model.generate([[-1, 2]], 4)
    with pytest.raises(
        ValueError, match="Prompt length 40 \\+ max_new_tokens 9 = 49 exceeds the model's context of 48"
    ):
        model.generate([list(range(40))], 9, overflow="error")
    with pytest.raises(ValueError, match="empty prompt at row 1"):
        model.generate([[3], []], 4)
    with pytest.raises(ValueError, match="Received: max_new_tokens=0"):
        model.generate([[1]], 0)
    with pytest.raises(ValueError, match="Received: beam_size=0"):
        model.generate([[1]], 3, beam_size=0)
    with pytest.raises(ValueError, match="Received: overflow='wrap'"):
        model.generate([[1]], 3, overflow="wrap")
    with pytest.raises(ValueError, match="cannot exceed the 48 positions.*Received: window=49"):
        model.generate([[1]], 3, window=49)
    with pytest.raises(ValueError, match=r"Received: token id -1 at index \(0, 1\)"):
        model(np.array([[3, -1]]))  # a gather would read -1 as id 60
    # Past its context the model slides its window (here: re-encodes the last 48 tokens).
    assert model.generate([list(range(40))], 9).shape == (1, 49)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="Received: position='sinusoid'"):
        tiny(position="sinusoid")
    with pytest.raises(ValueError, match="hidden_dim=30, num_heads=4"):
        tiny(hidden_dim=30)
    with pytest.raises(ValueError, match="Received: name='gpt3'"):
        GPT2LM.from_preset("gpt3")


def test_keras_save_load(tmp_path):
    model = tiny(position="rotary", norm="rms")
    tokens = rng.integers(0, 61, size=(2, 7))
    path = str(tmp_path / "gpt2.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, GPT2LM)
    np.testing.assert_allclose(loaded(tokens), model(tokens), atol=1e-6)
    np.testing.assert_array_equal(loaded.generate([[1, 2]], 4), model.generate([[1, 2]], 4))


def test_generate_eager_without_xla_matches():
    model = tiny()
    np.testing.assert_array_equal(model.generate([[3, 1, 4]], 6, jit_compile=False), model.generate([[3, 1, 4]], 6))
