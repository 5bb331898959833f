"""The greedy token of GPT-2 small's 50,257 logits in a compiled decoding loop: `ops.argmax` or `first_argmax`.

    python benchmarks/experiments/argmax.py [--repeats 5] [--steps 32]      # KERAS_BACKEND=jax for JAX

One compiled `while` loop of `--steps` steps (TensorFlow: `tf.function(jit_compile=True)`; JAX:
`jax.jit`), each taking the token of 1 or 8 rows of float32 logits that a division computes inside the
step, as a head's dequantization or a temperature does, and feeding the tokens back into the next step's
logits. Keras' `ops.argmax` (one reduction of (value, index) pairs) against
`keras_tfam.generation.samplers.first_argmax` (the maximum, then the first indices holding it and a NaN).
It prints microseconds per step, best of `--repeats` interleaved series, and whether both gave the same
tokens.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/timing.py

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

VOCABULARY = 50257


def main():
    from timing import loop_arguments

    args = loop_arguments(__doc__.splitlines()[0])
    import keras
    import numpy as np
    from keras import ops
    from timing import best_interleaved, cpu

    from keras_tfam.generation.generator import compile_function
    from keras_tfam.generation.samplers import first_argmax

    forms = {"ops.argmax": lambda x: ops.cast(ops.argmax(x, axis=-1), "int32"), "first_argmax": first_argmax}

    def loop(token_of, rows):
        def run(logits, scale):
            def body(step, logits, tokens):
                token = token_of(logits / scale)
                logits = logits + ops.cast(ops.expand_dims(token % 3, 1), "float32") * 1e-7  # the next step's
                return step + 1, logits, tokens + token

            start = (0, logits, ops.zeros((rows,), "int32"))
            return ops.while_loop(lambda step, *_: step < args.steps, body, start)[2]

        return compile_function(run, None)

    print(f"machine: {cpu()}; Keras backend: {keras.config.backend()}")
    print(f"{VOCABULARY} logits a row, {args.steps} loop steps per call, best of {args.repeats}\n")
    print("| rows | ops.argmax, us per step | first_argmax, us per step | ops.argmax / first_argmax | same tokens |")
    print("|---:|---:|---:|---:|---|")
    for rows in (1, 8):
        logits = np.random.default_rng(rows).standard_normal((rows, VOCABULARY)).astype("float32")
        scale = np.float32(3.0)
        compiled = {name: loop(token_of, rows) for name, token_of in forms.items()}
        tokens = {name: ops.convert_to_numpy(run(logits, scale)) for name, run in compiled.items()}  # compiles
        best = best_interleaved(
            {name: lambda run=run: ops.convert_to_numpy(run(logits, scale)) for name, run in compiled.items()},
            args.repeats,
            per_call=args.steps,
        )
        same = np.array_equal(tokens["ops.argmax"], tokens["first_argmax"])
        theirs, ours = best["ops.argmax"] * 1e6, best["first_argmax"] * 1e6
        print(f"| {rows} | {theirs:.1f} | {ours:.1f} | {theirs / ours:.2f}x | {'yes' if same else 'no'} |")


if __name__ == "__main__":
    main()
