"""GPT-2 small decoding with XLA's CPU code at 256-bit vectors (XLA's default) or 512 (`prefer_wide_vectors`).

    python benchmarks/experiments/vector_width.py [--repeats 2] [--tokens 128]

On a CPU with AVX-512, `keras_tfam.cpu.prefer_wide_vectors()` adds `--xla_cpu_prefer_vector_width=512`
to `XLA_FLAGS`. Each case runs in a fresh process with the width named in `XLA_FLAGS` (which the
library keeps), the cases alternating so that the machine's drift hits both alike. In each process the
same random GPT-2 small (TensorFlow backend) generates `--tokens` greedy tokens after a 32-token prompt
at batch 1 and 8, in float32, bfloat16 (`with_dtype`) and int8 (`quantize("int8")`). It prints the
machine, then tokens/s (best of `--repeats` processes, each the best of 3 generations) and the ratio of
512 to 256 bits; the tokens of both widths must agree (it says where they do not).
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CASES = ("256", "512")
PRECISIONS = ("float32", "bfloat16", "int8")
BATCHES = (1, 8)


def tokens_per_second(width, new_tokens):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_cpu_prefer_vector_width={width}".strip()
    import keras
    import numpy as np

    from keras_tfam.generation import with_dtype
    from keras_tfam.models import GPT2LM

    keras.utils.set_random_seed(0)
    model = GPT2LM(vocabulary_size=50257, num_layers=12, num_heads=12, hidden_dim=768, max_sequence_length=1024)
    model(np.zeros((1, 4), "int32"))
    results = {}
    for precision in PRECISIONS:
        if precision == "bfloat16":
            decoder = with_dtype(model, "bfloat16")
        else:
            decoder = model
            if precision == "int8":
                model.quantize("int8")  # last: it changes the model in place
        for batch in BATCHES:
            prompt = np.random.default_rng(batch).integers(0, 50257, size=(batch, 32)).astype("int32")
            decoder.generate(prompt, max_new_tokens=new_tokens)  # compiles the loop
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                tokens = np.asarray(decoder.generate(prompt, max_new_tokens=new_tokens))
                best = min(best, time.perf_counter() - start)
            results[f"{precision}/{batch}"] = {
                "tokens_per_second": batch * new_tokens / best,
                "tokens": tokens[:, 32:].tolist(),
            }
    return results


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    from timing import case_arguments, cpu, interleaved_processes

    args = case_arguments(__doc__.splitlines()[0], CASES, tokens=128)
    if args.case:
        print(json.dumps(tokens_per_second(args.case, args.tokens)))
        return
    runs = interleaved_processes(__file__, CASES, args.repeats, "--tokens", args.tokens)
    print(f"machine: {cpu()}")
    print(f"GPT-2 small, random weights, {args.tokens} greedy tokens after 32, TensorFlow, best of {args.repeats}")
    print("| weights | batch | 256-bit tok/s | 512-bit tok/s | 512 / 256 | same tokens |")
    print("|---|---:|---:|---:|---:|---|")
    for precision in PRECISIONS:
        for batch in BATCHES:
            key = f"{precision}/{batch}"
            best = {case: max(run[key]["tokens_per_second"] for run in runs[case]) for case in CASES}
            same = runs["256"][-1][key]["tokens"] == runs["512"][-1][key]["tokens"]
            print(
                f"| {precision} | {batch} | {best['256']:.1f} | {best['512']:.1f} | "
                f"{best['512'] / best['256']:.2f}x | {'yes' if same else 'no'} |"
            )


if __name__ == "__main__":
    main()
