"""Copy of a `keras_hub.models.GPT2Backbone`'s weights into a GPT2LM."""

import numpy as np

from keras_tfam.convert.safetensors_checkpoint import assign_tensors
from keras_tfam.models.checkpoint_loaders import register_checkpoint_loader


@register_checkpoint_loader("keras_hub_gpt2")
def from_keras_hub_gpt2(backbone, cls, **overrides):
    """A GPT2LM with the architecture and weights of a keras-hub GPT-2 backbone.

    keras-hub's attention projections are `EinsumDense` kernels `(D, N, H)`
    and `(N, H, D)`; they are reshaped to the `(D, N * H)` / `(N * H, D)`
    kernels of `Dense`.
    """
    arguments = {
        "vocabulary_size": backbone.vocabulary_size,
        "num_layers": backbone.num_layers,
        "num_heads": backbone.num_heads,
        "hidden_dim": backbone.hidden_dim,
        "intermediate_dim": backbone.intermediate_dim,
        "max_sequence_length": backbone.max_sequence_length,
        "dropout": backbone.dropout,
    }
    model = cls(**{**arguments, **overrides})
    d = backbone.hidden_dim
    tensors = {v.path: np.asarray(v) for v in backbone.weights}
    flat = {
        "query/kernel": lambda w: w.reshape(d, -1),
        "query/bias": lambda w: w.reshape(-1),
        "key/kernel": lambda w: w.reshape(d, -1),
        "key/bias": lambda w: w.reshape(-1),
        "value/kernel": lambda w: w.reshape(d, -1),
        "value/bias": lambda w: w.reshape(-1),
        "attention_output/kernel": lambda w: w.reshape(-1, d),
    }
    mapping = {
        "token_embedding/embeddings": [(model.token_embedding.embeddings, None)],
        "position_embedding/embeddings": [(model.position_embedding.position_embeddings, None)],
        "layer_norm/gamma": [(model.final_norm.gamma, None)],
        "layer_norm/beta": [(model.final_norm.beta, None)],
    }
    for i, block in enumerate(model.transformer_blocks):
        attention = block.self_attention_layer
        p = f"transformer_layer_{i}/"
        targets = {
            "self_attention/query/kernel": attention.query_dense.kernel,
            "self_attention/query/bias": attention.query_dense.bias,
            "self_attention/key/kernel": attention.key_dense.kernel,
            "self_attention/key/bias": attention.key_dense.bias,
            "self_attention/value/kernel": attention.value_dense.kernel,
            "self_attention/value/bias": attention.value_dense.bias,
            "self_attention/attention_output/kernel": attention.output_dense.kernel,
            "self_attention/attention_output/bias": attention.output_dense.bias,
            "self_attention_layer_norm/gamma": block.self_attention_norm.gamma,
            "self_attention_layer_norm/beta": block.self_attention_norm.beta,
            "feedforward_intermediate_dense/kernel": block.feed_forward.intermediate_dense.kernel,
            "feedforward_intermediate_dense/bias": block.feed_forward.intermediate_dense.bias,
            "feedforward_output_dense/kernel": block.feed_forward.output_dense.kernel,
            "feedforward_output_dense/bias": block.feed_forward.output_dense.bias,
            "feedforward_layer_norm/gamma": block.feed_forward_norm.gamma,
            "feedforward_layer_norm/beta": block.feed_forward_norm.beta,
        }
        for name, variable in targets.items():
            transform = flat.get(name.split("/", 1)[1]) if name.startswith("self_attention/") else None
            mapping[p + name] = [(variable, transform)]
    assign_tensors(mapping, tensors, source=f"keras-hub backbone {backbone.name!r}")
    return model
