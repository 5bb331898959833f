"""Export to the Hugging Face format: the directory `transformers.AutoModelForCausalLM.from_pretrained` loads.

The inverse of `keras_tfam.convert.huggingface`: `config.json`, the weights
as `model.safetensors` (or shards `model-0000k-of-0000n.safetensors` with
`model.safetensors.index.json`, split as transformers splits them),
`generation_config.json`, and the tokenizer's files. Tensor names, layouts
and the tied head follow what transformers' `save_pretrained` writes (see
`keras_tfam.convert.huggingface_export_configs`); importing the directory
gives the same model back.

The safetensors format is an 8-byte little-endian header length, a JSON
header `{name: {"dtype", "shape", "data_offsets"}}` padded with spaces to 8
bytes, and the raw little-endian bytes; each tensor is computed and written
one at a time, so the export holds at most one tensor beside the model
(and a LoRA model its merged kernels).
"""

import json
import os
import re
import struct

import keras
import ml_dtypes
import numpy as np

from keras_tfam.convert.huggingface_export_configs import family_export
from keras_tfam.convert.huggingface_tokenizer import FILES as TOKENIZER_FILES
from keras_tfam.convert.safetensors_checkpoint import INDEX, SINGLE
from keras_tfam.convert.weight_transforms import stored_shape, stored_tensor
from keras_tfam.models.checkpoint_loaders import register_checkpoint_writer

DEFAULT_MAX_SHARD_SIZE = "5GB"  # as the method on the models documents it
# The dtypes a checkpoint is written in, with their safetensors names.
DTYPES = {"float32": ("F32", np.float32), "float16": ("F16", np.float16), "bfloat16": ("BF16", ml_dtypes.bfloat16)}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_SHARD = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
ENDOFTEXT = "<|endoftext|>"  # GPT-2's end of text: its BPE tokenizer's bos, eos and unk token


@register_checkpoint_writer("huggingface")
def save_to_huggingface(model, directory, tokenizer=None, max_shard_size=None, dtype=None):
    """Writes `model` as a Hugging Face checkpoint directory that transformers and `from_huggingface` load.

    Args:
        model: a `GPT2LM` (GPT-2, or GPT-Neo's attention) or a Llama-family
            `DecoderLM` (Llama, Mistral, Qwen2, Gemma conventions). LoRA
            factors are merged into the written kernels (as Keras saves them);
            a quantized model is refused.
        directory: the directory (created if needed); the weight files of an
            earlier export there are replaced.
        tokenizer: a `HuggingFaceTokenizer` (its files are copied), the GPT-2
            byte-level BPE tokenizer of the pipelines (anything whose
            `files()` holds `vocab.json` and `merges.txt`), or `None`. The
            config's `bos_token_id` and `eos_token_id` are the tokenizer's
            (none without one: the model does not know them).
        max_shard_size: bytes per safetensors file, an int or a string such
            as `"5GB"` or `"500MB"` (transformers' units); past it, shards and
            an index; `None` is `DEFAULT_MAX_SHARD_SIZE`.
        dtype: the dtype of the written weights, `"float32"`, `"float16"` or
            `"bfloat16"`; default the model's variables'.

    Returns:
        The names of the files written, sorted.
    """
    # Quantized layers hold integer or float8 weights (read from the weights: every backend lists them).
    quantized = [(v.path, _dtype_name(v)) for v in model.weights if _quantized(_dtype_name(v))]
    if quantized:
        raise ValueError(
            f"Cannot export quantized weights to Hugging Face ({len(quantized)} variable(s), e.g. {quantized[0][0]!r} "
            f"of dtype {quantized[0][1]}): export the model before quantize(...)"
        )
    limit = shard_size_bytes(DEFAULT_MAX_SHARD_SIZE if max_shard_size is None else max_shard_size)
    dtype = _check_dtype(model, dtype)
    config, tensors = family_export(model)
    bos, eos = _special_ids(tokenizer)
    config = {**config, "bos_token_id": bos, "eos_token_id": eos, "dtype": dtype, "use_cache": True}
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):  # an earlier export's weights, which the new ones replace
        if name in (SINGLE, INDEX) or _SHARD.match(name):
            os.remove(os.path.join(directory, name))
    written = write_safetensors_shards(directory, tensors, dtype, limit)
    _write_json(os.path.join(directory, "config.json"), config)
    generation = {"_from_model_config": True, "bos_token_id": bos, "eos_token_id": eos}
    _write_json(
        os.path.join(directory, "generation_config.json"), {k: v for k, v in generation.items() if v is not None}
    )
    written += ["config.json", "generation_config.json"]
    if tokenizer is not None:
        written += _write_tokenizer(tokenizer, directory, config)
    return sorted(set(written))


def shard_size_bytes(size):
    """Bytes of a `max_shard_size`: an int, or a string such as `"5GB"`, `"500MB"`, `"2GiB"`."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]I?B|B|)\s*", str(size).upper()) if isinstance(size, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(
            "`max_shard_size` must be a positive number of bytes or a string such as '5GB', '500MB' or '2GiB'. "
            f"Received: max_shard_size={size!r}"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def _quantized(dtype):
    return not dtype.startswith(("float", "bfloat")) or dtype.startswith("float8")


def _dtype_name(variable):
    return str(getattr(variable.dtype, "name", variable.dtype)).replace("torch.", "")


def _check_dtype(model, dtype):
    if dtype is None:
        dtype = _dtype_name(model.weights[0])
    if dtype not in DTYPES:
        raise ValueError(f"`dtype` must be one of {tuple(DTYPES)} (or None: the model's). Received: dtype={dtype!r}")
    return dtype


def _numpy(value):
    value = keras.ops.convert_to_numpy(value)
    return value.astype(np.float32) if value.dtype == ml_dtypes.bfloat16 else value


def shard_plan(sizes, limit):
    """`[[name, ...], ...]`: the tensors of each shard, as transformers (huggingface_hub) splits a state dict:
    in order, a new shard when the next tensor would pass `limit`, a tensor larger than `limit` in its own."""
    shards, current, current_size = [], [], 0
    for name, size in sizes.items():
        if size > limit:
            shards.append([name])
            continue
        if current and current_size + size > limit:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    if current:
        shards.append(current)
    return shards


def write_safetensors_shards(directory, tensors, dtype, limit):
    """Writes `{name: weight map entries}` as `model.safetensors`, or as shards and an index past `limit` bytes."""
    code, numpy_dtype = DTYPES[dtype]
    itemsize = np.dtype(numpy_dtype).itemsize
    shapes = {name: stored_shape(entries) for name, entries in tensors.items()}
    sizes = {name: int(np.prod(shape, dtype=np.int64)) * itemsize for name, shape in shapes.items()}
    shards = shard_plan(sizes, limit)
    files = (
        [SINGLE]
        if len(shards) == 1
        else [f"model-{k:05d}-of-{len(shards):05d}.safetensors" for k in range(1, len(shards) + 1)]
    )
    for file, names in zip(files, shards):
        _write_safetensors(
            os.path.join(directory, file),
            {name: shapes[name] for name in names},
            lambda name: stored_tensor(tensors[name], _numpy),
            code,
            numpy_dtype,
        )
    if len(shards) == 1:
        return files
    index = {
        "metadata": {
            "total_parameters": int(sum(np.prod(shape, dtype=np.int64) for shape in shapes.values())),
            "total_size": int(sum(sizes.values())),
        },
        "weight_map": {name: file for file, names in zip(files, shards) for name in sorted(names)},
    }
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    _write_json(os.path.join(directory, INDEX), index)
    return [*files, INDEX]


def _write_safetensors(path, shapes, read, code, numpy_dtype):
    """One safetensors file of the tensors `{name: shape}`, sorted by name, each from `read(name)`."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    itemsize = np.dtype(numpy_dtype).itemsize
    for name in sorted(shapes):
        size = int(np.prod(shapes[name], dtype=np.int64)) * itemsize
        header[name] = {"dtype": code, "shape": [int(d) for d in shapes[name]], "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(shapes):
            value = np.ascontiguousarray(read(name)).astype(numpy_dtype, copy=False)
            if tuple(value.shape) != tuple(shapes[name]):
                raise ValueError(f"Tensor {name!r} has shape {value.shape}, its weight map says {shapes[name]}")
            f.write(value.tobytes())  # little-endian on the hosts Keras runs on, as the reader assumes


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")


def _bpe_files(tokenizer):
    files = tokenizer.files() if callable(getattr(tokenizer, "files", None)) else {}
    return files if {"vocab.json", "merges.txt"} <= set(files) else None


def _special_ids(tokenizer):
    """`(bos, eos)` token ids of the tokenizer (`<|endoftext|>` for GPT-2's BPE), `None` where it has none; a
    `ValueError` for a tokenizer without a Hugging Face form."""
    if tokenizer is None:
        return None, None
    if _bpe_files(tokenizer) is not None:
        return getattr(tokenizer, "endoftext_id", None), getattr(tokenizer, "endoftext_id", None)
    if not callable(getattr(tokenizer, "save_to_preset", None)) or not callable(getattr(tokenizer, "to_json", None)):
        raise ValueError(
            "`tokenizer` must be a HuggingFaceTokenizer or a GPT-2 byte-level BPE tokenizer (files() with vocab.json "
            f"and merges.txt). Received: tokenizer of type {type(tokenizer).__name__}"
        )
    return getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "eos_token_id", None)


def _write_tokenizer(tokenizer, directory, config):
    """Writes the tokenizer's files for transformers' `AutoTokenizer`; their names."""
    source = getattr(tokenizer, "directory", None)
    if source is None or os.path.abspath(source) != os.path.abspath(directory):
        for name in (*TOKENIZER_FILES, "vocab.json", "merges.txt"):  # an earlier export's
            if os.path.isfile(os.path.join(directory, name)):
                os.remove(os.path.join(directory, name))
    files = _bpe_files(tokenizer)
    if files is not None:  # GPT2TokenizerFast reads vocab.json and merges.txt
        special = ENDOFTEXT if getattr(tokenizer, "endoftext_id", None) is not None else None
        for name in ("vocab.json", "merges.txt"):
            with open(os.path.join(directory, name), "wb") as f:
                f.write(files[name])
        tokenizer_config = {
            "tokenizer_class": "GPT2Tokenizer",
            "add_prefix_space": False,
            "bos_token": special,
            "eos_token": special,
            "unk_token": special,
            "model_max_length": config.get("n_positions", config.get("max_position_embeddings")),
        }
        _write_json(os.path.join(directory, "tokenizer_config.json"), tokenizer_config)
        return ["vocab.json", "merges.txt", "tokenizer_config.json"]
    tokenizer.save_to_preset(directory)  # copies tokenizer.json (or tokenizer.model) and tokenizer_config.json
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):  # a SentencePiece model: also the pipeline it runs as
        with open(path, "w", encoding="utf-8") as f:
            f.write(tokenizer.to_json())
    return [name for name in TOKENIZER_FILES if os.path.isfile(os.path.join(directory, name))]
