"""The named attention kernels: what `attention_kernel` accepts, and which kernel one call runs.

A kind declares the named kernels its `attend` can run (`attention_kernels`, a class attribute); the
constructor's `attention_kernel` is `"auto"` or one of them. `"auto"` runs the first kernel the kind
prefers for the call; an explicit kernel runs when it can compute the call, or the call raises one
`ValueError` naming it. The kernels of softmax attention (`MultiHeadAttention`):

- `"dense"`: the whole `(B, N, T, S)` score matrix under the merged mask; computes every call.
- `"query_blocks"`: causal self-attention by blocks of queries, each over the keys up to its last
  position, so the score blocks above the diagonal are never computed.
- `"banded"`: blocks of queries over their neighbouring key blocks (`keras_tfam.ops.banded`), when
  the allowed keys lie in a band (a `window`, or a pattern with a bounded `lookback` and
  `lookahead`): `O(T * window)` instead of `O(T^2)`.
- `"flash"`: one fused kernel (`keras_tfam.ops.attention.flash_causal_attention`), for plain causal
  self-attention where `flash_attention_fits`.
"""

AUTO = "auto"
SOFTMAX_KERNELS = ("dense", "query_blocks", "banded", "flash")
# The kernels that run `_compute_attention` on their blocks of scores: what a kind overriding it keeps.
HOOK_KERNELS = ("dense", "query_blocks", "banded")


def check_attention_kernel(kind, attention_kernel):
    """`attention_kernel` if the kind `kind` (a class) declares it (or it is `"auto"`), else a `ValueError`."""
    allowed = (AUTO,) + tuple(kind.attention_kernels)
    if not isinstance(attention_kernel, str) or attention_kernel not in allowed:
        own = "" if kind.attention_kernels else " (its kernel is its own)"
        raise ValueError(
            f"`attention_kernel` must be one of {allowed} for {kind.__name__}{own}. "
            f"Received: attention_kernel={attention_kernel!r}"
        )
    return attention_kernel


def check_declaration(kind):
    """Refuses, when the class is defined, a kind that overrides the dense hook without declaring its kernels.

    `"flash"` does not run `_compute_attention`; a kind that replaces it declares which named kernels
    still compute what it means (`HOOK_KERNELS`, or fewer), so that none is routed past its override.
    """
    if "_compute_attention" in vars(kind) and "attention_kernels" not in vars(kind):
        raise TypeError(
            f"{kind.__name__} overrides `_compute_attention`: declare the named kernels that run it as a class "
            f"attribute, e.g. `attention_kernels = {HOOK_KERNELS}`."
        )


def choose_kernel(layer, refusals, preferred):
    """The kernel one call runs.

    Args:
        layer: the attention layer (its `attention_kernel` and `attention_kernels`).
        refusals: `{kernel: None}` for each declared kernel that can compute this call, `{kernel: why not}`
            (a phrase) for the others.
        preferred: the kernels `"auto"` runs on this call when they can, in order; else `"dense"`.

    Returns:
        The name of the kernel.
    """
    requested = layer.attention_kernel
    if requested == AUTO:
        return next((name for name in preferred if name in refusals and refusals[name] is None), "dense")
    reason = refusals[requested]
    if reason is None:
        return requested
    allowed = (AUTO,) + tuple(name for name in layer.attention_kernels if refusals[name] is None)
    raise ValueError(
        f"{type(layer).__name__} cannot compute this call with attention_kernel={requested!r} ({reason}); "
        f"this call allows attention_kernel in {allowed}. Received: attention_kernel={requested!r}"
    )
