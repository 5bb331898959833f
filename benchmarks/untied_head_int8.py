"""int8 decoding of a Llama-shaped model at batch 1: its untied head as Keras' `Dense` or the library's.

    python benchmarks/untied_head_int8.py [--repeats 2] [--tokens 64]

The Llama family's output head is a `(hidden, vocabulary)` matrix of its own (`tie_embeddings=False`),
here a third of the weights. Quantized, Keras' int8 `Dense` multiplies it as XLA's int8 dot, which
XLA's CPU backend converts to a four-byte copy; the library's `Dense` multiplies one row by int8 rows,
one byte a weight (`keras_tfam.utils.int8_rows_product`). The same random model (8 layers, width 768,
12 heads over 4 key/value heads, SwiGLU 2048, vocabulary 32000, rotary, RMS norm, no biases) is built
with either head, quantized to int8, and generates `--tokens` greedy tokens after a 32-token prompt,
TensorFlow backend; each case in a fresh process, the cases alternating. It prints the machine, then
tokens/s (best of `--repeats` processes, each the best of 3 generations) and the last tokens, which
must agree.
"""

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CASES = ("Keras' Dense", "keras_tfam Dense")


def tokens_per_second(case, new_tokens):
    import keras
    import numpy as np

    import keras_tfam.models.decoder_lm as decoder_lm

    if case == "Keras' Dense":
        decoder_lm.Dense = keras.layers.Dense  # the head as it was built before
    keras.utils.set_random_seed(0)
    model = decoder_lm.DecoderLM(
        vocabulary_size=32000, num_layers=8, num_heads=12, hidden_dim=768, intermediate_dim=2048,
        num_key_value_heads=4, max_sequence_length=256, position="rotary", norm="rms", activation="swiglu",
        use_bias=False, tie_embeddings=False,
    )
    model(np.zeros((1, 4), "int32"))
    model.quantize("int8")
    prompt = np.random.default_rng(0).integers(0, 32000, size=(1, 32)).tolist()
    model.generate(prompt, max_new_tokens=new_tokens)  # compiles the loop
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        tokens = model.generate(prompt, max_new_tokens=new_tokens)
        best = min(best, time.perf_counter() - start)
    return new_tokens / best, np.asarray(tokens)[0, -8:].tolist()


def main():
    from timing import case_arguments, cpu, interleaved_processes

    args = case_arguments(__doc__.splitlines()[0], CASES, tokens=64)
    if args.case:
        rate, last = tokens_per_second(args.case, args.tokens)
        print(json.dumps({"tokens_per_second": rate, "last_tokens": last}))
        return
    runs = interleaved_processes(__file__, CASES, args.repeats, "--tokens", args.tokens)
    best = {case: max(run["tokens_per_second"] for run in results) for case, results in runs.items()}
    last = {case: results[-1]["last_tokens"] for case, results in runs.items()}
    print(f"machine: {cpu()}")
    print(f"Llama-shaped random model, int8, batch 1, {args.tokens} greedy tokens after 32, best of {args.repeats}")
    print("| untied head | tok/s | vs Keras' Dense | last tokens |")
    print("|---|---:|---:|---|")
    for case in CASES:
        print(f"| {case} | {best[case]:.1f} | {best[case] / best[CASES[0]]:.2f}x | {last[case]} |")


if __name__ == "__main__":
    main()
