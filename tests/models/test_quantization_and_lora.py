"""Keras' quantization and LoRA on the library's models: the tied embedding and head included."""

import keras
import numpy as np
import pytest
from backend import greedy_by_full_passes, greedy_rows_by_full_passes

from keras_tfam.layers import TiedEmbedding
from keras_tfam.models import GPT2LM
from keras_tfam.models.lora import sublayers

TINY = dict(vocabulary_size=61, num_layers=2, num_heads=4, hidden_dim=32, max_sequence_length=48)
rng = np.random.default_rng(0)


def tiny():
    keras.utils.set_random_seed(1)
    return GPT2LM(**TINY)


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def test_int8_tied_embedding_follows_the_absmax_formula_both_ways():
    # Rows of E quantized symmetric per row: q = round(E * s), s = 127 / max|E_row|; the head quantizes
    # each hidden row the same way, multiplies in integers and divides by both scales.
    layer = TiedEmbedding(23, 16)
    layer.build()
    embeddings = np.asarray(layer.embeddings)
    layer.quantize("int8")
    assert layer.quantization_mode == "int8" and np.asarray(layer.embeddings).dtype == np.int8
    scale = 127.0 / np.abs(embeddings).max(axis=1)
    q = np.clip(np.round(embeddings * scale[:, None]), -127, 127)
    ids = rng.integers(0, 23, size=(2, 5))
    np.testing.assert_allclose(numpy(layer(ids)), q[ids] / scale[ids][..., None], rtol=1e-5)
    hidden = rng.normal(size=(2, 3, 16)).astype("float32")
    hidden_scale = 127.0 / np.abs(hidden).max(axis=-1, keepdims=True)
    hidden_q = np.clip(np.round(hidden * hidden_scale), -127, 127)
    expected = (hidden_q @ q.T) / (hidden_scale * scale)
    logits = numpy(layer(hidden, reverse=True))
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="Received: token id 23"):
        layer(np.array([[1, 23]]))


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_a_quantized_model_generates_saves_and_loads_with_its_quantized_weights(mode, tmp_path):
    model = tiny()
    tokens = rng.integers(0, 61, size=(2, 12)).astype("int32")
    float_logits = numpy(model(tokens))
    float_bytes = sum(v.numpy().nbytes for v in model.weights)
    # (A loop compiled before `quantize` is replaced: tests/generation/test_weight_changes.py.)
    model.quantize(mode)
    assert model.token_embedding.quantization_mode == mode
    assert np.asarray(model.token_embedding.embeddings).dtype == np.int8  # int4: two values a byte
    assert sum(v.numpy().nbytes for v in model.weights) < 0.4 * float_bytes
    logits = numpy(model(tokens))
    assert 0 < np.abs(logits - float_logits).max() < (0.05 if mode == "int8" else 0.5)
    prompts = [[5, 8, 11], [40, 43, 46, 49, 52]]
    generated = model.generate(prompts, max_new_tokens=6)
    for row, prompt, expected in zip(generated, prompts, greedy_rows_by_full_passes(model, prompts, 6)):
        assert list(row[: len(prompt) + 6]) == expected

    for round_trip in range(2):  # a loaded quantized model saves again
        path = tmp_path / f"model_{round_trip}.keras"
        model.save(path)
        model = keras.saving.load_model(path)
        assert model.token_embedding.quantization_mode == mode
        np.testing.assert_array_equal(numpy(model(tokens)), logits)
    np.testing.assert_array_equal(model.generate(prompts, max_new_tokens=6), generated)


def test_lora_trains_only_its_factors_and_saves_merged(tmp_path):
    model = tiny()
    tokens = rng.integers(0, 61, size=(16, 12)).astype("int32")
    before = numpy(model(tokens))
    frozen = {v.path: v.numpy() for v in model.weights}
    adapted = model.enable_lora(2)
    assert sorted(adapted) == [
        f"transformer_block_{i}/softmax_attention_{i}/{name}" for i in range(2) for name in ("query", "value")
    ]
    assert sorted(v.path for v in model.trainable_weights) == sorted(
        f"{path}/lora_kernel_{ab}" for path in adapted for ab in "ab"
    )
    np.testing.assert_array_equal(numpy(model(tokens)), before)  # B starts at zero

    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(tokens[:, :-1], tokens[:, 1:], batch_size=8, epochs=3, verbose=0)
    for v in model.weights:
        if v.path in frozen:
            np.testing.assert_array_equal(v.numpy(), frozen[v.path])
    tuned = numpy(model(tokens))
    assert np.abs(tuned - before).max() > 1e-3
    # W + (alpha / rank) A B, from the factors, is what the layer computes.
    query = model.transformer_blocks[0].self_attention_layer.query_dense
    merged = frozen[f"{query.path}/kernel"] + (query.lora_kernel_a.numpy() @ query.lora_kernel_b.numpy())
    np.testing.assert_allclose(numpy(query.kernel), merged, rtol=1e-6, atol=1e-7)

    prompt = [5, 8, 11]
    assert list(model.generate([prompt], max_new_tokens=5)[0]) == greedy_by_full_passes(model, prompt, 5)
    model.save(tmp_path / "tuned.keras")
    loaded = keras.saving.load_model(tmp_path / "tuned.keras")
    assert not any("lora" in v.path for v in loaded.weights)
    np.testing.assert_allclose(numpy(loaded(tokens)), tuned, rtol=1e-5, atol=1e-5)


def test_sublayers_finds_every_layer_that_owns_a_weight_once_through_lists_and_dicts():
    class Holder(keras.layers.Layer):
        def __init__(self, shared, **kwargs):
            super().__init__(**kwargs)
            self.by_name = {"a": keras.layers.Dense(2, name="a"), "pair": [keras.layers.Dense(2, name="b"), shared]}
            self.shared = shared

        def call(self, x):
            return self.shared(self.by_name["pair"][0](self.by_name["a"](x)))

    shared = keras.layers.Dense(2, name="shared")
    outer = Holder(Holder(shared, name="inner"), name="outer")
    outer(np.zeros((1, 2), "float32"))
    assert [layer.name for layer in sublayers(outer)] == ["a", "b", "inner", "a", "b", "shared"]
    model = tiny()
    model(np.zeros((1, 4), "int32"))
    found = sublayers(model)
    assert len({id(layer) for layer in found}) == len(found) and model not in found
    # Every weight's owner (its path without the variable's name) is found.
    owners = {v.path.rsplit("/", 1)[0] for v in model.weights}
    assert owners <= {layer.path for layer in found}, owners - {layer.path for layer in found}


def test_lora_refuses_a_bad_rank_or_target():
    model = tiny()
    with pytest.raises(ValueError, match="Received: rank=0"):
        model.enable_lora(0)
    with pytest.raises(ValueError, match=r"Received: target=\('qkv',\), no such layer: \['qkv'\]"):
        model.enable_lora(2, target="qkv")


def test_a_quantized_transformer_xl_saves_loads_and_saves_again(tmp_path):
    # Transformer-XL builds its layers in `build` (not a functional graph): a model rebuilt from a quantized
    # config must leave each layer its own policy there, or saving it again fails.
    from keras_tfam.models import TransformerXLLM

    model = TransformerXLLM(
        vocabulary_size=61,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        memory_length=4,
        context_length=6,
    )
    tokens = rng.integers(0, 61, size=(2, 6)).astype("int32")
    model(tokens)
    model.quantize("int8")
    logits = numpy(model(tokens))
    quantized = sorted(layer.path for layer in sublayers(model) if layer.quantization_mode == "int8")
    assert "token_embedding" in quantized and len(quantized) > 8
    for round_trip in range(2):
        path = tmp_path / f"txl_{round_trip}.keras"
        model.save(path)
        model = keras.saving.load_model(path)
        assert sorted(layer.path for layer in sublayers(model) if layer.quantization_mode == "int8") == quantized
        np.testing.assert_array_equal(numpy(model(tokens)), logits)


@pytest.mark.parametrize("order", ["lora_then_quantize", "quantize_then_lora"])
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_lora_and_quantization_reload_bit_for_bit_in_either_order(order, mode, tmp_path):
    # Keras merges the factors into the quantized weights and quantizes again when it saves: another model
    # (logits off by about 6e-3, argmaxes changed). The quantized weights and the factors are saved as they are.
    model = tiny()
    tokens = rng.integers(0, 61, size=(16, 12)).astype("int32")
    target = ("query", "value", "token_embedding")
    if order == "lora_then_quantize":
        model.enable_lora(2, target=target, alpha=3)
    model.quantize(mode)
    if order == "quantize_then_lora":
        model.enable_lora(2, target=target, alpha=3)
    model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(tokens[:, :-1], tokens[:, 1:], batch_size=8, epochs=2, verbose=0)
    query = model.transformer_blocks[0].self_attention_layer.query_dense
    assert np.abs(query.lora_kernel_b.numpy()).max() > 0  # the factors trained
    logits = numpy(model(tokens))
    for round_trip in range(2):  # a loaded model saves again
        path = tmp_path / f"model_{round_trip}.keras"
        model.save(path)
        model = keras.saving.load_model(path)
        np.testing.assert_array_equal(numpy(model(tokens)), logits)
        assert model.token_embedding.quantization_mode == mode and model.token_embedding.lora_enabled
    directory = str(tmp_path / "preset")
    model.save_to_preset(directory)
    np.testing.assert_array_equal(numpy(GPT2LM.from_preset(directory)(tokens)), logits)
