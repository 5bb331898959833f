"""Segment memory of Transformer-XL with the compressed memory of the Compressive Transformer."""

import keras
from keras import ops

from keras_tfam.ops.attention import scaled_dot_product_attention

COMPRESSIONS = ("mean", "max", "conv")


def _non_negative_int(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"`{name}` must be a non-negative integer. Received: {name}={value!r}")


def _last(x, length):
    """The last `length` (static) rows of `(B, L, ...)` along axis 1, the static shape kept."""
    shape = ops.shape(x)
    start = [0, shape[1] - length] + [0] * (len(x.shape) - 2)
    return ops.slice(x, start, [shape[0], length] + [shape[i] for i in range(2, len(x.shape))])


@keras.saving.register_keras_serializable(package="keras_tfam")
class CompressiveMemory(keras.layers.Layer):
    """One layer's memory of earlier states, with the oldest compressed behind it.

    The memory of Transformer-XL (Dai et al. 2019): the last
    `memory_length` states a layer read (its inputs), kept from segment to
    segment for the next segment to attend to. With a compressed memory
    (Rae et al. 2020, "Compressive Transformers for Long-Range Sequence
    Modelling"), the states that leave the memory are compressed by the
    `compression_rate` `c` — every `c` consecutive states into one, by mean
    or max pooling or a 1-D convolution of kernel and stride `c` — into a
    FIFO of `compressed_memory_length` slots, attended before the memory.
    States leave the memory whatever the segment length: those that do not
    yet make a group of `c` wait (a buffer of `c - 1`), so a stream gives the
    same compressed memory segment by segment or token by token.

    The state is a dict of tensors with the batch on axis 0 (so it can be
    a decoding cache): `memory (B, M, D)`, `memory_mask (B, M)` (`True` =
    a slot holds a state; slots start empty), and with compression
    `compressed (B, Cm, D)`, `compressed_mask`, `evicted (B,)` (states that
    left the memory so far) and, for `c > 1`, `pending (B, c - 1, D)` and
    `pending_mask`.

    The compression is trained by the attention-reconstruction loss
    (`reconstruction_loss`): attention over the states compressed and over
    their compression should agree.

    Groups are counted from the first slot that leaves the memory, empty
    slots included: with `M` a multiple of `c` they align with the text.

    Args:
        memory_length: states kept, `M` (0: none).
        compressed_memory_length: compressed slots, `Cm` (0: no compression).
        compression_rate: `c`, an integer >= 1.
        compression: `"mean"`, `"max"` or `"conv"` (the paper's best).
        kernel_initializer: initializer of the convolution's `(c, D, D)` kernel.

    Call arguments:
        states: `(B, T, D)` with `T` a multiple of `c`.

    Returns:
        `(B, T / c, D)`: the states compressed (the compression function).

    Examples:
        >>> memory = CompressiveMemory(memory_length=8, compressed_memory_length=8, compression_rate=4)
        >>> state = memory.initial_state(batch_size=2, width=16)
        >>> layer_inputs = keras.random.normal((2, 12, 16))  # one segment's inputs to the layer
        >>> state, evicted = memory.update(state, keras.ops.stop_gradient(layer_inputs))
        >>> # 12 slots left the memory (its 8 empty ones, then 4 states): 3 groups of 4 compressed.
        >>> state["compressed"].shape, evicted["compressed"].shape
        ((2, 8, 16), (2, 3, 16))
    """

    def __init__(
        self,
        memory_length,
        compressed_memory_length=0,
        compression_rate=1,
        compression="conv",
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        _non_negative_int("memory_length", memory_length)
        _non_negative_int("compressed_memory_length", compressed_memory_length)
        if not isinstance(compression_rate, int) or isinstance(compression_rate, bool) or compression_rate < 1:
            raise ValueError(
                "`compression_rate` must be an integer >= 1 (states per compressed slot). "
                f"Received: compression_rate={compression_rate!r}"
            )
        if compression not in COMPRESSIONS:
            raise ValueError(f"`compression` must be one of {COMPRESSIONS}. Received: compression={compression!r}")
        if compressed_memory_length and not memory_length:
            raise ValueError(
                "A compressed memory holds what leaves the memory: it needs `memory_length` >= 1. Received: "
                f"memory_length=0, compressed_memory_length={compressed_memory_length}"
            )
        self.memory_length = memory_length
        self.compressed_memory_length = compressed_memory_length
        self.compression_rate = compression_rate
        self.compression = compression
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    @property
    def compressive(self):
        return self.compressed_memory_length > 0

    @property
    def attended_length(self):
        """Slots the next segment attends to: `Cm + M`."""
        return self.compressed_memory_length + self.memory_length

    def build(self, states_shape):
        width = states_shape[-1]
        if self.compressive and self.compression == "conv":
            rate = self.compression_rate
            self.kernel = self.add_weight(
                name="kernel", shape=(rate, width, width), initializer=self.kernel_initializer
            )
            self.bias = self.add_weight(name="bias", shape=(width,), initializer="zeros")
        self.built = True

    def _compress_groups(self, groups):
        """`(B, G, c, D)` -> `(B, G, D)`."""
        if self.compression == "mean":
            return ops.mean(groups, axis=2)
        if self.compression == "max":
            return ops.max(groups, axis=2)
        compressed = ops.einsum("bgcd,cde->bge", groups, ops.cast(self.kernel, groups.dtype))
        return compressed + ops.cast(self.bias, groups.dtype)

    def call(self, states):
        if not self.compressive:
            raise ValueError(
                "This memory compresses nothing (compressed_memory_length=0): it has no compression to call."
            )
        rate = self.compression_rate
        length = states.shape[1]
        if length is not None and length % rate:
            raise ValueError(
                f"`states` must hold a multiple of compression_rate={rate} positions. Received: states.shape="
                f"{tuple(states.shape)}"
            )
        shape = ops.shape(states)
        groups = ops.reshape(states, (shape[0], shape[1] // rate, rate, states.shape[-1]))
        return self._compress_groups(groups)

    def compute_output_shape(self, states_shape):
        length = None if states_shape[1] is None else states_shape[1] // self.compression_rate
        return (states_shape[0], length, states_shape[-1])

    # ------------------------------------------------------------------ state

    def initial_state(self, batch_size, width, dtype="float32"):
        """The empty state of a batch: every slot empty."""

        def slots(length):
            return ops.zeros((batch_size, length, width), dtype), ops.zeros((batch_size, length), "bool")

        state = dict(zip(("memory", "memory_mask"), slots(self.memory_length)))
        if self.compressive:
            state.update(zip(("compressed", "compressed_mask"), slots(self.compressed_memory_length)))
            if self.compression_rate > 1:
                state.update(zip(("pending", "pending_mask"), slots(self.compression_rate - 1)))
            state["evicted"] = ops.zeros((batch_size,), "int32")
        return state

    def check_state(self, state, batch_size, width):
        """A `ValueError` naming the shape unless `state` fits a batch of `batch_size` states of `width`."""
        expected = {"memory": self.memory_length}
        if self.compressive:
            expected["compressed"] = self.compressed_memory_length
            if self.compression_rate > 1:
                expected["pending"] = self.compression_rate - 1
        for name, length in expected.items():
            shape = tuple(state[name].shape)
            expected = (batch_size, length, width)
            if len(shape) != 3 or any(a is not None and b is not None and a != b for a, b in zip(shape, expected)):
                raise ValueError(
                    f"The memory's `{name}` must have shape (batch={batch_size}, {length}, width={width}). "
                    f"Received: {name}.shape={shape}"
                )

    def attended(self, state):
        """`(states (B, Cm + M, D), mask (B, Cm + M))` the next segment attends to, oldest first."""
        if not self.compressive:
            return state["memory"], state["memory_mask"]
        return (
            ops.concatenate([state["compressed"], state["memory"]], axis=1),
            ops.concatenate([state["compressed_mask"], state["memory_mask"]], axis=1),
        )

    def update(self, state, states):
        """The state after a segment's `states (B, T, D)` (stop their gradient first).

        Returns:
            `(new_state, evicted)`: `evicted` is `None` without compression,
            else a dict of what was compressed: `old (B, G, c, D)`,
            `old_mask (B, G, c)`, `compressed (B, G, D)` (with gradient to
            the compression) and `group_mask (B, G)`.
        """
        if not self.built:  # `update` before any call: the compression's weights are made here
            self.build(states.shape)
        steps = ops.shape(states)[1]
        batch = ops.shape(states)[0]
        states = ops.cast(states, state["memory"].dtype)
        full = ops.concatenate([state["memory"], states], axis=1)
        full_mask = ops.concatenate([state["memory_mask"], ops.ones((batch, steps), "bool")], axis=1)
        new_state = {"memory": _last(full, self.memory_length), "memory_mask": _last(full_mask, self.memory_length)}
        if not self.compressive:
            return new_state, None
        left, left_mask = full[:, :steps], full_mask[:, :steps]
        rate = self.compression_rate
        if rate == 1:
            groups, members = left[:, :, None], left_mask[:, :, None]
            appended = ops.zeros((batch,), "int32") + steps
        else:
            # The states waiting from earlier segments, then those leaving now;
            # `waiting` of the c - 1 buffer slots (its last ones) hold states.
            waiting = ops.mod(state["evicted"], rate)
            stream = ops.concatenate([state["pending"], left], axis=1)  # [B, c - 1 + T, D]
            stream_mask = ops.concatenate([state["pending_mask"], left_mask], axis=1)
            count = (rate - 1 + steps) // rate  # groups that can complete now
            first = rate - 1 - waiting  # [B]: where the waiting states start
            index = first[:, None, None] + (ops.arange(count, dtype="int32") * rate)[None, :, None]
            index = ops.minimum(index + ops.arange(rate, dtype="int32")[None, None, :], rate - 2 + steps)
            flat = ops.reshape(index, (batch, count * rate))
            groups = ops.reshape(
                ops.take_along_axis(stream, flat[..., None], axis=1), (batch, count, rate, ops.shape(left)[-1])
            )
            members = ops.reshape(ops.take_along_axis(stream_mask, flat, axis=1), (batch, count, rate))
            appended = (waiting + steps) // rate
            completed = ops.arange(count, dtype="int32")[None, :] < appended[:, None]
            members = ops.logical_and(members, completed[:, :, None])
            new_state["pending"] = _last(stream, rate - 1)
            new_state["pending_mask"] = _last(stream_mask, rate - 1)
        compressed = self._compress_groups(groups)
        group_mask = ops.any(members, axis=-1)
        # The compressed memory keeps its last Cm slots after the groups completed now.
        slots = self.compressed_memory_length
        rows = appended[:, None] + ops.arange(slots, dtype="int32")[None, :]  # [B, Cm]
        combined = ops.concatenate([state["compressed"], ops.stop_gradient(compressed)], axis=1)
        combined_mask = ops.concatenate([state["compressed_mask"], group_mask], axis=1)
        new_state["compressed"] = ops.take_along_axis(combined, rows[..., None], axis=1)
        new_state["compressed_mask"] = ops.take_along_axis(combined_mask, rows, axis=1)
        new_state["evicted"] = state["evicted"] + steps
        evicted = {"old": groups, "old_mask": members, "compressed": compressed, "group_mask": group_mask}
        return new_state, evicted

    def reconstruction_loss(self, attention, queries, evicted, norm=None):
        """Rae et al.'s attention-reconstruction loss for one layer, trained into the compression only.

        `|| attn(h, old) - attn(h, compressed) ||^2`, mean over the queries,
        heads and features: content-based attention of the segment's
        `queries` over the states compressed now and over their
        compression, through `attention`'s projections with their gradient
        stopped (only the compression learns from it). Zero when nothing
        was compressed.

        Args:
            attention: the layer's `MultiHeadAttention`.
            queries: `(B, T, D)` what the layer's attention reads (normalised).
            evicted: the dict of `update`.
            norm: applied to the memory states before attention (the block's
                pre-norm), or `None`.
        """
        old, old_mask = evicted["old"], evicted["old_mask"]
        shape = ops.shape(old)
        old = ops.reshape(old, (shape[0], shape[1] * shape[2], shape[3]))
        old_mask = ops.reshape(old_mask, (shape[0], shape[1] * shape[2]))
        compressed = evicted["compressed"]
        if norm is not None:
            old, compressed = norm(old), norm(compressed)
        queries = ops.stop_gradient(queries)

        def attend(states, mask):
            def project(dense, x, heads):
                y = ops.matmul(x, ops.stop_gradient(ops.cast(dense.kernel, x.dtype)))
                if dense.use_bias:
                    y = y + ops.stop_gradient(ops.cast(dense.bias, x.dtype))
                return ops.reshape(y, (ops.shape(x)[0], ops.shape(x)[1], heads, y.shape[-1] // heads))

            q = project(attention.query_dense, queries, attention.num_heads)
            k = project(attention.key_dense, states, attention.num_key_value_heads)
            v = project(attention.value_dense, states, attention.num_key_value_heads)
            return scaled_dot_product_attention(q, k, v, mask[:, None, :], scale=attention.scale)

        difference = ops.cast(attend(ops.stop_gradient(old), old_mask), "float32") - ops.cast(
            attend(compressed, evicted["group_mask"]), "float32"
        )
        return ops.mean(ops.square(difference))

    def get_config(self):
        config = super().get_config()
        config.update(
            memory_length=self.memory_length,
            compressed_memory_length=self.compressed_memory_length,
            compression_rate=self.compression_rate,
            compression=self.compression,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        return config
