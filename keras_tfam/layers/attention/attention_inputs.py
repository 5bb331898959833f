"""The first step of every attention call: the call checked against what the kind declares, inputs resolved
(defaults, Keras masks) and a memory prepended.

Masks are boolean (`True` = may attend), or integers 0 / 1. A float mask is
refused rather than guessed at: `0 / -1e9` is an additive mask in some
libraries and `1 / 0` a multiplicative one in others, and read as booleans
the first inverts what it means. Pass `additive_mask == 0` instead.
"""

import keras
import numpy as np
from keras import ops

from keras_tfam.ops import masks as mask_ops
from keras_tfam.utils import static_dim


def check_mask(name, mask, axes, broadcast=False):
    """A one-line `ValueError` naming `name` unless `mask` is boolean (or 0/1 integers) of the shape `axes` says.

    Args:
        name: the argument's name, for the message.
        mask: the mask, or `None` (nothing to check).
        axes: `((label, size), ...)`, one pair per axis; a size of `None` is
            not checked (unknown until the call runs).
        broadcast: an axis of size 1 is accepted too (it broadcasts).

    Shapes are checked where they are static; the values of an integer mask
    only when they are known (an eager call), so a traced call is not broken.
    """
    if mask is None:
        return
    shape = tuple(getattr(mask, "shape", None) or np.shape(mask))
    dtype = keras.backend.standardize_dtype(getattr(mask, "dtype", None) or np.asarray(mask).dtype)
    wanted = "(" + ", ".join(label if size is None else f"{label}={size}" for label, size in axes) + ")"
    if dtype != "bool" and "int" not in dtype:
        raise ValueError(
            f"`{name}` must be boolean (True = may attend) or 0/1 integers; a float mask is refused rather than "
            f"read as booleans (an additive 0 / -1e9 mask would invert): pass `mask == 0` for one. "
            f"Received: {name}.dtype={dtype}"
        )
    sizes = [static_dim(dim) for dim in shape]
    fits = len(shape) == len(axes) and all(
        got is None or size is None or got == size or (broadcast and got == 1) for got, (_, size) in zip(sizes, axes)
    )
    if not fits:
        allowed = " (an axis of 1 broadcasts)" if broadcast else ""
        raise ValueError(f"`{name}` must have shape {wanted}{allowed}. Received: {name}.shape={tuple(sizes)}")
    if dtype != "bool":
        try:
            values = ops.convert_to_numpy(mask)
        except Exception:  # traced or symbolic: no values yet
            return
        if not np.isin(values, (0, 1)).all():
            found = sorted({int(v) for v in values.flat})[:5]
            raise ValueError(f"`{name}` must be boolean or 0/1 integers. Received: {name} with values {found}")


def _static_length(x):
    shape = tuple(x.shape)
    return static_dim(shape[1]) if len(shape) > 1 else None


def check_padding_masks(query, value, key, query_mask, value_mask, key_mask, cache):
    """The padding masks of an attention call checked against the queries and keys they go with."""
    batch = static_dim(tuple(query.shape)[0])
    value = query if value is None else value
    key = value if key is None else key
    # With a cache the keys are the cache's positions (a length the cache holds, in a form of its kind).
    value_length, key_length = (None, None) if cache is not None else (_static_length(value), _static_length(key))
    check_mask("query_mask", query_mask, (("batch", batch), ("query length", _static_length(query))))
    check_mask("value_mask", value_mask, (("batch", batch), ("value length", value_length)))
    check_mask("key_mask", key_mask, (("batch", batch), ("key length", key_length)))


def check_attention_mask(query, value, key, attention_mask, cache, memory):
    """`attention_mask` checked against `(batch, query length, key length)`, a memory's positions included."""
    if attention_mask is None:
        return
    key = key if key is not None else value if value is not None else query
    keys = None if cache is not None else _static_length(key)
    if memory is not None:
        memory_length = _static_length(memory)
        keys = None if keys is None or memory_length is None else keys + memory_length
    batch, length = static_dim(tuple(query.shape)[0]), _static_length(query)
    axes = (("batch", batch), ("query length", length), ("key length", keys))
    check_mask("attention_mask", attention_mask, axes, broadcast=True)


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
    check_attention_mask(query, value, key, attention_mask, cache, memory)
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
    check_padding_masks(query, value, key, query_mask, value_mask, key_mask, cache)
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
    check_mask("memory_mask", memory_mask, (("batch", static_dim(shape[0])), ("memory length", static_dim(shape[1]))))
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
