"""A `generate` call at batch 1 with only the row copies its loop reads, or with every kernel copied.

    python benchmarks/one_row_copies.py [--repeats 4]            # KERAS_BACKEND=jax for JAX

`keras_tfam.utils.kernels_as_rows` copies kernels to float32 rows before the decoding loop, for the
product of a few rows. A loop of one row reads those copies only for float32 kernels under TensorFlow
(`one_row_by_rows`), so at batch 1 the generator has the others left uncopied (`one_row_reads_kernel_rows`):
their copies would serve the prompt's one pass alone. This measures both rules: `loop-reads` (the
library's) and `all` (the rule before, restored by a patch of the generator's `kernels_as_rows`).

GPT-2 small (random weights, batch 1, a 32-token prompt), float32 and bfloat16 weights, each case in a fresh
process, the cases alternating. A process times calls of 8 and 136 new tokens, 4 each: the step is the
difference of the best times over 128 tokens, the setup what the best 8-token call took beyond its 8
steps. It prints per case the medians over the processes and each process's setup, and whether every
process decoded the same tokens.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

PRECISIONS = ("bfloat16", "float32")
RULES = ("loop-reads", "all")
SHORT, LONG, PROMPT, CALLS = 8, 136, 32, 4


def measure(precision, rule):
    import json
    import resource

    import numpy as np
    from timing import gpt2_small, step_and_setup

    from keras_tfam import utils
    from keras_tfam.generation import decoding

    if rule == "all":
        library_rule = utils.kernels_as_rows
        decoding.kernels_as_rows = lambda variables, rows=None: library_rule(variables)
    model = gpt2_small(precision)
    ids = np.random.default_rng(0).integers(0, 50257, size=(1, PROMPT)).astype("int32")
    result = step_and_setup(model, ids, SHORT, LONG, CALLS)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def main():
    from timing import case_arguments, cpu, interleaved_processes, median_step_and_setup

    cases = [f"{precision}-{rule}" for precision in PRECISIONS for rule in RULES]
    args = case_arguments(__doc__.splitlines()[0], cases, repeats=4)
    if args.case:
        precision, rule = args.case.split("-", 1)
        return measure(precision, rule)
    results = interleaved_processes(os.path.abspath(__file__), cases, args.repeats)
    print(f"machine: {cpu()}; Keras backend: {os.environ['KERAS_BACKEND']}")
    print(f"GPT-2 small, random weights, batch 1, prompt {PROMPT}; medians of {args.repeats} processes per case\n")
    print("| weights | row copies | ms per step | setup, ms | tok/s, 128 new | peak RSS, MB | setups, ms | same tokens |")
    print("|---|---|---:|---:|---:|---:|---|---|")
    for case in cases:
        runs = results[case]
        precision, rule = case.split("-", 1)
        median, setups = median_step_and_setup(runs)
        same = all(run["tokens"] == results[f"{precision}-{RULES[0]}"][0]["tokens"] for run in runs)
        print(f"| {precision} | {rule} | {median['step_ms']:.2f} | {median['setup_ms']:.0f} | "
              f"{median['tokens_per_s']:.1f} | {median['peak_rss_mb']:.0f} | {setups} | {'yes' if same else 'no'} |")


if __name__ == "__main__":
    main()
