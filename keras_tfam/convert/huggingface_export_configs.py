"""What `save_to_huggingface` writes for each family: `config.json` and the tensors under their names.

Each family is the inverse of its importer: the config holds what the
importer's config reader turns back into the same constructor arguments, and
the tensors come from the importer's own weight map (`gpt2_weight_map`,
`gpt_neo_weight_map`, `llama_weight_map`), read the other way
(`keras_tfam.convert.weight_transforms`). A model option the family has no
equivalent of is refused, naming the option.
"""

import math

from keras_tfam.convert import huggingface_gpt2, huggingface_llama
from keras_tfam.convert.huggingface_gpt2 import gpt2_weight_map
from keras_tfam.convert.huggingface_gpt_neo import gpt_neo_weight_map
from keras_tfam.convert.huggingface_llama import llama_weight_map
from keras_tfam.models.local_layers import local_layer_indices

# The attention options of a GPT-Neo layer, as its importer sets them.
GPT_NEO_ATTENTION = {"scale": 1.0, "qkv_bias": False}
ARCHITECTURES = {
    "gpt2": "GPT2LMHeadModel",
    "gpt_neo": "GPTNeoForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gemma": "GemmaForCausalLM",
}


def _names_of(table):
    """`{our activation: the first Hugging Face name reading as it}` of an importer's activation table."""
    names = {}
    for name, ours in table.items():
        names.setdefault(ours, name)
    return names


GPT2_ACTIVATION_NAMES = _names_of(huggingface_gpt2.ACTIVATIONS)
# The Llama importer reads "gelu" as the exact GeGLU (but as the tanh form for Gemma).
LLAMA_ACTIVATION_NAMES = {**_names_of(huggingface_llama.ACTIVATIONS), "geglu": "gelu"}
GEMMA_ACTIVATION_NAMES = _names_of(huggingface_llama.ACTIVATIONS)


def check_options(model, model_type, allowed):
    """A `ValueError` naming the first option of `model` outside `allowed` (`{option: allowed values}`)."""
    for option, values in allowed.items():
        value = getattr(model, option)
        if value not in values:
            raise ValueError(
                f"`{option}` must be one of {values} to export to Hugging Face {model_type} "
                f"({ARCHITECTURES[model_type]} has no other). Received: {option}={value!r}"
            )


def _gpt2_options(model, attention_options, local_window):
    return {
        "norm": ("layer",),
        "activation": tuple(GPT2_ACTIVATION_NAMES),
        "attention": ("softmax",),
        "attention_options": (attention_options,),
        "local_window": local_window,
        "use_bias": (True,),
        "tie_embeddings": (True,),
        "embedding_scale": (None,),
        "num_key_value_heads": (model.num_heads,),
        "head_dim": (model.hidden_dim // model.num_heads,),
    }


def _intermediate(model):
    return None if model.intermediate_dim == 4 * model.hidden_dim else model.intermediate_dim


def gpt2_export(model):
    """`(config, {tensor name: weight map entries})` of a GPT2LM with GPT-2's options."""
    check_options(model, "gpt2", _gpt2_options(model, {}, (None,)))
    config = {
        "architectures": [ARCHITECTURES["gpt2"]],
        "model_type": "gpt2",
        "vocab_size": model.vocabulary_size,
        "n_positions": model.max_sequence_length,
        "n_embd": model.hidden_dim,
        "n_layer": model.num_layers,
        "n_head": model.num_heads,
        "n_inner": _intermediate(model),
        "activation_function": GPT2_ACTIVATION_NAMES[model.activation],
        "layer_norm_epsilon": model.norm_epsilon,
        "resid_pdrop": model.dropout,
        "embd_pdrop": model.dropout,
        "attn_pdrop": model.dropout,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
        "tie_word_embeddings": True,
    }
    return config, {"transformer." + name: entries for name, entries in gpt2_weight_map(model).items()}


def gpt_neo_export(model):
    """`(config, {tensor name: weight map entries})` of a GPT2LM with GPT-Neo's attention."""
    check_options(model, "gpt_neo", _gpt2_options(model, GPT_NEO_ATTENTION, (None, model.local_window)))
    local = local_layer_indices(model.local_window, model.local_layers, model.num_layers)
    kinds = ["local" if i in local else "global" for i in range(model.num_layers)]
    config = {
        "architectures": [ARCHITECTURES["gpt_neo"]],
        "model_type": "gpt_neo",
        "vocab_size": model.vocabulary_size,
        "max_position_embeddings": model.max_sequence_length,
        "hidden_size": model.hidden_dim,
        "num_layers": model.num_layers,
        "num_heads": model.num_heads,
        "intermediate_size": _intermediate(model),
        "attention_types": [[kinds, 1]],
        "attention_layers": kinds,
        "window_size": model.local_window or 256,  # GPTNeoConfig's default where no layer is local
        "activation_function": GPT2_ACTIVATION_NAMES[model.activation],
        "layer_norm_epsilon": model.norm_epsilon,
        "embed_dropout": model.dropout,
        "attention_dropout": model.dropout,
        "resid_dropout": model.dropout,
        "tie_word_embeddings": True,
    }
    return config, {"transformer." + name: entries for name, entries in gpt_neo_weight_map(model).items()}


def llama_model_type(model):
    """The Llama-family `model_type` whose conventions `model` has: Gemma's norm, Qwen2's q/k/v biases,
    Mistral's sliding window, or Llama."""
    if model.norm == "gemma_rms":
        return "gemma"
    if model.attention_options.get("qkv_bias"):
        return "qwen2"
    return "mistral" if model.local_window is not None else "llama"


def _rope_parameters(model):
    """`(rope_parameters, max_position_embeddings)` of the model's rotary options."""
    options = dict(model.position_options)
    for option, allowed in (("pairing", "half"), ("scaling_factor", 1.0)):
        value = options.get(option, {"pairing": "interleaved", "scaling_factor": 1.0}[option])
        if value != allowed:
            raise ValueError(
                f"`position_options` must have {option}={allowed!r} to export to Hugging Face (transformers' "
                f"rotary embedding has no other). Received: position_options={options!r}"
            )
    scaling = dict(options.get("scaling") or {})
    kind = scaling.pop("type", "default")
    context = model.context_length or model.max_sequence_length
    if kind == "dynamic":  # transformers' dynamic rule reads the original context from max_position_embeddings
        context = scaling.pop("original_max_position_embeddings")
    return {"rope_theta": float(options.get("max_wavelength", 10000.0)), "rope_type": kind, **scaling}, context


def llama_export(model):
    """`(config, {tensor name: weight map entries})` of a Llama-family DecoderLM."""
    model_type = llama_model_type(model)
    names = GEMMA_ACTIVATION_NAMES if model_type == "gemma" else LLAMA_ACTIVATION_NAMES
    allowed = {
        "position": ("rotary",),
        "norm": ("rms", "gemma_rms"),
        "activation": tuple(names),
        "attention": ("softmax",),
        "attention_options": ({}, {"qkv_bias": False}, {"qkv_bias": True}),
        "use_bias": (False,),
        "embedding_scale": (math.sqrt(model.hidden_dim),) if model_type == "gemma" else (None,),
    }
    if model_type == "gemma":
        allowed.update(local_window=(None,), attention_options=({}, {"qkv_bias": False}))
    check_options(model, model_type, allowed)
    local = sorted(local_layer_indices(model.local_window, model.local_layers, model.num_layers))
    if model_type == "mistral":
        check_options(model, model_type, {"local_layers": ("all", list(range(model.num_layers)))})
    rope_parameters, context = _rope_parameters(model)
    config = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": model.vocabulary_size,
        "hidden_size": model.hidden_dim,
        "intermediate_size": model.intermediate_dim,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_key_value_heads,
        "head_dim": model.head_dim,
        "hidden_act": names[model.activation],
        "max_position_embeddings": context,
        "rms_norm_eps": model.norm_epsilon,
        "rope_parameters": rope_parameters,
        "attention_dropout": model.dropout,
        "tie_word_embeddings": model.tie_embeddings,
    }
    if model_type in ("llama", "gemma"):
        config["attention_bias"] = False
    if model_type == "gemma":  # the key earlier transformers versions read for Gemma's MLP
        config["hidden_activation"] = config["hidden_act"]
    if model_type == "llama":
        config["mlp_bias"] = False
    if model_type == "mistral":
        config["sliding_window"] = model.local_window
    if model_type == "qwen2":
        config.update(
            use_sliding_window=bool(local),
            sliding_window=model.local_window if local else None,
            max_window_layers=model.num_layers,
            layer_types=["sliding_attention" if i in local else "full_attention" for i in range(model.num_layers)],
        )
    tensors = {
        (name if name == "lm_head.weight" else "model." + name): entries
        for name, entries in llama_weight_map(model).items()
    }
    return config, tensors


def family_export(model):
    """`(config, tensors)` of the family `model` belongs to: GPT-2 or GPT-Neo for learned positions, the Llama
    family otherwise."""
    if model.position != "learned":
        return llama_export(model)
    if model.attention_options == GPT_NEO_ATTENTION:
        return gpt_neo_export(model)
    return gpt2_export(model)
