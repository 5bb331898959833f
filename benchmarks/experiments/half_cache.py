"""16-bit decoding with the cache held as its bits against the cache held as 16-bit floats (TensorFlow or JAX).

    python benchmarks/experiments/half_cache.py [--precision bfloat16] [--batch 1 8] [--repeats 5]

XLA's CPU backend writes a bfloat16 or float16 tensor in float32: each step's write of the new keys and
values widens the whole cache, writes them and narrows it back, a copy of the cache per layer and
step. The XLA-CPU engine (`keras_tfam.engine.xla_cpu`) therefore stores a 16-bit float cache as its bits
(`uint16`, `int16`), which XLA writes in place. This script decodes with GPT-2 small (random weights, a
32-token prompt, 16-bit weights from `generation.with_dtype`) in two models with the same weights: one in
the XLA-CPU engine, one in that engine with its cache hooks those of the plain engine (caches held as
floats). The `generate`
calls of the two are interleaved, 8 and 136 new tokens each, so that the machine's drift hits both;
the step is the difference of the best calls, the setup what the 8-token call took beyond its steps.
It prints a table, and whether the tokens agree.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

SHORT, LONG = 8, 136  # new tokens of the two calls, as timing.step_and_setup


def float_caches_engine():
    """The XLA-CPU engine with 16-bit float caches of their own dtype: the plain engine's cache hooks."""
    from keras_tfam.engine import Engine
    from keras_tfam.engine.xla_cpu import XlaCpuEngine

    class FloatCaches(XlaCpuEngine):
        name = "xla_cpu_float_caches"
        cache_dtype = Engine.cache_dtype
        cache_value_dtype = Engine.cache_value_dtype
        cache_values = Engine.cache_values
        cache_stored = Engine.cache_stored

    return FloatCaches()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="rows decoded together")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved calls of each; the best counts")
    args = parser.parse_args()
    from timing import refuse_non_positive

    refuse_non_positive(parser, args, "repeats")
    if min(args.batch) < 1:
        parser.error(f"argument --batch: each must be a positive integer. Received: {min(args.batch)}")
    import numpy as np
    from timing import best_interleaved, gpt2_small, machine, step_and_setup_of

    from keras_tfam.engine.xla_cpu import XLA_CPU

    models = {"bits": gpt2_small(args.precision), "floats": gpt2_small(args.precision)}  # seed 0: same weights
    engines = {"bits": XLA_CPU, "floats": float_caches_engine()}
    print(f"machine: {machine()}")
    print(
        f"GPT-2 small, {args.precision} weights, prompt 32, steps from calls of {SHORT} and {LONG} new tokens, "
        f"best of {args.repeats} interleaved"
    )
    print("| batch | cache held as | ms per step | setup, ms | tok/s, 128 new | floats / bits, step | same tokens |")
    print("|---:|---|---:|---:|---:|---:|---|")
    for batch in args.batch:
        prompt = np.random.default_rng(0).integers(0, 50257, size=(batch, 32)).astype("int32")

        def call(name, new):
            return np.asarray(models[name].generate(prompt, max_new_tokens=new, engine=engines[name]))

        tokens = {name: [call(name, new) for new in (SHORT, LONG)][-1] for name in models}  # compiles
        calls = {(name, new): (lambda name=name, new=new: call(name, new)) for name in models for new in (SHORT, LONG)}
        best = best_interleaved(calls, args.repeats)
        timed = {
            name: step_and_setup_of({new: best[name, new] for new in (SHORT, LONG)}, SHORT, LONG) for name in models
        }
        same = "yes" if np.array_equal(tokens["bits"], tokens["floats"]) else "no"
        ratio = f"{timed['floats'][0] / timed['bits'][0]:.2f}x"
        for name, label in (
            ("bits", f"bits (`{'uint16' if args.precision == 'bfloat16' else 'int16'}`)"),
            ("floats", f"`{args.precision}`"),
        ):
            step, setup = timed[name]
            rate = batch * (LONG - SHORT) / (setup + (LONG - SHORT) * step)
            print(
                f"| {batch} | {label} | {step * 1e3:.2f} | {setup * 1e3:.0f} | {rate:.1f} | "
                f"{ratio if name == 'bits' else ''} | {same} |"
            )


if __name__ == "__main__":
    main()
