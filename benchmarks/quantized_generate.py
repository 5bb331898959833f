"""GPT-2 small decoding in float32, bfloat16, int8 and int4: weight bytes, peak memory, tokens/s, perplexity.

Each precision runs in its own process (so each peak memory is its own):

- `float32`: the model as built;
- `bfloat16`: every variable in bfloat16 (`dtype="bfloat16"`), the logits float32;
- `int8`, `int4`: Keras' own `model.quantize(...)` of the float32 model (Dense layers and the tied
  embedding/head; weight-only int4, int8 with quantized activations as Keras does it).

For each: the bytes of the weights, the process' peak resident memory, and greedy tokens/s at batch 1
and 8 (32-token prompts, `--new` tokens, warmed up once, median of 3). GPT-2 small has random weights
here, so its tokens say nothing of quality: quality is measured on a tiny GPT-2 trained for
`--train-steps` on the WikiText-2 validation split (characters) and scored on the test split, per
precision (the mini protocol: not WikiText-2 perplexity).

    .venv/bin/python benchmarks/quantized_generate.py [--new 64 --data ../shared/data/wikitext-2]
"""

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

PRECISIONS = ("float32", "bfloat16", "int8", "int4")
HERE = os.path.dirname(os.path.abspath(__file__))


def with_precision(model_fn, precision):
    """A model of `model_fn()`'s weights in `precision`."""
    import keras
    import ml_dtypes
    import numpy as np

    keras.utils.set_random_seed(0)
    model = model_fn(None)
    if precision == "bfloat16":
        weights = model.get_weights()
        model = model_fn("bfloat16")
        model.set_weights([np.asarray(w, ml_dtypes.bfloat16) for w in weights])
    elif precision in ("int8", "int4"):
        model.quantize(precision)
    return model


def weight_bytes(model):
    import keras

    return int(sum(keras.ops.convert_to_numpy(v).nbytes for v in model.weights))


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_generate(precision, new, sizes):
    import numpy as np

    from keras_tfam.models import GPT2LM

    model = with_precision(lambda dtype: GPT2LM.from_preset("gpt2_small", dtype=dtype, **sizes), precision)
    result = {"precision": precision, "weight_bytes": weight_bytes(model)}
    for batch in (1, 8):
        prompts = np.random.default_rng(batch).integers(0, 50257, (batch, 32)).astype("int32")
        model.generate(prompts, max_new_tokens=new)  # compiles
        times = []
        for _ in range(3):
            start = time.perf_counter()
            model.generate(prompts, max_new_tokens=new)
            times.append(time.perf_counter() - start)
        result[f"tokens_per_s_b{batch}"] = batch * new / statistics.median(times)
    result["peak_mb"] = peak_mb()
    return result


def characters(data):
    import numpy as np

    with open(os.path.join(data, "wiki.valid.tokens"), encoding="utf-8") as f:
        train = f.read()
    with open(os.path.join(data, "wiki.test.tokens"), encoding="utf-8") as f:
        test = f.read()
    index = {c: i for i, c in enumerate(sorted(set(train)))}
    encode = lambda text: np.array([index.get(c, len(index)) for c in text], np.int32)  # noqa: E731
    return encode(train), encode(test), len(index) + 1


def tiny(vocabulary, dtype=None, sizes=None):
    from keras_tfam.models import GPT2LM

    return GPT2LM(
        vocabulary_size=vocabulary,
        **(sizes or {"num_layers": 4, "num_heads": 4, "hidden_dim": 128}),
        max_sequence_length=128,
        position="rotary",
        dtype=dtype,
    )


def run_perplexity(data, steps, path, sizes=None):
    """Trains the tiny model once (saved to `path`), then scores the test split in each precision."""
    import keras
    import numpy as np

    train, test, vocabulary = characters(data)
    keras.utils.set_random_seed(0)
    if not os.path.isfile(path):
        model = tiny(vocabulary, sizes=sizes)
        model.compile(keras.optimizers.AdamW(3e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        starts = np.random.default_rng(0).integers(0, len(train) - 129, steps * 32)
        windows = np.stack([train[s : s + 129] for s in starts])
        model.fit(windows[:, :-1], windows[:, 1:], batch_size=32, epochs=1, verbose=0)
        model.save_weights(path)
    blocks = test[: (len(test) - 1) // 128 * 128 + 1][: 128 * 256 + 1]
    inputs, targets = blocks[:-1].reshape(-1, 128), blocks[1:].reshape(-1, 128)
    results = {}
    for precision in PRECISIONS:

        def build(dtype, precision=precision):
            model = tiny(vocabulary, dtype, sizes)
            if dtype is None:
                model.load_weights(path)
            return model

        model = with_precision(build, precision)
        logits = np.concatenate(
            [keras.ops.convert_to_numpy(model(inputs[i : i + 32])) for i in range(0, len(inputs), 32)]
        )
        logits = logits.astype(np.float64)
        log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        nll = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
        results[precision] = {"bits_per_character": float(nll.mean() / np.log(2)), "characters": int(targets.size)}
    return results


def child(*arguments):
    from timing import run_json

    return run_json(__file__, *arguments, cwd=HERE)


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--train-steps", type=int, default=600)
    parser.add_argument("--data", default=os.path.join(HERE, "..", "..", "shared", "data", "wikitext-2"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", choices=("generate", "perplexity"), help=argparse.SUPPRESS)
    parser.add_argument("--precision", choices=PRECISIONS, help=argparse.SUPPRESS)
    parser.add_argument("--weights", help=argparse.SUPPRESS)
    sys.path.insert(0, HERE)
    from timing import SMOKE_SIZES, add_smoke, machine, skipped, small_wikitext, smoke_folder, smoke_settings

    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), new=4, train_steps=2)
    sizes = SMOKE_SIZES if args.smoke else None
    if args.child == "generate":
        print(json.dumps(run_generate(args.precision, args.new, sizes or {})))
        return
    if args.child == "perplexity":
        print(json.dumps(run_perplexity(args.data, args.train_steps, args.weights, sizes)))
        return
    smoke = ["--smoke"] if args.smoke else []
    if args.smoke:  # the perplexity process still runs every precision
        args.data = small_wikitext(os.path.join(smoke_folder("quantized_generate"), "wikitext-2"))
        skipped("decoding in " + ", ".join(PRECISIONS[1:]), "--smoke decodes in float32 only")
    generated = {
        p: child("--child", "generate", "--precision", p, "--new", str(args.new), *smoke)
        for p in (PRECISIONS[:1] if args.smoke else PRECISIONS)
    }
    with tempfile.TemporaryDirectory() as folder:
        quality = child(
            "--child",
            "perplexity",
            "--data",
            os.path.abspath(args.data),
            "--train-steps",
            str(args.train_steps),
            "--weights",
            os.path.join(folder, "tiny.weights.h5"),
            *smoke,
        )
    print(f"machine: {machine()}")
    print(f"GPT-2 small (random weights), prompts 32, {args.new} new tokens; tiny char model {args.train_steps} steps")
    print(
        f"{'precision':10s}{'weights MB':>12s}{'peak MB':>10s}{'tok/s b1':>10s}{'x f32':>7s}{'tok/s b8':>10s}"
        f"{'x f32':>7s}{'bits/char':>11s}{'vs f32':>9s}"
    )
    base = generated["float32"]
    for p in PRECISIONS:
        g, q = generated.get(p), quality[p]
        decoding = (
            f"{g['weight_bytes'] / 2**20:12.1f}{g['peak_mb']:10.0f}{g['tokens_per_s_b1']:10.2f}"
            f"{g['tokens_per_s_b1'] / base['tokens_per_s_b1']:6.2f}x{g['tokens_per_s_b8']:10.2f}"
            f"{g['tokens_per_s_b8'] / base['tokens_per_s_b8']:6.2f}x"
            if g
            else f"{'-':>12s}{'-':>10s}{'-':>10s}{'-':>7s}{'-':>10s}{'-':>7s}"  # not decoded (--smoke)
        )
        print(
            f"{p:10s}{decoding}{q['bits_per_character']:11.4f}"
            f"{100 * (q['bits_per_character'] / quality['float32']['bits_per_character'] - 1):+8.2f}%"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "generate": generated, "quality": quality}, f, indent=1)


if __name__ == "__main__":
    main()
