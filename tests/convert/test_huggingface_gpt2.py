import json
import os
import re
import shutil

import keras
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from keras_tfam.models import GPT2LM

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "fixtures", "hf-gpt2-tiny")
pytestmark = pytest.mark.skipif(not os.path.isdir(FIXTURE), reason="../shared fixtures not present")


@pytest.fixture(scope="module")
def reference():
    return np.load(os.path.join(FIXTURE, "reference.npz"))


def _copy(tmp_path, transform):
    directory = tmp_path / "ckpt"
    directory.mkdir()
    shutil.copy(os.path.join(FIXTURE, "config.json"), directory / "config.json")
    tensors = transform(load_file(os.path.join(FIXTURE, "model.safetensors")))
    save_file(tensors, str(directory / "model.safetensors"))
    return str(directory)


def test_logits_and_greedy_tokens_match_transformers(reference):
    model = GPT2LM.from_huggingface(FIXTURE)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(reference["input_ids"])), reference["logits"], atol=1e-4
    )
    generated = model.generate(reference["prompt_ids"], max_new_tokens=16)
    np.testing.assert_array_equal(generated, reference["greedy_ids"])


def test_original_hub_layout_with_buffers_and_tied_head(tmp_path, reference):
    def hub_layout(tensors):
        out = {k.removeprefix("transformer."): v for k, v in tensors.items()}
        for i in range(2):
            out[f"h.{i}.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), "float32"))
            out[f"h.{i}.attn.masked_bias"] = np.array(-1e4, "float32")
        out["lm_head.weight"] = out["wte.weight"].copy()
        return out

    model = GPT2LM.from_huggingface(_copy(tmp_path, hub_layout))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(reference["input_ids"])), reference["logits"], atol=1e-4
    )


def test_missing_and_unknown_tensors_are_listed(tmp_path):
    def broken(tensors):
        tensors.pop("transformer.h.1.mlp.c_fc.bias")
        tensors["transformer.h.0.attn.rotary"] = np.zeros(3, "float32")
        return tensors

    with pytest.raises(ValueError, match=r"Missing: \['h.1.mlp.c_fc.bias'\]. Unexpected: \['h.0.attn.rotary'\]"):
        GPT2LM.from_huggingface(_copy(tmp_path, broken))


def test_shape_mismatch_names_the_tensor(tmp_path):
    def broken(tensors):
        tensors["transformer.ln_f.weight"] = np.ones(31, "float32")
        return tensors

    # The tensor as the file names it, and the file.
    with pytest.raises(
        ValueError, match=r"'transformer\.ln_f\.weight' in .*model\.safetensors: .*expects \(32,\).*has \(31,\)"
    ):
        GPT2LM.from_huggingface(_copy(tmp_path, broken))


def test_untied_head_and_missing_files(tmp_path):
    def untied(tensors):
        tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + 1
        return tensors

    with pytest.raises(ValueError, match="lm_head.weight differs from wte.weight"):
        GPT2LM.from_huggingface(_copy(tmp_path, untied))
    with pytest.raises(FileNotFoundError, match="No config.json"):
        GPT2LM.from_huggingface(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(FileNotFoundError, match="No model.safetensors"):
        GPT2LM.from_huggingface(str(tmp_path))


def test_damaged_files_are_named(tmp_path):
    # Item 8: a corrupt model.safetensors or config.json raised the raw library error, without the path.
    directory = _copy(tmp_path, lambda tensors: tensors)
    config = os.path.join(directory, "config.json")
    with open(config) as f:
        text = f.read()
    with open(config, "w") as f:
        f.write(text[: len(text) // 2])
    with pytest.raises(ValueError, match=re.escape(config) + r" is not valid JSON \(.*bytes\)"):
        GPT2LM.from_huggingface(directory)
    with open(config, "w") as f:
        json.dump({k: v for k, v in json.loads(text).items() if k != "n_layer"}, f)
    with pytest.raises(ValueError, match=re.escape(config) + r" lacks the GPT-2 config key\(s\) \['n_layer'\]"):
        GPT2LM.from_huggingface(directory)
    with open(config, "w") as f:
        f.write(text)
    weights = os.path.join(directory, "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    with pytest.raises(ValueError, match=re.escape(weights) + " cannot be read as safetensors .*download complete"):
        GPT2LM.from_huggingface(directory)


def test_a_sharded_gpt2_checkpoint_loads_as_the_single_file(tmp_path):
    # transformers writes shards with an index past `max_shard_size`; the loader reads either.
    single = GPT2LM.from_huggingface(FIXTURE)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(os.path.join(FIXTURE, "config.json"), sharded / "config.json")
    tensors = load_file(os.path.join(FIXTURE, "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({name: tensors[name] for name in part}, str(sharded / file))
    index = {"metadata": {}, "weight_map": {name: file for file, part in halves.items() for name in part}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = GPT2LM.from_huggingface(str(sharded))
    for a, b in zip(single.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
