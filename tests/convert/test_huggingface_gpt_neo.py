import json
import os
import shutil

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from shared_data import ROOT

from keras_tfam.layers.attention.patterns import SlidingWindow
from keras_tfam.models import GPT2LM

FIXTURE = os.path.join(ROOT, "fixtures", "hf-gpt-neo-tiny")
pytestmark = pytest.mark.skipif(not os.path.isdir(FIXTURE), reason="../shared fixtures not present")


@pytest.fixture(scope="module")
def reference():
    return np.load(os.path.join(FIXTURE, "reference.npz"))


@pytest.fixture(scope="module")
def model():
    return GPT2LM.from_huggingface(FIXTURE)


def _copy(tmp_path, transform=lambda tensors: tensors, config=lambda config: config):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    with open(os.path.join(FIXTURE, "config.json")) as f:
        (directory / "config.json").write_text(json.dumps(config(json.load(f))))
    save_file(transform(load_file(os.path.join(FIXTURE, "model.safetensors"))), str(directory / "model.safetensors"))
    return str(directory)


def test_logits_and_greedy_tokens_match_transformers(model, reference):
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(reference["input_ids"])), reference["logits"], atol=1e-4
    )
    generated = model.generate(reference["prompt_ids"], max_new_tokens=24)
    np.testing.assert_array_equal(generated, reference["greedy_ids"])


def test_architecture_global_and_local_layers_unscaled_unbiased_qkv(model):
    attention = [block.self_attention_layer for block in model.transformer_blocks]
    assert [layer.pattern for layer in attention] == [None, SlidingWindow(8)]
    assert all(layer.scale == 1.0 and not layer.qkv_bias and layer.output_dense.use_bias for layer in attention)
    # As many parameters as the checkpoint holds (the tied head counted once).
    tensors = load_file(os.path.join(FIXTURE, "model.safetensors"))
    assert model.count_params() == sum(value.size for value in tensors.values())
    # Generation keeps a full cache for the global layer and a ring of 8 slots for the local one.
    assert [tuple(cache.shape)[2] for cache in model.init_cache(1, 29)] == [29, 8]


def test_the_window_matters(reference):
    # Ignoring the local window changes the logits past position 8 (and only there).
    dense = GPT2LM.from_huggingface(FIXTURE, local_window=None)
    logits = keras.ops.convert_to_numpy(dense(reference["input_ids"]))
    np.testing.assert_allclose(logits[:, :8], reference["logits"][:, :8], atol=1e-4)
    assert np.abs(logits[:, 8:] - reference["logits"][:, 8:]).max() > 1e-2


def test_original_layout_with_buffers_and_all_local_layers(tmp_path, reference):
    def old_layout(tensors):
        out = {k.removeprefix("transformer."): v for k, v in tensors.items()}
        for i in range(2):
            out[f"h.{i}.attn.attention.bias"] = np.tril(np.ones((1, 1, 64, 64), bool)).astype("float32")
            out[f"h.{i}.attn.attention.masked_bias"] = np.array(-1e9, "float32")
        out["lm_head.weight"] = out["wte.weight"].copy()
        return out

    def types_only(config):
        config = {k: v for k, v in config.items() if k != "attention_layers"}
        config["attention_types"] = [[["local"], 2]]
        return config

    model = GPT2LM.from_huggingface(_copy(tmp_path, old_layout, types_only))
    assert model.local_layers == "all"
    assert np.isfinite(keras.ops.convert_to_numpy(model(reference["input_ids"]))).all()


def test_bad_checkpoints(tmp_path):
    def sparse(config):
        return {**config, "attention_layers": ["global", "sparse"]}

    with pytest.raises(ValueError, match=r"Received: attention_layers=\['global', 'sparse'\]"):
        GPT2LM.from_huggingface(_copy(tmp_path, config=sparse))
    shutil.rmtree(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="Received: model_type='gpt_neox'"):
        GPT2LM.from_huggingface(_copy(tmp_path, config=lambda config: {**config, "model_type": "gpt_neox"}))
    shutil.rmtree(tmp_path / "ckpt")

    def missing(tensors):
        tensors.pop("transformer.h.1.attn.attention.k_proj.weight")
        return tensors

    with pytest.raises(ValueError, match=r"Missing: \['h.1.attn.attention.k_proj.weight'\]"):
        GPT2LM.from_huggingface(_copy(tmp_path, missing))
