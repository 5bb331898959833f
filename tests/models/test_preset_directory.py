"""save_to_preset / from_preset: a trained model round-trips through a local preset directory with its
tokenizer and config (quantized and LoRA-tuned ones too), as keras-hub shares presets."""

import os

import keras
import numpy as np
import pytest

from keras_tfam.convert import HuggingFaceTokenizer
from keras_tfam.models import GPT2LM, DecoderLM, TransformerXLLM, from_huggingface, load_preset

LLAMA = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf-llama-tiny")


def logits(model, ids):
    return keras.ops.convert_to_numpy(model(ids))


def test_an_imported_model_and_its_tokenizer_round_trip(tmp_path):
    model = from_huggingface(LLAMA)
    tokenizer = HuggingFaceTokenizer(LLAMA)
    ids = np.array([tokenizer.encode("The game began development in 2010 .")])
    model.save_to_preset(str(tmp_path / "llama"), tokenizer=tokenizer)
    loaded = DecoderLM.from_preset(str(tmp_path / "llama"))
    assert type(loaded) is DecoderLM
    np.testing.assert_array_equal(logits(loaded, ids), logits(model, ids))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded.generate(ids, max_new_tokens=6)),
        keras.ops.convert_to_numpy(model.generate(ids, max_new_tokens=6)),
    )
    assert HuggingFaceTokenizer(str(tmp_path / "llama")).encode("Ünïcode 1,234 ") == tokenizer.encode("Ünïcode 1,234 ")


def test_a_trained_lora_model_saves_merged_and_loads_equal(tmp_path):
    model = GPT2LM.from_preset("gpt2_tiny", vocabulary_size=64, num_layers=1, hidden_dim=32, num_heads=2)
    model.enable_lora(2)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).integers(0, 64, (8, 9))
    model.fit(x[:, :-1], x[:, 1:], epochs=2, verbose=0)
    model.save_to_preset(str(tmp_path / "lora"))
    loaded = load_preset(str(tmp_path / "lora"))
    np.testing.assert_allclose(logits(loaded, x), logits(model, x), atol=1e-5)


def test_a_quantized_model_keeps_its_quantized_weights(tmp_path):
    model = GPT2LM.from_preset("gpt2_tiny", vocabulary_size=64, num_layers=1, hidden_dim=32, num_heads=2)
    model.quantize("int8")
    x = np.arange(16).reshape(2, 8)
    model.save_to_preset(str(tmp_path / "int8"))
    loaded = GPT2LM.from_preset(str(tmp_path / "int8"))
    np.testing.assert_array_equal(logits(loaded, x), logits(model, x))
    assert loaded.transformer_blocks[0].feed_forward.output_dense.quantization_mode == "int8"


def test_other_models_and_the_errors(tmp_path):
    model = TransformerXLLM.from_preset("transformer_xl_tiny", vocabulary_size=50)
    x = np.arange(12).reshape(2, 6)
    model(x)
    model.save_to_preset(str(tmp_path / "txl"))
    with pytest.raises(ValueError, match="holds a TransformerXLLM, not a GPT2LM"):
        GPT2LM.from_preset(str(tmp_path / "txl"))
    with pytest.raises(ValueError, match=r"takes no overrides\. Received: \['dropout'\]"):
        TransformerXLLM.from_preset(str(tmp_path / "txl"), dropout=0.1)
    with pytest.raises(FileNotFoundError, match="No metadata.json in"):
        load_preset(str(tmp_path))
    with pytest.raises(ValueError, match="must have a save_to_preset"):
        model.save_to_preset(str(tmp_path / "x"), tokenizer="gpt2")
