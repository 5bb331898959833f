"""Import of Hugging Face GPT-2 checkpoints (`config.json` + `model.safetensors`).

Reads the tensors one at a time through `SafetensorsCheckpoint` (no PyTorch;
one file or shards with an index). Accepts both layouts found in the wild: the
one `save_pretrained` writes (`transformer.` prefix) and the one of the
original GPT-2 checkpoints on the hub (no prefix, plus the non-parameter
buffers `h.N.attn.bias` and `h.N.attn.masked_bias`).
GPT-2's `Conv1D` stores weights `[in, out]`, like a Keras `Dense` kernel.
"""

import json
import os
import re

import numpy as np

from keras_tfam.convert.safetensors_checkpoint import SafetensorsCheckpoint, assign_tensors
from keras_tfam.convert.undrawn_variables import build_and_fill
from keras_tfam.convert.weight_transforms import Columns

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
# Causal-mask buffers of older checkpoints: GPT-2's `h.N.attn.bias`, GPT-Neo's `h.N.attn.attention.bias`.
_BUFFER = re.compile(r"^h\.\d+\.attn\.(attention\.)?(masked_)?bias$")


def read_config(directory, model_type="gpt2"):
    """`config.json` of a Hugging Face directory, checked to be of `model_type` (GPT-2's when absent;
    any when `model_type` is `None`)."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"No config.json in {directory!r}: expected a Hugging Face directory "
            "holding config.json and model.safetensors."
        )
    with open(path, "rb") as f:
        data = f.read()
    try:
        config = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON ({error}; {len(data)} bytes): is the download complete?") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object (a Hugging Face config). Received a {type(config).__name__}")
    if model_type is not None and config.get("model_type", "gpt2") != model_type:
        raise ValueError(f"Not a {model_type} checkpoint: model_type={config.get('model_type')!r} in {path}")
    return config


def check_activation(config, directory):
    """The keras_tfam name of the config's `activation_function`; a `ValueError` when unsupported."""
    activation = config.get("activation_function", "gelu_new")
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"Unsupported activation_function={activation!r} in {directory}/config.json; "
            f"supported: {tuple(ACTIVATIONS)}"
        )
    return ACTIVATIONS[activation]


def _read_config(directory):
    config = read_config(directory)
    path = os.path.join(directory, "config.json")
    check_activation(config, directory)
    if config.get("scale_attn_by_inverse_layer_idx"):
        raise ValueError(f"scale_attn_by_inverse_layer_idx=true in {path} is not supported")
    if config.get("add_cross_attention"):
        raise ValueError(f"add_cross_attention=true in {path} is not supported")
    return config


def open_checkpoint(directory):
    """`(SafetensorsCheckpoint, rename, ignore)` of a GPT-2-layout directory: names without the `transformer.`
    prefix; the mask buffers and a tied `lm_head.weight` ignored (a `ValueError` unless it equals `wte.weight`)."""
    checkpoint = SafetensorsCheckpoint(directory)
    names = {_strip(name): name for name in checkpoint.names()}
    if (
        "lm_head.weight" in names
        and "wte.weight" in names
        and not np.array_equal(checkpoint.tensor(names["lm_head.weight"]), checkpoint.tensor(names["wte.weight"]))
    ):
        raise ValueError(
            "lm_head.weight differs from wte.weight: GPT2LM ties its output head to the "
            "token embedding and cannot load an untied head."
        )
    return checkpoint, _strip, lambda name: bool(_BUFFER.match(name)) or name == "lm_head.weight"


def _strip(name):
    return name[len("transformer.") :] if name.startswith("transformer.") else name


def huggingface_gpt2_arguments(config):
    """GPT2LM constructor arguments of a Hugging Face GPT-2 config."""
    return {
        "vocabulary_size": config["vocab_size"],
        "num_layers": config["n_layer"],
        "num_heads": config["n_head"],
        "hidden_dim": config["n_embd"],
        "intermediate_dim": config.get("n_inner") or 4 * config["n_embd"],
        "max_sequence_length": config["n_positions"],
        "activation": ACTIVATIONS[config.get("activation_function", "gelu_new")],
        "norm_epsilon": config.get("layer_norm_epsilon", 1e-5),
        "dropout": 0.0,
    }


def gpt2_layout_map(model, attention_map, kernel):
    """The names GPT-2 and GPT-Neo share, in the order of transformers' state dict (which decides how an export is
    split into shards): embeddings; each block's norms, attention (`attention_map(attention, prefix)`) and MLP (its
    kernels through `kernel(dense)`); the final norm."""
    mapping = {
        "wte.weight": [(model.token_embedding.embeddings, None)],
        "wpe.weight": [(model.position_embedding.position_embeddings, None)],
    }
    for i, block in enumerate(model.transformer_blocks):
        p, feed_forward = f"h.{i}.", block.feed_forward
        mapping[p + "ln_1.weight"] = [(block.self_attention_norm.gamma, None)]
        mapping[p + "ln_1.bias"] = [(block.self_attention_norm.beta, None)]
        mapping.update(attention_map(block.self_attention_layer, p))
        mapping.update(
            {
                p + "ln_2.weight": [(block.feed_forward_norm.gamma, None)],
                p + "ln_2.bias": [(block.feed_forward_norm.beta, None)],
                p + "mlp.c_fc.weight": kernel(feed_forward.intermediate_dense),
                p + "mlp.c_fc.bias": [(feed_forward.intermediate_dense.bias, None)],
                p + "mlp.c_proj.weight": kernel(feed_forward.output_dense),
                p + "mlp.c_proj.bias": [(feed_forward.output_dense.bias, None)],
            }
        )
    mapping["ln_f.weight"] = [(model.final_norm.gamma, None)]
    mapping["ln_f.bias"] = [(model.final_norm.beta, None)]
    return mapping


def gpt2_weight_map(model):
    """`{checkpoint name: [(variable, transform), ...]}` for a learned-position, LayerNorm GPT2LM."""
    d = model.hidden_dim

    def attention_map(attention, p):
        qkv = (attention.query_dense, attention.key_dense, attention.value_dense)
        return {
            p + "attn.c_attn.weight": [(dense.kernel, Columns(j, d)) for j, dense in enumerate(qkv)],
            p + "attn.c_attn.bias": [(dense.bias, Columns(j, d)) for j, dense in enumerate(qkv)],
            p + "attn.c_proj.weight": [(attention.output_dense.kernel, None)],
            p + "attn.c_proj.bias": [(attention.output_dense.bias, None)],
        }

    return gpt2_layout_map(model, attention_map, lambda dense: [(dense.kernel, None)])  # Conv1D is [in, out]


def load_huggingface_gpt2(directory, cls, **overrides):
    """Builds `cls` (GPT2LM) from a Hugging Face GPT-2 directory and loads its weights."""
    config = _read_config(directory)
    checkpoint, rename, ignore = open_checkpoint(directory)
    missing = [key for key in ("vocab_size", "n_layer", "n_head", "n_embd", "n_positions") if key not in config]
    if missing:
        raise ValueError(f"{os.path.join(directory, 'config.json')} lacks the GPT-2 config key(s) {missing}")
    return build_and_fill(
        lambda: cls(**{**huggingface_gpt2_arguments(config), **overrides}),
        lambda model: assign_tensors(gpt2_weight_map(model), checkpoint, rename=rename, ignore=ignore),
    )
