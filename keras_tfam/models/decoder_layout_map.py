"""How a `DecoderLM`'s weights shard over a device mesh: the layout map `DecoderLM.get_layout_map` returns."""

import keras


def decoder_layout_map(device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch"):
    """A `keras.distribution.LayoutMap` sharding the model over `device_mesh`, as keras-hub's backbones do.

    Megatron's split (Shoeybi et al. 2019) on the `model` axis: the
    query/key/value and feed-forward input kernels by their output
    columns, the attention output and feed-forward output kernels by
    their input rows; the other axis of each is sharded over `batch` (the
    weights of data-parallel replicas are split too, as keras-hub does).
    The token embedding and the output head are split on the `model` axis
    by the hidden width and replicated along the vocabulary, so that any
    vocabulary shards (GPT-2's 50,257 is no multiple of a model axis; a
    layout is chosen by path alone, before the shape is known); the
    widths must divide by the axes, as the heads' do.
    Biases and norms are replicated. Use it with
    `keras.distribution.ModelParallel(layout_map=..., batch_dim_name=...)`.

    Args:
        device_mesh: a `keras.distribution.DeviceMesh` with both axes.
        model_parallel_dim_name: the mesh axis the weights are split on.
        data_parallel_dim_name: the mesh axis the batch is split on.

    Examples:
        >>> devices = keras.distribution.list_devices()
        >>> mesh = keras.distribution.DeviceMesh((1, len(devices)), ["batch", "model"], devices)
        >>> layout_map = decoder_layout_map(mesh)
        >>> model = keras_tfam.models.DecoderLM(vocabulary_size=1000, num_layers=2, num_heads=4, hidden_dim=32)
        >>> query = model.transformer_blocks[0].self_attention_layer.query_dense.kernel
        >>> layout_map[query.path].axes  # (hidden, heads * head_dim): the heads split over "model"
        ('batch', 'model')
    """
    if not isinstance(device_mesh, keras.distribution.DeviceMesh):
        raise ValueError(
            f"`device_mesh` must be a keras.distribution.DeviceMesh. Received: {type(device_mesh).__name__}"
        )
    for name in (model_parallel_dim_name, data_parallel_dim_name):
        if name not in device_mesh.axis_names:
            raise ValueError(
                f"{name!r} is not an axis of the device mesh, whose axes are {list(device_mesh.axis_names)}"
            )
    model, data = model_parallel_dim_name, data_parallel_dim_name
    layout_map = keras.distribution.LayoutMap(device_mesh)
    # Keys are regular expressions over whole variable paths (a wrapper model prefixes its backbone's).
    # (vocabulary, hidden) and (hidden, vocabulary): the vocabulary is never split.
    layout_map[r"(.*/)?token_embedding/embeddings"] = (None, model)
    layout_map[r"(.*/)?output_head/kernel"] = (model, None)
    layout_map[r".*_attention_\d+/(query|key|value)/kernel"] = (data, model)
    layout_map[r".*_attention_\d+/attention_output/kernel"] = (model, data)
    layout_map[r".*/feed_forward/(intermediate|gate)/kernel"] = (data, model)
    layout_map[r".*/feed_forward/output/kernel"] = (model, data)
    return layout_map
