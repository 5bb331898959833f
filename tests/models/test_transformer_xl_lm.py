import keras
import numpy as np
import pytest

from keras_tfam.models import TransformerXLLM

rng = np.random.default_rng(0)
TINY = dict(vocabulary_size=37, num_layers=2, num_heads=2, hidden_dim=16)


def tiny(**overrides):
    keras.utils.set_random_seed(1)
    return TransformerXLLM(**{**TINY, **overrides})


def segment_by_segment(model, tokens, length):
    """Logits of `tokens` read in segments of `length`, each after the memory of the previous ones."""
    cache, logits = model.init_cache(len(tokens)), []
    for start in range(0, tokens.shape[1], length):
        out, cache, _ = model.call_with_cache(tokens[:, start : start + length], cache)
        logits.append(np.asarray(out))
    return np.concatenate(logits, axis=1), cache


def stateful_stream(rows, segment, batch):
    """`(inputs, targets)` laid out for `fit(..., shuffle=False, batch_size=batch)`: row b of batch n + 1
    continues row b of batch n."""
    steps = (rows.shape[1] - 1) // segment
    cut = lambda a: a[:, : steps * segment].reshape(batch, steps, segment).swapaxes(0, 1).reshape(-1, segment)  # noqa: E731
    return cut(rows[:, :-1]), cut(rows[:, 1:])


@pytest.mark.parametrize(
    "options",
    [{}, {"residual": "gru"}, {"max_span": 32, "span_ramp": 4}, {"norm": "rms", "activation": "swiglu"}],
    ids=["xl", "gtrxl", "adaptive-span", "rms-swiglu"],
)
def test_segments_with_memory_equal_one_causal_pass_over_the_text(options):
    # Memory 12 >= the 8 tokens before the last segment: every token sees the
    # whole text before it, at the same relative distances, as one causal pass.
    model = tiny(memory_length=12, **options)
    tokens = rng.integers(0, 37, size=(2, 12)).astype("int32")
    model(tokens)
    if "max_span" in options:  # spans covering the text
        for block in model.transformer_blocks:
            block.self_attention_layer.position.schemes[1].span_fractions.assign(np.ones(2, "float32"))
    segmented, _ = segment_by_segment(model, tokens, 4)
    np.testing.assert_allclose(segmented, np.asarray(model(tokens)), atol=1e-5)


def test_memory_is_stateful_across_training_calls():
    model = tiny(memory_length=12)
    tokens = rng.integers(0, 37, size=(2, 12)).astype("int32")
    model.build((2, 4))
    logits = [np.asarray(model(tokens[:, s : s + 4], training=True)) for s in range(0, 12, 4)]
    np.testing.assert_allclose(np.concatenate(logits, axis=1), np.asarray(model(tokens)), atol=1e-5)
    model.reset_memory()
    np.testing.assert_allclose(model(tokens[:, :4], training=True), logits[0], atol=1e-6)


def test_a_short_memory_forgets():
    # Memory 2: the last segment no longer sees the first tokens.
    model = tiny(memory_length=2)
    tokens = rng.integers(0, 37, size=(1, 8)).astype("int32")
    changed = tokens.copy()
    changed[0, 0] = (changed[0, 0] + 1) % 37
    first, _ = segment_by_segment(model, tokens, 2)
    second, _ = segment_by_segment(model, changed, 2)
    # Token 0 reaches 2 layers x (2 memory + 1) positions ahead, then no further.
    assert not np.allclose(first[:, 1:5], second[:, 1:5])
    np.testing.assert_allclose(first[:, 7:], second[:, 7:], atol=1e-6)


def test_compressive_at_rate_one_with_identity_compression_equals_a_longer_memory():
    # 4 memory + 4 compressed slots of 1 state (mean pooling of one = identity)
    # hold the same 8 states as a memory of 8.
    compressive = tiny(memory_length=4, compressed_memory_length=4, compression_rate=1, compression="mean")
    longer = tiny(memory_length=8)
    tokens = rng.integers(0, 37, size=(2, 20)).astype("int32")
    compressive(tokens[:, :4])
    longer(tokens[:, :4])
    for target, source in zip(compressive.trainable_weights, longer.trainable_weights):
        target.assign(source)
    ours, _ = segment_by_segment(compressive, tokens, 4)
    theirs, _ = segment_by_segment(longer, tokens, 4)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    # And differs once the compression merges states.
    merged = tiny(memory_length=4, compressed_memory_length=4, compression_rate=2, compression="mean")
    merged(tokens[:, :4])
    for target, source in zip(merged.trainable_weights, longer.trainable_weights):
        target.assign(source)
    assert not np.allclose(segment_by_segment(merged, tokens, 4)[0][:, 12:], theirs[:, 12:], atol=1e-3)


def test_fit_on_a_stateful_stream_learns_what_only_the_memory_shows():
    # Each row repeats a random pattern of 6 tokens 4 times, then the next. The
    # token 6 back, which predicts the next one, is never in the same segment of
    # 4: a model without memory cannot beat the uniform log(37) = 3.61 nats; the
    # memory holds it, and the loss falls far below.
    batch, segment, period = 16, 4, 6
    rows = np.repeat(rng.integers(0, 37, size=(batch, 20, period)), 4, axis=1).reshape(batch, -1)[:, :477]
    x, y = stateful_stream(rows, segment, batch)
    model = tiny(memory_length=8, num_layers=1, hidden_dim=32)
    model.compile(
        keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True
    )
    history = model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0)
    assert history.history["loss"][-1] < 0.6 * np.log(37)


@pytest.mark.parametrize(
    "options", [{}, {"compressed_memory_length": 4, "compression_rate": 2}], ids=["xl", "compressive"]
)
def test_a_partial_last_batch_continues_the_streams_of_its_rows(options):
    # 10 segments at batch 4: the last batch holds rows 0 and 1 only (a raw reshape error before). Those
    # continue their streams (segments 0, 4, 8 and 1, 5, 9); rows 2 and 3 keep their memory (2, 6 and 3, 7).
    model = tiny(memory_length=8, **options)
    model.build((4, 4))
    x = rng.integers(0, 37, size=(10, 4)).astype("int32")
    model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, x, batch_size=4, shuffle=False, verbose=0)
    for row in range(4):
        cache = model.init_cache(1)
        for segment in range(row, 10, 4):
            cache = model.call_with_cache(x[segment : segment + 1], cache).cache
        for stored, expected in zip(model.memory_state(), cache):
            for name in expected:
                np.testing.assert_allclose(
                    np.asarray(stored[name])[row : row + 1], np.asarray(expected[name]), atol=1e-5
                )


def test_compressive_training_adds_the_reconstruction_loss():
    model = tiny(memory_length=4, compressed_memory_length=2, compression_rate=2, compression="conv")
    tokens = rng.integers(0, 37, size=(2, 4)).astype("int32")
    model.build((2, 4))
    model(tokens, training=True)
    assert float(model.losses[0]) == 0.0  # only empty slots have left the memory
    model(tokens, training=True)
    model(tokens, training=True)  # 4 states compressed: a positive loss
    assert len(model.losses) == 1 and float(model.losses[0]) > 0


def test_generate_with_memory_equals_greedy_over_the_whole_text():
    # Memory >= prompt + new tokens: decoding one token per step after the memory
    # is attention over the whole text.
    model = tiny(memory_length=16)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    generated = model.generate(prompts, max_new_tokens=6)
    for row, prompt in zip(generated, prompts):
        tokens = list(prompt)
        for _ in range(6):
            tokens.append(int(np.argmax(np.asarray(model(np.array([tokens], "int32")))[0, -1])))
        assert list(row[: len(tokens)]) == tokens
    # Past its memory, generation continues (the memory slides); beam search
    # reorders the memory with its rows.
    assert model.generate([[1, 2]], max_new_tokens=30, jit_compile=False).shape == (1, 32)
    assert model.generate([[1, 2]], max_new_tokens=4, beam_size=2, jit_compile=False).shape == (1, 6)


def test_keras_save_load_keeps_weights_and_memory(tmp_path):
    model = tiny(memory_length=6, residual="gru", max_span=8)
    tokens = rng.integers(0, 37, size=(2, 4)).astype("int32")
    model.build((2, 4))
    model(tokens, training=True)
    path = str(tmp_path / "xl.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, TransformerXLLM)
    np.testing.assert_allclose(loaded(tokens), model(tokens), atol=1e-6)
    np.testing.assert_allclose(loaded(tokens, training=True), model(tokens, training=True), atol=1e-6)
    np.testing.assert_array_equal(
        loaded.generate([[1, 2]], 4, jit_compile=False), model.generate([[1, 2]], 4, jit_compile=False)
    )
    assert keras.ops.convert_to_numpy(loaded.spans()).shape == (2, 2)


def test_bad_input():
    model = tiny(memory_length=4)
    tokens = rng.integers(0, 37, size=(2, 4)).astype("int32")
    model.build((2, 4))
    with pytest.raises(ValueError, match=r"holds 2 rows.*Received: token_ids.shape=\(3, 4\)"):
        model(rng.integers(0, 37, size=(3, 4)).astype("int32"), training=True)
    with pytest.raises(ValueError, match=r"Received: memory.shape=\(3, 4, 16\)"):
        model.call_with_cache(tokens, model.init_cache(3))
    wide = tiny(memory_length=4, hidden_dim=8)
    with pytest.raises(ValueError, match=r"width=16\).*Received: memory.shape=\(2, 4, 8\)"):
        model.call_with_cache(tokens, wide.init_cache(2))
    with pytest.raises(ValueError, match="Received: compression_rate=0"):
        tiny(compressed_memory_length=4, compression_rate=0)
    with pytest.raises(ValueError, match="Received: memory_length=-2"):
        tiny(memory_length=-2)
    with pytest.raises(ValueError, match="Received: max_span=-8"):
        tiny(max_span=-8)
    with pytest.raises(ValueError, match="Received: name='xl_huge'"):
        TransformerXLLM.from_preset("xl_huge", vocabulary_size=10)
