"""Reduced-precision copies of a model, for decoding.

Decoding one token at a time reads every weight once per step, so at small
batch sizes its speed is the memory bandwidth divided by the bytes of the
weights. A copy whose weights are bfloat16 reads half of them where the
backend multiplies bfloat16 matrices as they are (GPUs, PyTorch's oneDNN).
XLA's CPU backend does not: it converts bfloat16 weights to float32 for its
products and hoists those conversions out of the compiled decoding loop, so
the loop reads float32 copies. Where it pays on the CPU
(`keras_tfam.cpu.bfloat16_rows_pay`), the XLA-CPU engine's loop
(`keras_tfam.engine.xla_cpu`) multiplies one sequence's rows by the bfloat16
weights as their 16 bits, widened inside the product. Norm statistics,
attention softmax and logits stay float32 inside the layers (as under mixed
precision), so only the products see reduced precision.
"""

import keras


def with_dtype(model, dtype="bfloat16"):
    """A copy of `model` whose weights and computation use `dtype`, for decoding.

    The copy is built from the model's config with `dtype` as its dtype
    policy and gets the model's weights, cast (the tied output head
    included: it is the token embedding). Train the original; decode with
    the copy. Its greedy choices may differ from the original's where two
    tokens are nearly tied; `benchmarks/generate_vs_transformers.py` measures
    how often.

    Args:
        model: a Keras model whose config takes a `dtype` (every keras_tfam model).
        dtype: `"bfloat16"` or `"float16"` (or any Keras dtype policy name).

    Returns:
        The copy (a new model; the original is unchanged).
    """
    try:
        policy = keras.dtype_policies.get(dtype)
    except (ValueError, TypeError):
        raise ValueError(f"`dtype` must be a float dtype or a dtype policy name. Received: dtype={dtype!r}") from None
    config = model.get_config()
    config["dtype"] = keras.dtype_policies.serialize(policy)
    copy = type(model).from_config(config)
    copy.set_weights(model.get_weights())
    return copy
