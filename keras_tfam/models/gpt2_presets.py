"""GPT-2 sizes by name (Radford et al. 2019, table 2; 124M/355M/774M/1.5B as released)."""

_GPT2 = {"vocabulary_size": 50257, "max_sequence_length": 1024, "dropout": 0.1}

GPT2_PRESETS = {
    # A small model for training on a CPU and for tests.
    "gpt2_tiny": {**_GPT2, "num_layers": 4, "num_heads": 4, "hidden_dim": 256, "max_sequence_length": 512},
    "gpt2_small": {**_GPT2, "num_layers": 12, "num_heads": 12, "hidden_dim": 768},
    "gpt2_medium": {**_GPT2, "num_layers": 24, "num_heads": 16, "hidden_dim": 1024},
    "gpt2_large": {**_GPT2, "num_layers": 36, "num_heads": 20, "hidden_dim": 1280},
    "gpt2_xl": {**_GPT2, "num_layers": 48, "num_heads": 25, "hidden_dim": 1600},
}
