"""Import of Hugging Face Llama-family checkpoints (`llama`, `mistral`, `qwen2`, `gemma`) into `DecoderLM`.

The four share one layout (`model.layers.N.self_attn.q_proj`, `mlp.gate_proj`,
`input_layernorm`, ...; PyTorch `nn.Linear` weights `[out, in]`, transposed
here into Keras `[in, out]` kernels) and differ in a few conventions, each an
option of `DecoderLM`:

- rotary positions on half-split pairs (transformers' `rotate_half`) with the
  config's theta and scaling (`rope_theta` and `rope_scaling`, or the newer
  `rope_parameters`), over `head_dim` features, which may differ from
  `hidden_size / num_attention_heads`;
- grouped-query attention (`num_key_value_heads`); q/k/v biases (Qwen2,
  Llama's `attention_bias`);
- an untied `lm_head` unless `tie_word_embeddings`;
- Mistral's (and Qwen2's, per layer) sliding window: query `i` sees keys
  `i - w < j <= i`, the library's `SlidingWindow` with ring caches;
- Gemma: embeddings times `sqrt(hidden_size)`, RMSNorm `x * (1 + weight)`,
  tanh-approximate GeGLU.

Tensors are read one at a time from single or sharded safetensors, in
float32, float16 or bfloat16, and cast to the model's variables (float32, or
bfloat16 with `dtype="bfloat16"`), so the peak memory stays near one copy of
the model.
"""

import math
import os
import re

from keras_tfam.convert.huggingface_gpt2 import read_config
from keras_tfam.convert.safetensors_checkpoint import SafetensorsCheckpoint, assign_tensors
from keras_tfam.convert.undrawn_variables import build_and_fill
from keras_tfam.convert.weight_transforms import transpose
from keras_tfam.layers.position.rope_scaling import ROPE_SCALINGS, check_rope_scaling
from keras_tfam.models.decoder_lm import DecoderLM

MODEL_TYPES = ("llama", "mistral", "qwen2", "gemma")
# `tie_word_embeddings` when a config leaves it out (transformers writes only what differs from the
# class's default).
_TIED_BY_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "gemma": True}
ACTIVATIONS = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu_tanh", "gelu_new": "geglu_tanh"}
# Buffers some checkpoints carry that are no parameters.
_BUFFER = re.compile(r"^layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")


def _activation(config, model_type, path):
    name = config.get("hidden_act") or config.get("hidden_activation") or "silu"
    if model_type == "gemma" and name == "gelu":
        return "geglu_tanh"  # Gemma's first configs say "gelu" for its tanh approximation (transformers too)
    if name == "gelu":
        return "geglu"
    if name not in ACTIVATIONS:
        raise ValueError(f"Unsupported hidden_act={name!r} in {path}; supported: {(*ACTIVATIONS, 'gelu')}")
    return ACTIVATIONS[name]


def rope_options(config, path):
    """`position_options` of the config's rotary positions: theta, half pairing, scaling."""
    parameters = dict(config.get("rope_parameters") or {})
    legacy = dict(config.get("rope_scaling") or {})
    theta = parameters.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = parameters.get("rope_type") or legacy.get("rope_type") or legacy.get("type") or "default"
    factor = config.get("partial_rotary_factor", parameters.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise ValueError(f"Unsupported partial_rotary_factor={factor} in {path}; supported: 1.0")
    options = {"max_wavelength": float(theta), "pairing": "half"}
    if kind == "default":
        return options
    if kind not in ROPE_SCALINGS:
        raise ValueError(
            f"Unsupported rope scaling in {path}: supported types are {('default', *ROPE_SCALINGS)}. "
            f"Received: rope_type={kind!r}"
        )
    scaling = {**legacy, **parameters}
    for key in ("rope_type", "type", "rope_theta", "partial_rotary_factor"):
        scaling.pop(key, None)
    if kind in ("dynamic", "yarn") and scaling.get("original_max_position_embeddings") is None:
        scaling["original_max_position_embeddings"] = config["max_position_embeddings"]
    if kind == "dynamic":  # transformers' rule reads the config's context, not the dict's
        scaling["original_max_position_embeddings"] = config["max_position_embeddings"]
    options["scaling"] = check_rope_scaling({"type": kind, **scaling})
    return options


def sliding_layers(config, model_type, num_layers):
    """`(window, layer indices)` of the layers that attend through a sliding window, or `(None, [])`."""
    window = config.get("sliding_window")
    if model_type == "qwen2" and not config.get("use_sliding_window", False):
        window = None
    if not window:
        return None, []
    layer_types = config.get("layer_types")
    if layer_types is not None:
        layers = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    elif model_type == "qwen2":
        layers = list(range(config.get("max_window_layers", num_layers), num_layers))
    else:
        layers = list(range(num_layers))
    return (int(window), layers) if layers else (None, [])


def huggingface_llama_arguments(config, model_type, path):
    """`DecoderLM` constructor arguments of a Llama-family config."""
    required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    missing = [key for key in required if key not in config]
    if missing:
        raise ValueError(f"{path} lacks the {model_type} config key(s) {missing}")
    hidden, heads, layers = config["hidden_size"], config["num_attention_heads"], config["num_hidden_layers"]
    attention_bias = bool(config.get("attention_bias", model_type == "qwen2"))
    if config.get("mlp_bias", False):
        raise ValueError(f"Unsupported mlp_bias=true in {path}: the feed-forward layers here have no biases")
    window, local = sliding_layers(config, model_type, layers)
    max_positions = config.get("max_position_embeddings", 2048)
    position_options = rope_options(config, path)
    # The trained context bounds what `generate` attends over, except where dynamic NTK scaling exists to
    # reach past it.
    dynamic = position_options.get("scaling", {}).get("type") == "dynamic"
    arguments = {
        "vocabulary_size": config["vocab_size"],
        "num_layers": layers,
        "num_heads": heads,
        "hidden_dim": hidden,
        "head_dim": config.get("head_dim") or hidden // heads,
        "intermediate_dim": config["intermediate_size"],
        "num_key_value_heads": config.get("num_key_value_heads") or heads,
        "max_sequence_length": max_positions,
        "context_length": None if dynamic else max_positions,
        "position": "rotary",
        "position_options": position_options,
        "norm": "gemma_rms" if model_type == "gemma" else "rms",
        "norm_epsilon": config.get("rms_norm_eps", 1e-6),
        "activation": _activation(config, model_type, path),
        "use_bias": False,
        "attention_options": {"qkv_bias": True} if attention_bias else {},
        "tie_embeddings": bool(config.get("tie_word_embeddings", _TIED_BY_DEFAULT[model_type])),
        "embedding_scale": math.sqrt(hidden) if model_type == "gemma" else None,
        "dropout": 0.0,
    }
    if attention_bias and model_type == "llama":
        raise ValueError(
            f"Unsupported attention_bias=true in {path} for llama: its o_proj has a bias too, which the "
            "library's attention output has only with every dense bias (use_bias)"
        )
    if window is not None:
        arguments["local_window"] = window
        arguments["local_layers"] = "all" if local == list(range(layers)) else local
    return arguments


def llama_weight_map(model):
    """`{checkpoint name without "model.": [(variable, transform), ...]}` of a Llama-family DecoderLM, in the order
    of transformers' state dict (which decides how an export is split into shards)."""

    def kernel(dense):
        return [(dense.kernel, transpose)]  # nn.Linear [out, in] -> Dense [in, out]

    mapping = {"embed_tokens.weight": [(model.token_embedding.embeddings, None)]}
    for i, block in enumerate(model.transformer_blocks):
        attention, feed_forward = block.self_attention_layer, block.feed_forward
        p = f"layers.{i}."
        for name, dense in (("q", attention.query_dense), ("k", attention.key_dense), ("v", attention.value_dense)):
            mapping[p + f"self_attn.{name}_proj.weight"] = kernel(dense)
            if attention.qkv_bias:
                mapping[p + f"self_attn.{name}_proj.bias"] = [(dense.bias, None)]
        mapping.update(
            {
                p + "self_attn.o_proj.weight": kernel(attention.output_dense),
                p + "mlp.gate_proj.weight": kernel(feed_forward.gate_dense),
                p + "mlp.up_proj.weight": kernel(feed_forward.intermediate_dense),
                p + "mlp.down_proj.weight": kernel(feed_forward.output_dense),
                p + "input_layernorm.weight": [(block.self_attention_norm.scale, None)],
                p + "post_attention_layernorm.weight": [(block.feed_forward_norm.scale, None)],
            }
        )
    mapping["norm.weight"] = [(model.final_norm.scale, None)]
    if model.output_head is not None:
        mapping["lm_head.weight"] = kernel(model.output_head)
    return mapping


def _strip(name):
    return name[len("model.") :] if name.startswith("model.") else name


def load_huggingface_llama(directory, cls, **overrides):
    """Builds `cls` (default `DecoderLM`) from a Llama-family directory and loads its weights."""
    config = read_config(directory, None)
    model_type = config.get("model_type")
    path = os.path.join(directory, "config.json")
    checkpoint = SafetensorsCheckpoint(directory)
    arguments = huggingface_llama_arguments(config, model_type, path)
    if not arguments["tie_embeddings"] and "lm_head.weight" not in checkpoint.names():
        raise ValueError(f"tie_word_embeddings is false in {path} but the checkpoint has no 'lm_head.weight' tensor")
    tied_head = arguments["tie_embeddings"] and "lm_head.weight" in checkpoint.names()
    return build_and_fill(
        lambda: (cls or DecoderLM)(**{**arguments, **overrides}),
        lambda model: assign_tensors(
            llama_weight_map(model),
            checkpoint,
            rename=_strip,
            ignore=lambda name: bool(_BUFFER.match(name)) or (tied_head and name == "lm_head.weight"),
        ),
    )
