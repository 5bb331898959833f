"""NumPy forward passes of the Transformer blocks, from their sublayers' weights."""

import numpy as np
from reference import dense, gelu, layer_norm, multi_head_attention, rms_norm, scale_norm


def projection_weights(attention):
    """float64 `[wq, bq, wk, bk, wv, bv, wo, bo]` of an attention layer's four projections."""
    dense_layers = (attention.query_dense, attention.key_dense, attention.value_dense, attention.output_dense)
    return [np.asarray(w, np.float64) for d in dense_layers for w in d.get_weights()]


def norm(layer, x):
    weights = [np.asarray(w, np.float64) for w in layer.get_weights()]
    name = type(layer).__name__
    if name == "LayerNormalization":
        return layer_norm(x, *weights, layer.epsilon)
    if name == "RMSNorm":
        return rms_norm(x, weights[0], layer.epsilon)
    return scale_norm(x, weights[0], layer.epsilon)


def attention(layer, query, value, mask):
    return multi_head_attention(query, value, layer.get_weights(), layer.num_heads, layer.num_key_value_heads, mask)


def feed_forward(layer, x):
    w1, b1 = layer.intermediate_dense.get_weights()
    w2, b2 = layer.output_dense.get_weights()
    return dense(gelu(dense(x, w1, b1)), w2, b2)


def residual(block, x, norm_layer, sublayer):
    if block.norm_position == "pre":
        return x + sublayer(norm(norm_layer, x))
    return norm(norm_layer, x + sublayer(x))


def encoder_block(block, x, mask):
    x = residual(block, x, block.attention_norm, lambda h: attention(block.attention_layer, h, h, mask))
    return residual(block, x, block.feed_forward_norm, lambda h: feed_forward(block.feed_forward, h))


def decoder_block(block, x, self_mask, source=None, cross_mask=None):
    x = residual(block, x, block.self_attention_norm, lambda h: attention(block.self_attention_layer, h, h, self_mask))
    if source is not None:
        x = residual(
            block,
            x,
            block.cross_attention_norm,
            lambda h: attention(block.cross_attention_layer, h, source, cross_mask),
        )
    return residual(block, x, block.feed_forward_norm, lambda h: feed_forward(block.feed_forward, h))
