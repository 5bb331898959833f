"""Llama-family checkpoints written by transformers (tests/fixtures, scripts/make_llama_fixtures.py) load with
exact parity: logits, greedy tokens (cached decoding, sliding windows, rope scaling) and tokenizer ids."""

import json
import math
import os
import re
import shutil

import keras
import ml_dtypes
import numpy as np
import pytest

from keras_tfam.convert import HuggingFaceTokenizer, SafetensorsCheckpoint
from keras_tfam.models import GPT2LM, DecoderLM, from_huggingface

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")
FAMILIES = ("hf-llama-tiny", "hf-mistral-tiny", "hf-qwen2-tiny", "hf-gemma-tiny")


def fixture(name):
    return os.path.join(FIXTURES, name)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    directory = fixture(request.param)
    return request.param, from_huggingface(directory), np.load(os.path.join(directory, "reference.npz"))


def test_logits_and_twenty_greedy_tokens_match_transformers(family):
    name, model, reference = family
    assert isinstance(model, DecoderLM) and not isinstance(model, GPT2LM)
    assert np.std(reference["logits"]) > 0.05, "a reference this flat would hide mistakes"
    logits = keras.ops.convert_to_numpy(model(reference["input_ids"]))
    np.testing.assert_allclose(logits, reference["logits"], atol=1e-4, rtol=0)
    generated = model.generate(reference["prompt_ids"], max_new_tokens=20)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(generated), reference["greedy_ids"])


def test_each_fixture_exercises_its_family_s_conventions(family):
    name, model, _ = family
    config = model.get_config()
    scaling = config["position_options"].get("scaling", {}).get("type")
    expected = {
        "hf-llama-tiny": dict(tie_embeddings=False, num_key_value_heads=2, scaling="llama3"),
        "hf-mistral-tiny": dict(tie_embeddings=False, local_window=4, local_layers="all", scaling="linear"),
        "hf-qwen2-tiny": dict(tie_embeddings=True, attention_options={"qkv_bias": True}, scaling="yarn"),
        "hf-gemma-tiny": dict(norm="gemma_rms", activation="geglu_tanh", head_dim=24, scaling="dynamic"),
    }[name]
    assert scaling == expected.pop("scaling")
    assert {key: config[key] for key in expected} == expected
    if name == "hf-gemma-tiny":
        assert config["embedding_scale"] == pytest.approx(math.sqrt(32))
        assert config["head_dim"] * config["num_heads"] != config["hidden_dim"]


@pytest.mark.parametrize("name", FAMILIES)
def test_tokenizer_ids_equal_transformers_on_wikitext_lines(name):
    directory = fixture(name)
    reference = np.load(os.path.join(directory, "reference.npz"))
    with open(os.path.join(directory, "texts.json"), encoding="utf-8") as f:
        texts = json.load(f)
    assert any(not text.isascii() for text in texts) and any(char.isdigit() for text in texts for char in text)
    expected = np.split(reference["text_ids"], np.cumsum(reference["text_lengths"])[:-1])
    tokenizer = HuggingFaceTokenizer(directory)
    for text, ids in zip(texts, expected):
        assert tokenizer.encode(text) == ids.tolist(), text
    # Round trip of the text (byte fallback and byte-level BPE lose nothing).
    assert tokenizer.decode(tokenizer.encode(texts[3])) == texts[3]


def test_a_bfloat16_checkpoint_stays_bfloat16_bit_for_bit():
    directory = fixture("hf-qwen2-tiny")
    model = from_huggingface(directory, dtype="bfloat16")
    stored = SafetensorsCheckpoint(directory).tensor("model.embed_tokens.weight")
    assert stored.dtype == ml_dtypes.bfloat16
    embeddings = keras.ops.convert_to_numpy(keras.ops.cast(model.token_embedding.embeddings, "float32"))
    np.testing.assert_array_equal(embeddings, stored.astype(np.float32))
    assert keras.backend.standardize_dtype(model.token_embedding.embeddings.dtype) == "bfloat16"


def test_a_sharded_checkpoint_is_read_shard_by_shard():
    checkpoint = SafetensorsCheckpoint(fixture("hf-llama-tiny"))
    files = {checkpoint.file_of(name) for name in checkpoint.names()}
    assert len(files) > 2
    assert "lm_head.weight" in checkpoint.names()


def test_a_decoder_lm_with_every_option_saves_and_loads(tmp_path):
    model = from_huggingface(fixture("hf-gemma-tiny"))
    path = str(tmp_path / "gemma.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    ids = np.arange(12).reshape(2, 6) % 50
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(loaded(ids)), keras.ops.convert_to_numpy(model(ids)))


def _copy(tmp_path, name):
    directory = tmp_path / name
    shutil.copytree(fixture(name), directory)
    return directory


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def test_unsupported_model_types_and_rope_scalings_are_named_with_the_supported_ones(tmp_path):
    directory = _copy(tmp_path, "hf-mistral-tiny")
    _edit_config(directory, model_type="mixtral")
    with pytest.raises(
        ValueError, match=r"supported model types are \('gpt2', 'gpt_neo', 'llama'.*model_type='mixtral'"
    ):
        from_huggingface(str(directory))
    _edit_config(directory, model_type="mistral", rope_parameters={"rope_type": "longrope", "rope_theta": 1e4})
    with pytest.raises(
        ValueError, match=r"supported types are \('default', 'linear', 'dynamic', 'llama3', 'yarn'\).*'longrope'"
    ):
        from_huggingface(str(directory))


def test_a_missing_shard_and_a_wrong_shape_name_the_file_and_the_tensor(tmp_path):
    directory = _copy(tmp_path, "hf-llama-tiny")
    shard = sorted(directory.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=shard.name):
        from_huggingface(str(directory))
    directory = _copy(tmp_path / "second", "hf-llama-tiny")
    _edit_config(directory, intermediate_size=40)
    with pytest.raises(ValueError, match=r"Shape mismatch for tensor 'model\.layers\.\d\.mlp\.\w+_proj\.weight'"):
        from_huggingface(str(directory))


def test_a_config_without_model_type_says_so_with_the_supported_ones(tmp_path):
    directory = _copy(tmp_path, "hf-llama-tiny")
    config = json.loads((directory / "config.json").read_text())
    del config["model_type"]
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json has no `model_type`: .* \('gpt2', 'gpt_neo', 'llama'"):
        from_huggingface(str(directory))


def test_a_nan_in_a_shard_is_refused_naming_the_file_and_the_tensor(tmp_path):
    # A shard whose last bytes are 0xff: the last float32 of its last tensor reads as NaN.
    directory = _copy(tmp_path, "hf-llama-tiny")
    shard = sorted(directory.glob("model-*.safetensors"))[-1]
    with open(shard, "r+b") as f:
        f.seek(-4, os.SEEK_END)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(ValueError, match=rf"Tensor '[\w.]+' in {re.escape(str(shard))} holds 1 NaN or infinite"):
        from_huggingface(str(directory))
