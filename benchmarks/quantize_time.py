"""How long `model.quantize("int8")` takes on GPT-2 small: ours, ours with Keras' collection per deleted
variable, and keras-hub's GPT2CausalLM.

    python benchmarks/quantize_time.py [--repeats 3]

Keras' `Layer.__delattr__` runs a full `gc.collect()` each time a variable attribute is deleted, and
quantizing a layer deletes its float kernel: one pass over every object of the process per layer (73 for
GPT-2 small), each longer the more the process holds (TensorFlow, the model). The library's `Dense` and
`TiedEmbedding` untrack the variable as Keras does without the collection (`FreesDeletedVariables`):
a variable is in no reference cycle, its buffer is freed when its last reference goes.

Each case in a fresh process that imports the same modules and builds the same random GPT-2 small
(12 layers, width 768, vocabulary 50257, 1024 positions), then times `quantize("int8")` alone:

- `keras_tfam`: the library's GPT2LM;
- `keras_tfam, Keras' collection`: the same, with `Layer.__delattr__` (and its collection) restored;
- `keras-hub`: keras_hub.models.GPT2CausalLM over a GPT2Backbone of the same shape.

It prints the machine, then seconds per quantize (best of `--repeats` processes) and the ratios.
"""

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CASES = ("keras_tfam", "keras_tfam, Keras' collection", "keras-hub")
SHAPE = {"vocabulary_size": 50257, "num_layers": 12, "num_heads": 12, "hidden_dim": 768}
SMOKE_SHAPE = {"vocabulary_size": 256, "num_layers": 1, "num_heads": 2, "hidden_dim": 32}
SMOKE_CASES = ("keras_tfam", "keras-hub")  # --smoke: one process per model (the second case patches the first's)


def quantize_seconds(case, shape=SHAPE):
    import keras
    import keras_hub

    from keras_tfam.keras_compat import FreesDeletedVariables
    from keras_tfam.models import GPT2LM

    if case == "keras-hub":
        backbone = keras_hub.models.GPT2Backbone(
            **shape, intermediate_dim=4 * shape["hidden_dim"], max_sequence_length=1024, dropout=0.0
        )
        model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
        model({"token_ids": keras.ops.zeros((1, 4), "int32"), "padding_mask": keras.ops.ones((1, 4), "bool")})
    else:
        if case == "keras_tfam, Keras' collection":
            FreesDeletedVariables.__delattr__ = keras.layers.Layer.__delattr__
        model = GPT2LM(**shape, max_sequence_length=1024)
        model(keras.ops.zeros((1, 4), "int32"))
    start = time.perf_counter()
    model.quantize("int8")
    return time.perf_counter() - start


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    from timing import case_arguments, cpu, interleaved_processes, skipped

    args = case_arguments(__doc__.splitlines()[0], CASES, repeats=3)
    if args.case:
        print(json.dumps({"seconds": quantize_seconds(args.case, SMOKE_SHAPE if args.smoke else SHAPE)}))
        return
    cases = SMOKE_CASES if args.smoke else CASES
    for case in CASES:
        if case not in cases:
            skipped(case, "--smoke runs one process per model")
    runs = interleaved_processes(__file__, cases, args.repeats, smoke=args.smoke)
    best = {case: min(run["seconds"] for run in results) for case, results in runs.items()}
    print(f"machine: {cpu()}")
    print(f"GPT-2 small (random), model.quantize('int8'), best of {args.repeats} processes per case")
    print("| model | seconds | vs keras_tfam |")
    print("|---|---:|---:|")
    for case in cases:
        print(f"| {case} | {best[case]:.2f} | {best[case] / best['keras_tfam']:.1f}x |")


if __name__ == "__main__":
    main()
