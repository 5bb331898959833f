"""`save_to_huggingface` is the inverse of the importers: each checkpoint transformers wrote (tests/fixtures,
../shared/fixtures) imported and exported again gives the same tensors bit for bit, a config the importer reads
as the fixture's, the reference logits and tokens, and shards in transformers' index format."""

import json
import os
import re

import keras
import numpy as np
import pytest
from safetensors import safe_open
from shared_data import ROOT

from keras_tfam.convert import HuggingFaceTokenizer
from keras_tfam.convert.huggingface_gpt2 import huggingface_gpt2_arguments
from keras_tfam.convert.huggingface_gpt_neo import huggingface_gpt_neo_arguments
from keras_tfam.convert.huggingface_llama import huggingface_llama_arguments
from keras_tfam.models import GPT2LM, DecoderLM, from_huggingface
from keras_tfam.models.lora import sublayers

FIXTURES = {
    "hf-gpt2-tiny": os.path.join(ROOT, "fixtures", "hf-gpt2-tiny"),
    "hf-gpt-neo-tiny": os.path.join(ROOT, "fixtures", "hf-gpt-neo-tiny"),
    **{
        name: os.path.join(os.path.dirname(__file__), "..", "fixtures", name)
        for name in ("hf-llama-tiny", "hf-mistral-tiny", "hf-qwen2-tiny", "hf-gemma-tiny")
    },
}
# The config keys each importer reads.
READ_KEYS = {
    "gpt2": ("vocab_size", "n_layer", "n_head", "n_embd", "n_inner", "n_positions", "activation_function"),
    "gpt_neo": ("vocab_size", "num_layers", "num_heads", "hidden_size", "intermediate_size", "window_size"),
    "llama": ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"),
}
LLAMA_KEYS = (
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_parameters",
)


def read_json(directory, name):
    with open(os.path.join(directory, name), encoding="utf-8") as f:
        return json.load(f)


def stored_tensors(directory):
    """`{name: (dtype, shape, bytes)}` of every safetensors file in `directory`, read by the safetensors library."""
    import torch

    found = {}
    for file in sorted(name for name in os.listdir(directory) if name.endswith(".safetensors")):
        with safe_open(os.path.join(directory, file), framework="pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name).contiguous()
                found[name] = (str(tensor.dtype), tuple(tensor.shape), tensor.view(torch.uint8).numpy().tobytes())
    return found


@pytest.fixture(scope="module", params=sorted(FIXTURES))
def exported(request, tmp_path_factory):
    directory = FIXTURES[request.param]
    if not os.path.isdir(directory):
        pytest.skip(f"{directory} not present")
    config = read_json(directory, "config.json")
    model = from_huggingface(directory)
    tokenizer = HuggingFaceTokenizer(directory) if os.path.isfile(os.path.join(directory, "tokenizer.json")) else None
    out = str(tmp_path_factory.mktemp(request.param))
    written = model.save_to_huggingface(out, tokenizer=tokenizer, dtype=config["dtype"])
    return directory, config, model, out, written


def test_every_tensor_is_written_under_its_name_dtype_and_shape_bit_for_bit(exported):
    directory, config, _, out, written = exported
    expected, found = stored_tensors(directory), stored_tensors(out)
    if config.get("tie_word_embeddings", True):
        expected.pop("lm_head.weight", None)  # transformers writes no tied head
        assert "lm_head.weight" not in found
    assert sorted(found) == sorted(expected)
    for name in expected:
        assert found[name] == expected[name], name
    assert {"config.json", "generation_config.json", "model.safetensors"} <= set(written)


def test_the_config_reads_as_the_fixture_s(exported):
    directory, config, _, out, _ = exported
    written = read_json(out, "config.json")
    model_type = config["model_type"]
    for key in ("model_type", "architectures", "dtype", "tie_word_embeddings"):
        assert written[key] == config.get(key, True), key
    family = model_type if model_type in READ_KEYS else "llama"
    keys = READ_KEYS[family] + (LLAMA_KEYS if family == "llama" else ())
    assert {key: written.get(key) for key in keys if key in config} == {
        key: config[key] for key in keys if key in config
    }
    path = os.path.join(out, "config.json")
    if family == "gpt2":
        assert huggingface_gpt2_arguments(written) == huggingface_gpt2_arguments(config)
    elif family == "gpt_neo":
        assert written["attention_layers"] == config["attention_layers"]
        assert huggingface_gpt_neo_arguments(written) == huggingface_gpt_neo_arguments(config)
    else:
        for key in ("sliding_window", "attention_bias", "use_sliding_window"):
            assert written.get(key) == config.get(key), key
        assert huggingface_llama_arguments(written, model_type, path) == huggingface_llama_arguments(
            config, model_type, path
        )
    if os.path.isfile(os.path.join(directory, "tokenizer.json")):  # the ids of the tokens tokenizer_config names
        pipeline, names = read_json(directory, "tokenizer.json"), read_json(directory, "tokenizer_config.json")
        ids = {**pipeline["model"]["vocab"], **{token["content"]: token["id"] for token in pipeline["added_tokens"]}}
        expected = tuple(None if names.get(key) is None else ids[names[key]] for key in ("bos_token", "eos_token"))
        assert (written["bos_token_id"], written["eos_token_id"]) == expected
        generation = read_json(out, "generation_config.json")
        assert (generation.get("bos_token_id"), generation.get("eos_token_id")) == expected
        assert read_json(out, "tokenizer.json") == pipeline


def test_the_export_imports_to_transformers_logits_and_greedy_tokens(exported):
    directory, _, model, out, _ = exported
    reference = np.load(os.path.join(directory, "reference.npz"))
    back = from_huggingface(out)
    assert type(back) is type(model)
    assert {**back.get_config(), "name": None} == {**model.get_config(), "name": None}
    logits = keras.ops.convert_to_numpy(back(reference["input_ids"]))
    np.testing.assert_allclose(logits, reference["logits"], atol=1e-4, rtol=0)
    np.testing.assert_array_equal(logits, keras.ops.convert_to_numpy(model(reference["input_ids"])))
    new_tokens = reference["greedy_ids"].shape[1] - reference["prompt_ids"].shape[1]
    generated = back.generate(reference["prompt_ids"], max_new_tokens=new_tokens)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(generated), reference["greedy_ids"])


def test_shards_follow_transformers_index_format_and_import_equal(tmp_path):
    directory = FIXTURES["hf-llama-tiny"]
    model = from_huggingface(directory)
    limit = 40_000  # within the sizes transformers split this fixture at: the same shards
    written = model.save_to_huggingface(str(tmp_path), max_shard_size=limit)
    index = read_json(tmp_path, "model.safetensors.index.json")
    fixture_index = read_json(directory, "model.safetensors.index.json")
    assert set(index) == set(fixture_index) and set(index["metadata"]) == set(fixture_index["metadata"])
    shards = sorted(name for name in written if name.endswith(".safetensors"))
    assert len(shards) > 2 and "model.safetensors" not in written
    assert all(re.fullmatch(rf"model-\d{{5}}-of-{len(shards):05d}\.safetensors", name) for name in shards)
    assert sorted(set(index["weight_map"].values())) == shards
    total = 0
    for shard in shards:
        with safe_open(str(tmp_path / shard), framework="np") as f:
            names = list(f.keys())
            sizes = [f.get_tensor(name).nbytes for name in names]
        assert sorted(names) == sorted(name for name, file in index["weight_map"].items() if file == shard)
        assert sum(sizes) <= limit or len(names) == 1, shard
        total += sum(sizes)
    assert index["metadata"]["total_size"] == total == fixture_index["metadata"]["total_size"]
    assert index["weight_map"] == fixture_index["weight_map"]  # in transformers' order, split where it splits
    back = from_huggingface(str(tmp_path))
    ids = np.arange(2 * 9).reshape(2, 9) % model.vocabulary_size
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(back(ids)), keras.ops.convert_to_numpy(model(ids)))
    # One file again in the same directory: the shards and the index of the earlier export are gone.
    assert model.save_to_huggingface(str(tmp_path)) == ["config.json", "generation_config.json", "model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["config.json", "generation_config.json", "model.safetensors"]


def _perturbed_gpt2(seed=0, **options):
    keras.utils.set_random_seed(seed)
    model = GPT2LM(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=32, **options)
    rng = np.random.default_rng(seed)
    for variable in model.weights:  # norms and biases away from their ones and zeros
        if re.search(r"(gamma|beta|bias)$", variable.path):
            variable.assign(rng.normal(0.5, 0.2, variable.shape).astype("float32"))
    return model


def test_a_gpt2_built_from_scratch_round_trips_bit_for_bit(tmp_path):
    model = _perturbed_gpt2(intermediate_dim=40, activation="gelu", norm_epsilon=1e-6, dropout=0.1)
    model.save_to_huggingface(str(tmp_path))
    config = read_json(tmp_path, "config.json")
    assert (config["n_inner"], config["activation_function"], config["resid_pdrop"]) == (40, "gelu", 0.1)
    with safe_open(str(tmp_path / "model.safetensors"), framework="np") as f:
        # GPT-2's Conv1D: the fused q/k/v kernel [in, 3 * out], columns in q, k, v order.
        attention = model.transformer_blocks[0].self_attention_layer
        fused = np.concatenate(
            [
                keras.ops.convert_to_numpy(d.kernel)
                for d in (attention.query_dense, attention.key_dense, attention.value_dense)
            ],
            axis=-1,
        )
        np.testing.assert_array_equal(f.get_tensor("transformer.h.0.attn.c_attn.weight"), fused)
        assert "lm_head.weight" not in f.keys()
    back = from_huggingface(str(tmp_path))
    assert isinstance(back, GPT2LM) and back.dropout == 0.0  # the importer builds for inference
    for ours, theirs in zip(model.weights, back.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(theirs))
    ids = np.random.default_rng(1).integers(0, 50, size=(2, 9))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(back(ids)), keras.ops.convert_to_numpy(model(ids)))


@pytest.mark.skipif(
    keras.backend.backend() == "torch", reason="enable_lora finds no layer on torch (test_quantization_and_lora too)"
)
def test_lora_factors_are_merged_into_the_written_kernels_not_into_the_model(tmp_path):
    model = _perturbed_gpt2()
    query = model.transformer_blocks[0].self_attention_layer.query_dense
    kernel = keras.ops.convert_to_numpy(query.kernel)
    model.enable_lora(2, target=("query", "value"))
    rng = np.random.default_rng(2)
    adapted = [layer for layer in sublayers(model) if getattr(layer, "lora_enabled", False)]
    for layer in adapted:
        layer.lora_kernel_b.assign(rng.normal(0, 0.1, layer.lora_kernel_b.shape).astype("float32"))
    ids = rng.integers(0, 50, size=(2, 9))
    expected = keras.ops.convert_to_numpy(model(ids))
    model.save_to_huggingface(str(tmp_path))
    merged = kernel + (query.lora_alpha / query.lora_rank) * (
        keras.ops.convert_to_numpy(query.lora_kernel_a) @ keras.ops.convert_to_numpy(query.lora_kernel_b)
    )
    with safe_open(str(tmp_path / "model.safetensors"), framework="np") as f:
        np.testing.assert_allclose(f.get_tensor("transformer.h.0.attn.c_attn.weight")[:, :16], merged, atol=1e-6)
    assert all(layer.lora_enabled for layer in adapted)
    back = from_huggingface(str(tmp_path))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(back(ids)), expected, atol=1e-5, rtol=0)


def _one_line_refusal(call, pattern):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and re.search(pattern, message), message


def test_what_cannot_be_written_is_refused_in_one_line(tmp_path):
    model = _perturbed_gpt2()
    out = str(tmp_path / "out")
    _one_line_refusal(lambda: model.save_to_huggingface(out, max_shard_size="5 parsecs"), r"max_shard_size='5 parsecs'")
    _one_line_refusal(lambda: model.save_to_huggingface(out, dtype="int8"), r"dtype='int8'")
    _one_line_refusal(lambda: model.save_to_huggingface(out, tokenizer=object()), r"tokenizer of type object")
    quantized = _perturbed_gpt2()
    quantized.quantize("int8")
    _one_line_refusal(lambda: quantized.save_to_huggingface(out), r"quantized weights.*before quantize\(")
    partly = _perturbed_gpt2()
    partly.transformer_blocks[1].feed_forward.output_dense.quantize("int8")
    _one_line_refusal(lambda: partly.save_to_huggingface(out), r"1 variable\(s\), e.g. .*output.*of dtype int8")
    small = dict(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=32)
    for options, pattern in (
        (dict(norm="rms"), r"`norm` must be one of \('layer',\).*Received: norm='rms'"),
        (dict(local_window=4), r"Received: local_window=4"),
        (dict(position="alibi"), r"`position` must be one of \('rotary',\).*Received: position='alibi'"),
        (dict(position="rotary", norm="rms", use_bias=False, activation="swiglu"), r"pairing='half'"),
        (
            dict(
                position="rotary", position_options={"pairing": "half"}, norm="rms", use_bias=False, activation="relu"
            ),
            r"Received: activation='relu'",
        ),
    ):
        _one_line_refusal(lambda: DecoderLM(**small, **options).save_to_huggingface(out), pattern)
    assert not os.path.exists(out)  # nothing written before a refusal


def test_the_pipelines_bpe_tokenizer_is_written_as_gpt2_s_files(tmp_path):
    tokenizers = pytest.importorskip("pipelines.data.tokenizers")
    from tokenizers import ByteLevelBPETokenizer

    lines = ["The tower is 324 metres tall, about the same height as an 81-storey building."] * 8
    tokenizer = tokenizers.BPETokenizer.train(lines, vocabulary_size=300)
    model = GPT2LM(vocabulary_size=tokenizer.vocabulary_size, num_layers=1, num_heads=2, hidden_dim=8)
    written = model.save_to_huggingface(str(tmp_path), tokenizer=tokenizer)
    assert {"vocab.json", "merges.txt", "tokenizer_config.json"} <= set(written)
    config, tokenizer_config = read_json(tmp_path, "config.json"), read_json(tmp_path, "tokenizer_config.json")
    assert config["bos_token_id"] == config["eos_token_id"] == tokenizer.endoftext_id is not None
    assert tokenizer_config["tokenizer_class"] == "GPT2Tokenizer" and tokenizer_config["eos_token"] == "<|endoftext|>"
    # GPT2TokenizerFast's pipeline (byte-level BPE, no prefix space) over the written files gives the same ids.
    theirs = ByteLevelBPETokenizer(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt"), add_prefix_space=False)
    text = "The tower is 81 metres tall."
    ours = tokenizer.tokenize_prompt([text])
    assert theirs.encode(text).ids == (ours.to_list() if hasattr(ours, "to_list") else ours)[0]
