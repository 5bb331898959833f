"""Whether greedy decoding keeps every core busy: tokens/s and CPU-seconds per second, per weight width.

    python benchmarks/experiments/decode_cpu_use.py [--repeats 3] [--tokens 128]

GPT-2 small (random weights, a 32-token prompt) at batch 1 and batch 8, in float32, bfloat16
(`generation.with_dtype`) and int8 (`quantize("int8")`), each case in its own process. A process compiles
with one call, then times `--repeats` calls, and reads the process's CPU time around each
(`time.process_time`: every thread). A figure near the machine's core count means no core waits idle; one
near 1 would leave a core to a second thread of work.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

PRECISIONS = ("float32", "bfloat16", "int8")
BATCHES = (1, 8)
PROMPT = 32


def measure(precision, batch, tokens, calls):
    import json
    import time

    import numpy as np
    from timing import gpt2_small

    model = gpt2_small(precision)
    ids = np.random.default_rng(0).integers(0, 50257, size=(batch, PROMPT)).astype("int32")
    model.generate(ids, max_new_tokens=tokens)  # compiles
    runs = []
    for _ in range(calls):
        cpu, wall = time.process_time(), time.perf_counter()
        np.asarray(model.generate(ids, max_new_tokens=tokens))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        runs.append({"tokens_per_s": tokens * batch / wall, "cpu_per_s": cpu / wall})
    print(json.dumps(runs))


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    import argparse
    import warnings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per case")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per call")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # PRECISION-BATCH: one case, in this process
    args = parser.parse_args()
    from timing import cpu, refuse_non_positive, run_json

    refuse_non_positive(parser, args, "repeats", "tokens")
    if args.case:
        warnings.simplefilter("ignore")  # Keras' warning for each layer without a `quantize`
        precision, batch = args.case.rsplit("-", 1)
        return measure(precision, int(batch), args.tokens, args.repeats)
    print(f"machine: {cpu()}")
    print(f"GPT-2 small, random weights, prompt {PROMPT}, {args.tokens} new tokens, greedy, {args.repeats} calls\n")
    print("| weights | batch | tok/s | CPU-s per s |")
    print("|---|---:|---|---|")
    for precision in PRECISIONS:
        for batch in BATCHES:
            runs = run_json(
                os.path.abspath(__file__),
                f"--case={precision}-{batch}",
                f"--repeats={args.repeats}",
                f"--tokens={args.tokens}",
            )
            speeds = ", ".join(f"{run['tokens_per_s']:.1f}" for run in runs)
            use = [run["cpu_per_s"] for run in runs]
            print(f"| {precision} | {batch} | {speeds} | {min(use):.2f}-{max(use):.2f} |")


if __name__ == "__main__":
    main()
