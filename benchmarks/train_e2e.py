"""End-to-end training tokens/s: `tfam train` (gpt2_tiny) vs keras-hub's GPT2Backbone in a plain fit.

    python benchmarks/train_e2e.py [--data-dir ../shared/data/wikitext-2 --steps 60]

Both train on the same batches (the WikiText-2 validation split, word-level
tokens, 16 x 128 per step) with the same optimizer (AdamW, warmup + cosine,
clipping), float32, XLA. keras_tfam runs the full `tfam train` pipeline
(callbacks, backups and TensorBoard included; evaluation only at the end, outside
the timing); keras-hub runs `GPT2Backbone` (same sizes) + its tied
`ReversibleEmbedding` head in `model.fit`. Tokens/s exclude the first step of
each epoch (compilation).
"""

import argparse
import os
import shutil
import tempfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import keras_hub  # noqa: E402
from timing import add_smoke, machine, small_wikitext, smoke_settings  # noqa: E402

from pipelines.callbacks import ThroughputMonitor  # noqa: E402
from pipelines.config import load_config  # noqa: E402
from pipelines.data.lm_stream import lm_dataset  # noqa: E402
from pipelines.data.tokenizers import load_tokenizer  # noqa: E402
from pipelines.run_data import cached_tokens, split_text  # noqa: E402
from pipelines.training import build_optimizer, train  # noqa: E402


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.path.join("..", "shared", "data", "wikitext-2"))
    parser.add_argument("--steps", type=int, default=60)
    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), steps=6)
    run = tempfile.mkdtemp(prefix="tfam-bench-")
    # gpt2_tiny's sizes (4 x 256, 4 heads, 16 x 128 tokens per step); a tiny model under --smoke.
    layers, heads, width, batch, length = (1, 2, 32, 4, 32) if args.smoke else (4, 4, 256, 16, 128)
    smoke = dict(num_layers=layers, num_heads=heads, hidden_dim=width, batch_size=batch, sequence_length=length)
    smoke.update(export=False, jit="on", precision="float32")
    try:
        if args.smoke:
            args.data_dir = small_wikitext(os.path.join(run, "wikitext-2"))
        config = load_config(
            "gpt2_tiny",
            {
                "data_dir": args.data_dir,
                "train_split": "valid",
                "eval_split": "test",
                "max_steps": args.steps,
                "eval_every": args.steps,
                "backup_every": args.steps // 3,
                "samples": 0,
                "dropout": 0.0,
                "out": os.path.join(run, "run") if args.smoke else run,
                **(smoke if args.smoke else {}),
            },
        )
        summary = train(config)
        ours = summary["tokens_per_second"]

        import numpy as np

        tokenizer = load_tokenizer(os.path.join(config.out, "tokenizer"))
        tokens = cached_tokens(config.out, tokenizer, split_text(config, "valid"), "valid")  # the run's cache
        data = lm_dataset(
            tokens, length, batch, tokenizer.eos_id, shuffle=True, seed=0, drop_remainder=True, repeat=True
        )
        keras.utils.set_random_seed(0)
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=tokenizer.vocabulary_size,
            num_layers=layers,
            num_heads=heads,
            hidden_dim=width,
            intermediate_dim=4 * width,
            max_sequence_length=512,
            dropout=0.0,
        )
        token_ids = keras.Input((None,), dtype="int32")
        hidden = backbone({"token_ids": token_ids, "padding_mask": keras.ops.ones_like(token_ids)})
        theirs = keras.Model(token_ids, backbone.token_embedding(hidden, reverse=True))
        theirs.compile(
            build_optimizer(config), keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True
        )
        monitor = ThroughputMonitor(batch * length)
        theirs.fit(data, steps_per_epoch=args.steps // 3, epochs=3, shuffle=False, callbacks=[monitor], verbose=0)
        keras_hub_rate = float(np.median(monitor.rates))
    finally:
        shutil.rmtree(run, ignore_errors=True)
    print(f"machine: {machine()}")
    print(
        f"gpt2_tiny ({layers} x {width}, vocab {tokenizer.vocabulary_size}), {batch} x {length} tokens/step, "
        f"{args.steps} steps, float32, XLA"
    )
    print(
        f"tfam train {ours:8.0f} tok/s   keras-hub GPT2Backbone fit {keras_hub_rate:8.0f} tok/s   "
        f"ratio {ours / keras_hub_rate:.2f}x"
    )


if __name__ == "__main__":
    main()
