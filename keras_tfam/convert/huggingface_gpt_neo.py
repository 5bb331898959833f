"""Import of Hugging Face GPT-Neo checkpoints (`model_type: gpt_neo`) into `GPT2LM`.

GPT-Neo (Black et al. 2021, EleutherAI) is GPT-2 with three differences a
loader must honour (see `GPTNeoSelfAttention` in transformers):

- layers alternate `global` (causal) and `local` attention; a local layer
  lets query `i` see keys `i - window_size < j <= i`: here a `SlidingWindow`
  pattern on those layers (`local_window`, `local_layers`), so they compute
  banded and decode with ring caches of `window_size` slots;
- separate `q_proj`, `k_proj`, `v_proj` without bias and `out_proj` with
  bias, PyTorch `nn.Linear` weights stored `[out, in]` (transposed here
  into Keras `[in, out]` kernels), the MLP likewise;
- scores are not divided by `sqrt(head_dim)` (`scale=1.0`).
"""

from keras_tfam.convert.huggingface_gpt2 import (
    check_activation,
    gpt2_layout_map,
    open_checkpoint,
    read_config,
)
from keras_tfam.convert.safetensors_checkpoint import assign_tensors
from keras_tfam.convert.undrawn_variables import build_and_fill
from keras_tfam.convert.weight_transforms import transpose
from keras_tfam.models.decoder_lm import LOCAL_LAYERS, local_layer_indices

_KINDS = ("global", "local")


def layer_kinds(config):
    """`["global" | "local", ...]` per layer, from `attention_layers` or `attention_types`."""
    kinds = config.get("attention_layers")
    if kinds is None:
        types = config.get("attention_types", [])  # [[["global", "local"], repeat], ...]
        kinds = [kind for pattern, repeat in types for _ in range(repeat) for kind in pattern]
    unknown = sorted(set(kinds) - set(_KINDS))
    if unknown or len(kinds) != config["num_layers"]:
        raise ValueError(
            f"GPT-Neo `attention_layers` must give one of {_KINDS} for each of the {config['num_layers']} layers. "
            f"Received: attention_layers={kinds!r}"
        )
    return kinds


def huggingface_gpt_neo_arguments(config):
    """GPT2LM constructor arguments of a Hugging Face GPT-Neo config."""
    kinds = layer_kinds(config)
    local = [i for i, kind in enumerate(kinds) if kind == "local"]
    layers = local
    for name in LOCAL_LAYERS:
        if local_layer_indices(1, name, len(kinds)) == set(local):
            layers = name
            break
    hidden = config["hidden_size"]
    return {
        "vocabulary_size": config["vocab_size"],
        "num_layers": config["num_layers"],
        "num_heads": config["num_heads"],
        "hidden_dim": hidden,
        "intermediate_dim": config.get("intermediate_size") or 4 * hidden,
        "max_sequence_length": config["max_position_embeddings"],
        "activation": check_activation(config, "GPT-Neo"),
        "norm_epsilon": config.get("layer_norm_epsilon", 1e-5),
        "attention_options": {"scale": 1.0, "qkv_bias": False},
        "local_window": config["window_size"] if local else None,
        "local_layers": layers if local else "odd",
        "dropout": 0.0,
    }


def gpt_neo_weight_map(model):
    """`{checkpoint name: [(variable, transform), ...]}` of a GPT-Neo checkpoint for a GPT2LM."""

    def kernel(dense):
        return [(dense.kernel, transpose)]  # nn.Linear [out, in] -> Dense [in, out]

    def attention_map(attention, p):
        p += "attn.attention."
        return {
            p + "k_proj.weight": kernel(attention.key_dense),
            p + "v_proj.weight": kernel(attention.value_dense),
            p + "q_proj.weight": kernel(attention.query_dense),
            p + "out_proj.weight": kernel(attention.output_dense),
            p + "out_proj.bias": [(attention.output_dense.bias, None)],
        }

    return gpt2_layout_map(model, attention_map, kernel)


def load_huggingface_gpt_neo(directory, cls, **overrides):
    """Builds `cls` (GPT2LM) from a Hugging Face GPT-Neo directory and loads its weights."""
    config = read_config(directory, "gpt_neo")
    checkpoint, rename, ignore = open_checkpoint(directory)
    return build_and_fill(
        lambda: cls(**{**huggingface_gpt_neo_arguments(config), **overrides}),
        lambda model: assign_tensors(gpt_neo_weight_map(model), checkpoint, rename=rename, ignore=ignore),
    )
