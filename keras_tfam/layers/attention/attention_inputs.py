"""The first step of every attention call: the call checked against what the kind declares, inputs resolved
(defaults, Keras masks) and a memory prepended."""

from keras import ops

from keras_tfam.ops import masks as mask_ops


def check_call(
    layer,
    query,
    value,
    key,
    attention_mask,
    use_causal_mask,
    window,
    cache,
    cache_update_index,
    return_attention_scores,
    memory,
    kind_inputs,
):
    """One `ValueError` for a call argument the kind of `layer` does not honour (its declared `supports_*`)."""
    kind = type(layer).__name__
    unknown = sorted(set(kind_inputs) - set(layer.call_inputs))
    if unknown:
        raise TypeError(f"{kind}.call() got unexpected keyword argument(s) {unknown}")
    refused = [
        ("attention_mask", attention_mask is not None, layer.supports_attention_mask),
        ("return_attention_scores", bool(return_attention_scores), layer.supports_attention_scores),
        ("use_causal_mask", bool(use_causal_mask), layer.supports_causal),
        ("cache", cache is not None, layer.supports_cache),
        ("memory", memory is not None, layer.supports_memory),
        ("window", window is not None, layer.supports_window),
        ("window", window is not None and cache is not None, layer.supports_ring_cache),
    ]
    for name, given, supported in refused:
        if given and not supported:
            shown = {
                "attention_mask": f"attention_mask.shape={tuple(getattr(attention_mask, 'shape', ()))}",
                "cache": "a cache",
                "memory": "a memory",
                "window": f"window={window}" + (" with a cache" if cache is not None else ""),
            }.get(name, f"{name}=True")
            reason = layer.refusal_reasons.get(name)
            raise ValueError(f"{kind} takes no `{name}`{f' ({reason})' if reason else ''}. Received: {shown}")
    if layer.self_attention_only and (key is not None or (value is not None and value is not query)):
        raise ValueError(f"{kind} is self-attention: pass `query` only (or `value` = `query`), no other `key`.")
    if layer.pattern is not None and layer.pattern.depends_on_length and (use_causal_mask or cache is not None):
        raise ValueError(
            f"{layer.pattern!r} depends on the sequence's length, so a causal or cached call cannot see what the "
            "full pass sees (e.g. BigBird(causal=False) draws random blocks among all blocks): use its causal "
            f"form. Received: use_causal_mask={bool(use_causal_mask)}, cache={'given' if cache is not None else None}"
        )
    if memory is not None and cache is not None:
        raise ValueError(
            "`memory` and `cache` cannot be combined: a decoding model keeps its memory's states in its "
            "cache, or passes them as `memory` without a KV cache."
        )
    if cache is None and cache_update_index is not None:
        raise ValueError(
            f"`cache_update_index` is the position of the first token written into `cache`; no cache was given. "
            f"Received: cache_update_index={cache_update_index}"
        )


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
