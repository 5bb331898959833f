"""Wrote these .keras files and logits with keras_tfam 0.2.0 at bcd502a (before the attention contract)."""

import os

import keras
import numpy as np

from keras_tfam.models import GPT2LM

keras.utils.set_random_seed(0)

out = "tests/data/legacy"
ids = np.array([[3, 14, 15, 9, 2, 6, 5, 3, 5, 8, 9, 7]], "int32")
configs = {
    "gpt2_softmax_rotary_gqa_local": dict(position="rotary", num_key_value_heads=1, local_window=4),
    "gpt2_linear": dict(attention="linear", position="rotary"),
    "gpt2_performer": dict(attention="performer", attention_options={"num_features": 16, "seed": 1}),
    "gpt2_lsh": dict(
        attention="lsh", position="rotary", attention_options={"num_buckets": 4, "chunk_length": 64, "seed": 2}
    ),
    "gpt2_routing": dict(attention="routing", attention_options={"num_clusters": 2, "chunk_length": 64, "seed": 3}),
    "gpt2_alibi_pattern": dict(position="alibi", attention_options={"pattern": {"name": "strided", "stride": 4}}),
}
for name, extra in configs.items():
    model = GPT2LM(vocabulary_size=16, num_layers=2, num_heads=2, hidden_dim=16, max_sequence_length=32, **extra)
    path = os.path.join(out, name + ".keras")
    model.save(path)
    np.save(os.path.join(out, name + ".logits.npy"), np.asarray(model(ids), np.float32))
print(sorted(os.listdir(out)))
