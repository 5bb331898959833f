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


def test_saving_again_over_a_preset_leaves_only_the_new_presets_files(tmp_path):
    directory = str(tmp_path / "preset")
    llama = from_huggingface(LLAMA)
    llama.save_to_preset(directory, tokenizer=HuggingFaceTokenizer(LLAMA))
    with open(os.path.join(directory, "README.md"), "w") as f:  # not a preset file: left alone
        f.write("notes")
    # The same directory's tokenizer, saved with the model again: its files stay.
    llama.save_to_preset(directory, tokenizer=HuggingFaceTokenizer(directory))
    assert HuggingFaceTokenizer(directory).encode("The game") == HuggingFaceTokenizer(LLAMA).encode("The game")
    small = GPT2LM(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=16)
    small(np.zeros((1, 4), "int32"))
    small.save_to_preset(directory)
    assert sorted(os.listdir(directory)) == ["README.md", "config.json", "metadata.json", "model.weights.h5"]
    with pytest.raises(FileNotFoundError, match="No tokenizer.json nor tokenizer.model"):
        HuggingFaceTokenizer(directory)
    x = np.arange(8).reshape(2, 4)
    np.testing.assert_array_equal(logits(load_preset(directory), x), logits(small, x))


def test_a_damaged_or_foreign_weights_file_is_named_in_one_line(tmp_path):
    model = GPT2LM(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=16)
    model(np.zeros((1, 4), "int32"))
    directory = str(tmp_path / "preset")
    model.save_to_preset(directory)
    weights = os.path.join(directory, "model.weights.h5")
    good = open(weights, "rb").read()
    other = GPT2LM(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=16)
    other(np.zeros((1, 4), "int32"))
    other.save_weights(str(tmp_path / "other.weights.h5"))
    truncated = (good[: len(good) // 2], r"cannot be loaded into the GPT2LM of config\.json")
    foreign = (open(tmp_path / "other.weights.h5", "rb").read(), r"holds 36 arrays, the GPT2LM of config\.json has 20")
    for damage, message in (truncated, foreign):
        with open(weights, "wb") as f:
            f.write(damage)
        with pytest.raises(ValueError, match=r"model\.weights\.h5 " + message) as error:
            load_preset(directory)
        assert "\n" not in str(error.value)
    # A NaN in a weight: the loaded model would generate one id forever.
    model.token_embedding.embeddings.assign(np.full((50, 16), np.nan, "float32"))
    model.save_to_preset(directory)
    with pytest.raises(ValueError, match=r"model\.weights\.h5 holds NaN or infinite values in token_embedding/"):
        load_preset(directory)


def test_a_path_loads_and_a_directory_that_is_no_preset_is_named(tmp_path):
    model = GPT2LM(vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=16)
    x = np.arange(8).reshape(2, 4)
    model(x)
    model.save_to_preset(tmp_path / "preset")  # a pathlib.Path, as for from_preset
    np.testing.assert_array_equal(logits(GPT2LM.from_preset(tmp_path / "preset"), x), logits(model, x))
    with pytest.raises(FileNotFoundError, match=r"No metadata.json in .*: not a preset directory"):
        GPT2LM.from_preset(LLAMA)  # a Hugging Face directory: from_huggingface reads it
    with pytest.raises(FileNotFoundError, match=r"No metadata.json in"):
        TransformerXLLM.from_preset(tmp_path)
