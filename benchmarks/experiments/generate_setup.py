"""What a `generate` call costs before its first token, with TensorFlow's tensor memory pooled or not.

    python benchmarks/experiments/generate_setup.py [--repeats 3]

A `generate` call of GPT-2 small (random weights, batch 1, a 32-token prompt) runs one compiled program:
it copies the weights it reads as rows (`keras_tfam.engine.xla_cpu.XlaCpuEngine.loop`; a 16-bit model also widens
its weights for the prompt's products), runs the prompt, then one loop step per token. Every call
allocates those temporaries anew. With TensorFlow's default CPU allocator each large block comes from
the system and is faulted in page by page; pooled (its BFC allocator, `TF_CPU_ALLOCATOR_USE_BFC=true`,
what `keras_tfam.cpu.configure()` asks for), freed blocks serve the
next call.

Each case runs in a fresh process (the allocator is chosen at a process's first tensor), the cases
alternating. A process times calls of 8 and of 136 new tokens, interleaved, 4 each: the step is the
difference of the best times over 128 tokens, and the setup is what the best 8-token call took beyond
its 8 steps (the copies, the prompt and the allocations). It prints, per case, the median over the
processes of the step, the setup, and tokens/s of a 128-token call, with each process's figures.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

PRECISIONS = ("float32", "bfloat16", "int8")
MEMORY = {"pooled": "true", "default": "false"}
SHORT, LONG, PROMPT, CALLS = 8, 136, 32, 4


def measure(precision):
    import json

    import numpy as np
    from timing import gpt2_small, step_and_setup

    model = gpt2_small(precision)
    ids = np.random.default_rng(0).integers(0, 50257, size=(1, PROMPT)).astype("int32")
    result = step_and_setup(model, ids, SHORT, LONG, CALLS)
    print(json.dumps({key: result[key] for key in ("step_ms", "setup_ms", "tokens_per_s")}))


def main():
    from timing import case_arguments, cpu, interleaved_processes, median_step_and_setup

    cases = [f"{precision}-{memory}" for precision in PRECISIONS for memory in MEMORY]
    args = case_arguments(__doc__.splitlines()[0], cases, repeats=3)
    if args.case:
        precision, memory = args.case.rsplit("-", 1)
        os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = MEMORY[memory]  # before keras_tfam, which keeps a value set
        return measure(precision)
    results = interleaved_processes(os.path.abspath(__file__), cases, args.repeats)
    print(f"machine: {cpu()}")
    print(f"GPT-2 small, random weights, batch 1, prompt {PROMPT}; medians of {args.repeats} processes per case\n")
    print("| weights | tensor memory | ms per step | setup, ms | tok/s, 128 new | setups, ms |")
    print("|---|---|---:|---:|---:|---|")
    for case in cases:
        runs = results[case]
        precision, memory = case.rsplit("-", 1)
        median, setups = median_step_and_setup(runs)
        print(
            f"| {precision} | {memory} | {median['step_ms']:.2f} | {median['setup_ms']:.0f} | "
            f"{median['tokens_per_s']:.1f} | {setups} |"
        )


if __name__ == "__main__":
    main()
