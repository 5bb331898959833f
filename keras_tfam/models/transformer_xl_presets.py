"""Transformer-XL family sizes by name: small models for training on a CPU and for tests."""

_TINY = {"num_layers": 4, "num_heads": 4, "hidden_dim": 256, "memory_length": 128, "dropout": 0.1}

TRANSFORMER_XL_PRESETS = {
    # Dai et al. 2019: memory of 128 states per layer.
    "transformer_xl_tiny": dict(_TINY),
    # Rae et al. 2020: 64 states, then 64 slots compressed 4x by a 1-D convolution (320 states back).
    "compressive_transformer_tiny": {
        **_TINY,
        "memory_length": 64,
        "compressed_memory_length": 64,
        "compression_rate": 4,
        "compression": "conv",
    },
    # Parisotto et al. 2020: GRU gates in place of the residual connections.
    "gtrxl_tiny": {**_TINY, "residual": "gru"},
    # Sukhbaatar et al. 2019: spans learned up to 256 tokens over a memory of 256.
    "adaptive_span_tiny": {**_TINY, "memory_length": 256, "max_span": 256, "span_ramp": 32},
}
