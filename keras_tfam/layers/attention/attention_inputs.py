"""The first step of every attention call: inputs resolved (defaults, Keras masks) and a memory prepended."""

from keras import ops

from keras_tfam.ops import masks as mask_ops


def resolve_inputs(query, value, key, query_mask, value_mask, key_mask, cache):
    """`(value, key, query_mask, key_padding_mask)` with defaults and Keras masks filled in.

    Keras fills in `*_mask` arguments only for layers called with several
    tensors, so the Keras masks are read here, as Keras' own attention does.
    In self-attention without a cache the keys share the queries' padding.
    """
    query_mask = mask_ops.keras_mask(query) if query_mask is None else query_mask
    if value is None:
        value = query
        if value_mask is None and cache is None:
            value_mask = query_mask
    value_mask = mask_ops.keras_mask(value) if value_mask is None else value_mask
    key = value if key is None else key
    if key_mask is None and key is not value:
        key_mask = mask_ops.keras_mask(key)
    return value, key, query_mask, mask_ops.merge_masks(value_mask, key_mask)


def prepend_memory(query, value, key, key_padding_mask, memory, memory_mask):
    """`(value, key, key_padding_mask)` with the memory's states and mask in front."""
    shape, width = tuple(memory.shape), (key.shape[-1], value.shape[-1])
    if len(shape) != 3 or shape[-1] != width[0] or width[0] != width[1]:
        raise ValueError(
            f"`memory` must be past hidden states of shape (batch, memory_length, {width[0]}): the width of the "
            f"keys and values it is prepended to. Received: memory.shape={shape}"
        )
    if shape[0] is not None and query.shape[0] is not None and shape[0] != query.shape[0]:
        raise ValueError(
            f"`memory` must have the batch size of the queries ({query.shape[0]}). Received: memory.shape={shape}"
        )
    memory = ops.cast(memory, key.dtype)
    if memory_mask is not None or key_padding_mask is not None:
        batch = ops.shape(memory)[0]
        memory_mask = ops.ones((batch, ops.shape(memory)[1]), "bool") if memory_mask is None else memory_mask
        keys_mask = ops.ones((batch, ops.shape(key)[1]), "bool") if key_padding_mask is None else key_padding_mask
        key_padding_mask = ops.concatenate([ops.cast(memory_mask, "bool"), ops.cast(keys_mask, "bool")], axis=1)
    same = value is key
    key = ops.concatenate([memory, key], axis=1)
    value = key if same else ops.concatenate([memory, value], axis=1)
    return value, key, key_padding_mask
