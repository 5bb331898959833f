"""Which layers of a decoder are local (sliding-window) layers: the `local_layers` option's values."""

from keras_tfam.utils import check_positive_int

# Which layers are local when `local_window` is set: the odd ones alternate with dense layers starting
# dense (GPT-3, GPT-Neo).
LOCAL_LAYERS = ("odd", "even", "all")


def local_layer_indices(local_window, local_layers, num_layers):
    """The set of local layers' indices; `ValueError` naming a bad `local_window` or `local_layers`."""
    if local_window is None:
        return set()
    check_positive_int("local_window", local_window)
    if isinstance(local_layers, (list, tuple)):
        if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in local_layers):
            raise ValueError(
                f"`local_layers` must list layer indices in [0, {num_layers}). Received: local_layers={local_layers!r}"
            )
        return set(local_layers)
    if local_layers not in LOCAL_LAYERS:
        raise ValueError(
            f"`local_layers` must be one of {LOCAL_LAYERS} or a list of layer indices. "
            f"Received: local_layers={local_layers!r}"
        )
    first = {"odd": 1, "even": 0, "all": 0}[local_layers]
    step = 1 if local_layers == "all" else 2
    return set(range(first, num_layers, step))
