"""What the encoder and decoder blocks share: options, residual wiring, feed-forward."""

import keras

from keras_tfam.layers.attention.multi_head_attention import MultiHeadAttention
from keras_tfam.layers.blocks.feed_forward import FeedForward
from keras_tfam.layers.normalization.get_norm import check_norm, get_norm
from keras_tfam.utils import check_positive_int, head_size

NORM_POSITIONS = ("pre", "post")


class TransformerBlockBase(keras.layers.Layer):
    """Base of `TransformerEncoderBlock` and `TransformerDecoderBlock`.

    Holds the shared constructor arguments (see the subclasses), builds the
    feed-forward sublayer and the norms, and wires each sublayer into the
    residual stream: pre-norm `x + dropout(f(norm(x)))` (Xiong et al. 2020,
    GPT-2) or post-norm `norm(x + dropout(f(x)))` (Vaswani et al. 2017).
    A subclass's `call` reads as its residual lines:
    `y = f(self._branch_input(norm, x)); x = self._add_branch(norm, x, y, training)`.
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        key_dim=None,
        num_key_value_heads=None,
        dropout=0.0,
        attention_dropout=0.0,
        activation="gelu",
        norm="layer",
        norm_position="post",
        norm_epsilon=1e-5,
        use_bias=True,
        position=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        output_kernel_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("intermediate_dim", intermediate_dim)
        for name, rate in (("dropout", dropout), ("attention_dropout", attention_dropout)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1). Received: {name}={rate}")
        check_norm(norm)
        if norm_position not in NORM_POSITIONS:
            raise ValueError(
                f"`norm_position` must be one of {NORM_POSITIONS}. Received: norm_position={norm_position!r}"
            )
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.key_dim = key_dim
        self.num_key_value_heads = num_key_value_heads
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation = activation
        self.norm = norm
        self.norm_position = norm_position
        self.norm_epsilon = norm_epsilon
        self.use_bias = use_bias
        self.position = position
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.output_kernel_initializer = keras.initializers.get(output_kernel_initializer or kernel_initializer)
        self.supports_masking = True

    def _check_injected(self, name, layer):
        if layer is not None and not isinstance(layer, keras.layers.Layer):
            raise ValueError(f"`{name}` must be a Keras layer or None. Received: {name}={layer!r}")
        if layer is not None and self.position is not None and name != "cross_attention":
            raise ValueError(
                f"`position` configures the default attention only; give the position scheme "
                f"to the injected `{name}` layer instead. Received: {name}={layer!r}, "
                f"position={self.position!r}"
            )

    def _make_norm(self, name, shape):
        layer = get_norm(self.norm, self.norm_epsilon, dtype=self.dtype_policy, name=name)
        layer.build(shape)
        return layer

    def _make_attention(self, name, hidden_dim, position):
        key_dim = self.key_dim
        if key_dim is None:
            key_dim = head_size("hidden size", hidden_dim, self.num_heads)
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=key_dim,
            num_key_value_heads=self.num_key_value_heads,
            use_bias=self.use_bias,
            dropout=self.attention_dropout,
            position=position,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            output_kernel_initializer=self.output_kernel_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def _build_feed_forward(self, inputs_shape):
        self.feed_forward_norm = self._make_norm("feed_forward_norm", inputs_shape)
        self.feed_forward = FeedForward(
            self.intermediate_dim,
            activation=self.activation,
            dropout=self.dropout,
            use_bias=self.use_bias,
            kernel_initializer=self.kernel_initializer,
            bias_initializer=self.bias_initializer,
            output_kernel_initializer=self.output_kernel_initializer,
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.feed_forward.build(inputs_shape)
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def _branch_input(self, norm, x):
        """What a residual branch reads: `norm(x)` (pre-norm) or `x` (post-norm)."""
        return norm(x) if self.norm_position == "pre" else x

    def _add_branch(self, norm, x, y, training):
        """The stream after a branch: `x + y` (pre-norm) or `norm(x + y)` (post-norm), `y` dropped out."""
        x = x + self.dropout_layer(y, training=training)
        return x if self.norm_position == "pre" else norm(x)

    def _feed_forward_branch(self, x, training):
        y = self.feed_forward(self._branch_input(self.feed_forward_norm, x), training=training)
        return self._add_branch(self.feed_forward_norm, x, y, training)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim,
            key_dim=self.key_dim,
            num_key_value_heads=self.num_key_value_heads,
            dropout=self.dropout,
            attention_dropout=self.attention_dropout,
            activation=self.activation,
            norm=self.norm,
            norm_position=self.norm_position,
            norm_epsilon=self.norm_epsilon,
            use_bias=self.use_bias,
            position=keras.saving.serialize_keras_object(self.position),
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            bias_initializer=keras.initializers.serialize(self.bias_initializer),
            output_kernel_initializer=keras.initializers.serialize(self.output_kernel_initializer),
        )
        return config

    # Arguments holding layers arrive serialized.
    _LAYER_ARGUMENTS = ("position",)

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for name in cls._LAYER_ARGUMENTS:
            config[name] = keras.saving.deserialize_keras_object(config.get(name))
        return cls(**config)
