"""Batch-1 float32 decoding with the kernels' rows against Keras' `(K, N)` kernels (TensorFlow, a CPU).

    python benchmarks/one_row_rows.py [--repeats 5] [--new 128]

Inside the generator's loop, `keras_tfam.layers.Dense` multiplies one row by the rows `(N, K)` that
`keras_tfam.utils.kernels_as_rows` copies of its kernel before the loop (`rows @ x`,
`keras_tfam.utils.one_row_by_rows`). This script decodes with GPT-2 small (random weights, a 32-token
prompt) twice, in two models with the same weights: one as the library does, one whose `Dense` layers
were traced with that path turned off (Keras' `x @ kernel`, the bias added as `x - (-b)`), and times
the two `generate` calls interleaved, so that the machine's drift hits both. The copy of the rows
(made in every call) is in the time. It prints tokens/s, ms per step, and whether the tokens agree.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved calls of each; the best counts")
    parser.add_argument("--new", type=int, default=128, help="tokens generated per call")
    args = parser.parse_args()
    from timing import refuse_non_positive

    refuse_non_positive(parser, args, "repeats", "new")
    import keras
    import numpy as np
    from timing import best_interleaved, machine

    from keras_tfam.layers.core import dense
    from keras_tfam.models import GPT2LM

    keras.utils.set_random_seed(0)

    def gpt2_small():
        return GPT2LM(vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768, max_sequence_length=1024)

    rows, kernels = gpt2_small(), gpt2_small()
    kernels.set_weights(rows.get_weights())
    prompt = np.random.default_rng(0).integers(0, 50257, size=(1, 32)).tolist()
    tokens = {"rows": rows.generate(prompt, max_new_tokens=args.new)}  # traced and compiled with the path
    library_rule = dense.takes_one_row_by_rows
    dense.takes_one_row_by_rows = lambda inputs, weights: False
    try:
        tokens["kernels"] = kernels.generate(prompt, max_new_tokens=args.new)  # ... and without it
    finally:
        dense.takes_one_row_by_rows = library_rule
    calls = {name: (lambda model=model: model.generate(prompt, max_new_tokens=args.new))
             for name, model in (("rows", rows), ("kernels", kernels))}
    best = best_interleaved(calls, args.repeats, per_call=args.new)
    print(f"machine: {machine()}")
    print(f"GPT-2 small, float32, batch 1, prompt 32, {args.new} new tokens, best of {args.repeats}; "
          f"same tokens: {np.array_equal(np.asarray(tokens['rows']), np.asarray(tokens['kernels']))}")
    print("| one-row product | tok/s | ms per step |")
    print("|---|---:|---:|")
    for name, label in (("kernels", "`x @ kernel` (Keras' layout)"), ("rows", "`rows @ x` (rows copied before the loop)")):
        print(f"| {label} | {1 / best[name]:.1f} | {best[name] * 1e3:.2f} |")
    print(f"rows / kernels: {best['kernels'] / best['rows']:.2f}x")


if __name__ == "__main__":
    main()
