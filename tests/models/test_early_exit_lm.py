import keras
import numpy as np
import pytest
from backend import greedy_by_full_passes

from keras_tfam.models import GPT2LM, EarlyExitLM, grid_search_threshold, learn_then_test

rng = np.random.default_rng(0)
TINY = dict(vocabulary_size=61, num_layers=3, num_heads=4, hidden_dim=32, max_sequence_length=48)


def backbone(**overrides):
    keras.utils.set_random_seed(1)
    return GPT2LM(**{**TINY, **overrides})


def greedy_with_cache(model, prompts, new_tokens):
    """A small greedy loop over the generation protocol: tokens, step logits and exit layers."""
    prompts = np.asarray(prompts, "int32")
    cache = model.init_cache(len(prompts), prompts.shape[1] + new_tokens)
    step = model.early_exit_step(prompts, cache, 0)
    tokens, logits, layers = prompts, [], []
    for _ in range(new_tokens):
        next_logits = np.asarray(step["logits"])[:, -1]
        tokens = np.concatenate([tokens, next_logits.argmax(-1)[:, None].astype("int32")], axis=1)
        step = model.early_exit_step(tokens[:, -1:], step["cache"], tokens.shape[1] - 1)
        logits.append(np.asarray(step["logits"])[:, 0])
        layers.append(np.asarray(step["exit_layers"]))
    return tokens, np.stack(logits, 1), np.stack(layers, 1)


@pytest.mark.parametrize("confidence", ["softmax_response", "classifier"])
@pytest.mark.parametrize("position", ["learned", "rotary"])
def test_threshold_that_never_fires_is_ordinary_generation(confidence, position):
    gpt2 = backbone(position=position)
    model = EarlyExitLM(gpt2, confidence=confidence, threshold=1.0)
    if confidence == "classifier":
        model.exit_classifier.bias.assign([50.0])  # confidence exactly 1.0: still not above 1
    prompt = [5, 8, 11, 2]
    tokens, logits, layers = greedy_with_cache(model, [prompt], 10)
    assert list(tokens[0]) == greedy_by_full_passes(gpt2, prompt, 10)
    np.testing.assert_allclose(logits[:, :-1], np.asarray(gpt2(tokens[:, :-1]))[:, 4:], atol=1e-4)
    assert np.all(layers == 3)
    # The prompt and full passes are the backbone's.
    np.testing.assert_allclose(np.asarray(model(tokens)), np.asarray(gpt2(tokens)), atol=1e-5)


@pytest.mark.parametrize(
    "options", [{"position": "learned"}, {"position": "rotary"}, {"position": "rotary", "local_window": 4}]
)
def test_exit_after_the_first_layer_and_state_propagation(options):
    # Local layers (odd: the second block) keep rings of 4 slots: position p in slot p % 4.
    gpt2 = backbone(**options)
    model = EarlyExitLM(gpt2, threshold=0.0)
    prompt = np.array([[3, 1, 4, 1, 5]], "int32")
    tokens, logits, layers = greedy_with_cache(model, prompt, 6)
    assert np.all(layers == 1)
    # Layer 1 always runs on a full cache, so its states are the full pass's.
    first_layer_logits = np.asarray(model.layer_logits_model()(tokens)[0])
    np.testing.assert_allclose(logits, first_layer_logits[:, 5:], atol=1e-4)
    # The skipped layers hold keys/values projected from the exit state (CALM's propagation).
    cache = model.init_cache(1, 12)
    _, cache, _ = model.call_with_cache(tokens[:, :5], cache, 0)
    _, cache, _ = model.call_with_cache(tokens[:, 5:6], cache, 5)
    x = gpt2.token_embedding(tokens[:, :6])
    if gpt2.position_embedding is not None:
        x = x + gpt2.position_embedding(x)
    exit_state = gpt2.transformer_blocks[0](x)[:, 5:6]
    for block, layer_cache in zip(gpt2.transformer_blocks[1:], cache[1:]):
        attention = block.self_attention_layer
        _, expected = attention(
            block.self_attention_norm(exit_state),
            cache=np.asarray(layer_cache) * 0,
            cache_update_index=5,
            use_causal_mask=True,
        )
        slot = 5 % layer_cache.shape[2]
        np.testing.assert_allclose(np.asarray(layer_cache)[:, :, slot], np.asarray(expected)[:, :, slot], atol=1e-5)


def test_rows_exit_independently_within_a_batch():
    # A random exit classifier makes rows exit after different layers; each row
    # decodes as it would alone (where a lone row skips the layers it exits).
    model = EarlyExitLM(backbone(), confidence="classifier", threshold=0.5)
    model.exit_classifier.kernel.assign(rng.normal(size=(32, 1)).astype("float32"))
    prompts = rng.integers(0, 61, size=(4, 5))
    tokens, logits, layers = greedy_with_cache(model, prompts, 8)
    assert len(np.unique(layers)) > 1
    for row in range(4):
        alone_tokens, alone_logits, alone_layers = greedy_with_cache(model, prompts[row : row + 1], 8)
        np.testing.assert_array_equal(alone_tokens[0], tokens[row])
        np.testing.assert_array_equal(alone_layers[0], layers[row])
        np.testing.assert_allclose(alone_logits[0], logits[row], atol=1e-4)


def test_calm_training_then_confident_tokens_leave_early():
    # A learnable stream (each token is the previous plus 3), trained with CALM's
    # weighted per-layer loss: the shared head becomes confident at layer 1.
    gpt2 = backbone()
    model = EarlyExitLM(gpt2, threshold=0.8)
    start = rng.integers(0, 61, size=(64, 1))
    stream = (start + 3 * np.arange(17)) % 61
    calm = model.layer_logits_model()
    calm.compile(
        keras.optimizers.AdamW(1e-2),
        [keras.losses.SparseCategoricalCrossentropy(from_logits=True)] * 3,
        loss_weights=EarlyExitLM.calm_loss_weights(3),
    )
    calm.fit(stream[:, :-1], [stream[:, 1:]] * 3, batch_size=16, epochs=12, verbose=0)
    tokens, _, layers = greedy_with_cache(model, [[7, 10, 13]], 12)
    assert list(tokens[0]) == [(7 + 3 * i) % 61 for i in range(15)]
    assert layers.mean() < 2.0


@pytest.mark.parametrize(
    "options, generate",
    [
        ({"position": "learned"}, {"sampler": "random", "seed": 3}),  # 12 + 4 > 10: the window re-encodes
        ({"position": "rotary", "local_window": 4, "context_length": 10}, {"sampler": "top_k", "seed": 5}),
        ({"position": "rotary"}, {"beam_size": 2}),
    ],
)
def test_generate_with_a_threshold_that_never_fires_is_the_backbone_generate(options, generate):
    # Through the generation protocol: prompts of different lengths, sampling, beam search, sliding past
    # the context (learned positions re-encode the window; relative ones slide ring caches).
    gpt2 = backbone(max_sequence_length=10, num_layers=2, **options)  # no exit fires: 2 layers are enough
    model = EarlyExitLM(gpt2, threshold=1.0)
    prompts = [[5, 8, 11, 2], [7, 1]]
    np.testing.assert_array_equal(model.generate(prompts, 12, **generate), gpt2.generate(prompts, 12, **generate))


def test_threshold_is_a_variable_read_by_compiled_generation():
    # The same compiled loop (one per generator and setting) reads the threshold's current value.
    gpt2 = backbone()
    model = EarlyExitLM(gpt2, threshold=1.0)
    prompt = [[5, 8, 11, 2]]
    np.testing.assert_array_equal(model.generate(prompt, 8), gpt2.generate(prompt, 8))
    model.threshold = 0.0  # every generated token leaves after the first layer
    tokens = model.generate(prompt, 8)
    # The prompt's last token runs every layer (prompt tokens do), so the first new token is the
    # backbone's; every later one leaves after the first layer.
    expected = greedy_by_full_passes(gpt2, prompt[0], 1)
    first_layer = model.layer_logits_model()
    for _ in range(7):
        logits = np.asarray(first_layer(np.array([expected], "int32"))[0])
        expected.append(int(logits[0, -1].argmax()))
    assert list(tokens[0]) == expected


@pytest.mark.parametrize("options", [{"position": "learned"}, {"position": "rotary", "local_window": 4}])
def test_prompt_tokens_run_every_layer_in_rows_of_any_length(options):
    # Rows of different lengths finish their prompts one token at a time inside the decoding loop: those
    # prompt tokens run every layer though every generated token leaves after the first, so each row's
    # first new token is the backbone's, and its later ones follow the backbone's caches of the prompt.
    gpt2 = backbone(**options)
    model = EarlyExitLM(gpt2, threshold=0.0)
    prompts = [[5, 8, 11, 2, 9, 4, 1], [7, 1], [3, 3, 6, 2]]
    tokens = model.generate(prompts, 4)
    for row, prompt in enumerate(prompts):
        reference = greedy_with_cache(model, [prompt], 4)[0][0]  # prompt in one pass, then one-token steps
        assert list(tokens[row, len(prompt) : len(prompt) + 4]) == list(reference[len(prompt) :])
        assert tokens[row, len(prompt)] == greedy_by_full_passes(gpt2, prompt, 1)[-1]


def test_save_load(tmp_path):
    model = EarlyExitLM(backbone(position="rotary"), confidence="classifier", threshold=0.25)
    tokens = rng.integers(0, 61, size=(2, 7))
    model(tokens)
    path = str(tmp_path / "early_exit.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, EarlyExitLM) and loaded.threshold == 0.25
    np.testing.assert_allclose(np.asarray(loaded(tokens)), np.asarray(model(tokens)), atol=1e-6)
    np.testing.assert_array_equal(greedy_with_cache(loaded, tokens, 4)[0], greedy_with_cache(model, tokens, 4)[0])


def test_bad_arguments():
    gpt2 = backbone()
    with pytest.raises(ValueError, match="Received: threshold=1.5"):
        EarlyExitLM(gpt2, threshold=1.5)
    model = EarlyExitLM(gpt2)
    with pytest.raises(ValueError, match="Received: threshold=-0.1"):
        model.threshold = -0.1
    with pytest.raises(ValueError, match="Received: confidence='entropy'"):
        EarlyExitLM(gpt2, confidence="entropy")
    # NumPy scalars are numbers, as everywhere else; a NumPy NaN or bool is not.
    assert EarlyExitLM(gpt2, threshold=np.float32(0.5)).threshold == 0.5
    model.threshold = np.float64(0.25)
    assert model.threshold == 0.25 and type(model.get_config()["threshold"]) is float
    for bad in (np.float32("nan"), True, "0.5"):
        with pytest.raises(ValueError, match=r"`threshold` must be a finite number in \[0, 1\]"):
            EarlyExitLM(gpt2, threshold=bad)
    with pytest.raises(ValueError, match=r"`token_ids` must be integer token ids. Received: token_ids.dtype=float32"):
        model(np.zeros((1, 3), "float32"))
    with pytest.raises(ValueError, match=r"Received: batch_size=0"):
        model.consistency_labels(np.zeros((2, 3), "int32"), batch_size=0)
    with pytest.raises(ValueError, match="Received: window=4"):
        model.call_with_cache(np.zeros((1, 1), "int32"), model.init_cache(1, 8), 0, window=4)
    with pytest.raises(ValueError, match="decodes with key/value caches.*a recurrent state is not"):
        EarlyExitLM(backbone(attention="linear"))
    with pytest.raises(ValueError, match='Received: confidence="softmax_response"'):
        model.exit_classifier_model()


def synthetic_risk(threshold, n=2000):
    """Per-example 0/1 losses whose rate grows as the threshold falls: 0.2 * (1 - threshold)."""
    losses = np.zeros(n)
    losses[: int(round(n * 0.2 * (1.0 - threshold)))] = 1.0
    return losses


def test_learn_then_test_and_grid_search():
    thresholds = [1.0, 0.8, 0.6, 0.4, 0.2, 0.0]
    chosen, records = learn_then_test(synthetic_risk, thresholds, tolerance=0.1, epsilon=0.05)
    # Risks 0, .04, .08: Hoeffding p-values exp(-2 n (0.1 - risk)^2) = e^-20, e^-14.4, e^-1.6;
    # testing stops at the first above epsilon (0.6), so 0.8 is the calibrated threshold.
    expected = [np.exp(-2 * 2000 * (0.1 - r) ** 2) for r in (0.0, 0.04, 0.08)]
    np.testing.assert_allclose([r["p_value"] for r in records], expected, rtol=1e-6)
    assert chosen == 0.8 and [r["threshold"] for r in records] == [1.0, 0.8, 0.6]
    # Grid search takes the smallest threshold whose empirical risk (0.08) is within tolerance.
    grid, grid_records = grid_search_threshold(synthetic_risk, thresholds, tolerance=0.1)
    assert grid == 0.6 and len(grid_records) == 6
    with pytest.raises(ValueError, match="Received: threshold=1.5"):
        learn_then_test(synthetic_risk, [1.5, 0.5], tolerance=0.1)
    with pytest.raises(ValueError, match="Received: tolerance=0"):
        grid_search_threshold(synthetic_risk, [0.5], tolerance=0)
