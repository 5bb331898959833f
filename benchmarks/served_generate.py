"""The exported `generate` against the library's: GPT-2 small greedy decoding, in a TensorFlow-only process.

    python benchmarks/served_generate.py [--tokens 64] [--repeats 1]

Each case runs in a fresh process, the library's and the served ones alternating (`timing.interleaved_processes`):

- `library-P`: `model.generate` at batch 1 and 8 (32-token prompt), tokens/s; the processors' cost per step (every
  logits processor on vs off); a stop id cutting a request after 10 of 256 tokens; the time to the first chunk of
  `model.stream`. It also writes the export the served case loads.
- `served-P`: the SavedModel's `generate` called as TF Serving runs it, by plain TensorFlow (no keras_tfam import):
  the first request after load (the warmup requests replayed before it, as TF Serving does), tokens/s at batch 1
  and 8, 8 single-row requests one by one against merged into one call (TF Serving's batching), a stop id after
  10 of 256 tokens, and the time to a first chunk of 8 through `prefill` and `decode_chunk`.

Prints one table per precision with the ratios served / library, and the JSON of every case.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import (  # noqa: E402
    SMOKE_SIZES,
    case_arguments,
    interleaved_processes,
    machine,
    median_seconds,
    skipped,
    smoke_folder,
)

PROMPT = 32
BATCHES = (1, 8)
PRECISIONS = ("float32", "int8")
EXPORTS = os.path.join(tempfile.gettempdir(), "keras_tfam_served_generate")  # kept for the next run


def prompts(batch):
    return np.random.default_rng(0).integers(0, 50257, (batch, PROMPT)).astype(np.int32)


def library(precision, tokens, export_dir, sizes, export_sizes):
    from timing import gpt2_small

    import keras_tfam.cpu

    keras_tfam.cpu.configure()
    model = gpt2_small(precision, **sizes)
    out = {"tokens_per_s": {}, "tokens": {}}
    for batch in BATCHES:
        ids = prompts(batch)
        seconds = median_seconds(lambda: model.generate(ids, tokens), warmup=1, repeats=3)
        out["tokens_per_s"][batch] = batch * tokens / seconds
        out["tokens"][batch] = model.generate(ids, tokens).tolist()
        steering = dict(repetition_penalty=1.2, no_repeat_ngram_size=3, presence_penalty=0.1, frequency_penalty=0.1)
        steered = median_seconds(lambda: model.generate(ids, tokens, **steering), warmup=1, repeats=3)
        out.setdefault("processors_ms_per_step", {})[batch] = 1000 * (steered - seconds) / tokens
    ids = prompts(1)
    stop = int(model.generate(ids, 10)[0, PROMPT + 9])
    full = median_seconds(lambda: model.generate(ids, 256), warmup=1, repeats=2)
    cut = median_seconds(lambda: model.generate(ids, 256, stop_token_ids=[stop]), warmup=1, repeats=2)
    out["stop_after_10_of_256_s"] = {"without": full, "with": cut}
    next(iter(model.stream(ids, tokens, chunk_size=8)))  # compiles
    start = time.perf_counter()
    next(iter(model.stream(ids, tokens, chunk_size=8)))
    out["first_chunk_of_8_s"] = time.perf_counter() - start
    if not os.path.isdir(os.path.join(export_dir, precision)):
        from pipelines.export import export_model

        export_model(model, os.path.join(export_dir, precision, "model"), batch_sizes=export_sizes)
    return out


def served(precision, tokens, export_dir):
    import tensorflow as tf

    from pipelines.serving_requests import decode_chunk_request, generate_request
    from pipelines.serving_warmup import WARMUP_FILE, read_warmup_requests

    path = os.path.join(export_dir, precision, "model", "1")
    dtypes = {"temperature": tf.float32, "top_p": tf.float32, "repetition_penalty": tf.float32}

    def inputs_of(request):
        return {k: v if tf.is_tensor(v) else tf.constant(v, dtypes.get(k, tf.int32)) for k, v in request.items()}

    def call(request):
        return signature(**inputs_of(request))["token_ids"].numpy()

    start = time.perf_counter()
    loaded = tf.saved_model.load(path)
    signature = loaded.signatures["generate"]
    for name, inputs in read_warmup_requests(os.path.join(path, WARMUP_FILE)):
        loaded.signatures[name](**{k: tf.constant(v, dtypes.get(k, tf.int32)) for k, v in inputs.items()})
    out = {"load_and_warmup_s": time.perf_counter() - start, "tokens_per_s": {}, "tokens": {}}
    first = generate_request(prompts(1).tolist(), tokens)
    start = time.perf_counter()
    call(first)
    out["first_request_s"] = time.perf_counter() - start
    for batch in BATCHES:
        request = generate_request(prompts(batch).tolist(), tokens)
        seconds = median_seconds(lambda: call(request), warmup=1, repeats=3)
        out["tokens_per_s"][batch] = batch * tokens / seconds
        out["tokens"][batch] = call(request).tolist()
    singles = [generate_request(prompts(8)[i : i + 1].tolist(), tokens) for i in range(8)]
    merged = generate_request(prompts(8).tolist(), tokens)
    one_by_one = median_seconds(lambda: [call(r) for r in singles], warmup=0, repeats=1)
    together = median_seconds(lambda: call(merged), warmup=0, repeats=2)
    out["requests_per_s"] = {"one_by_one": 8 / one_by_one, "merged": 8 / together}
    ids = prompts(1).tolist()
    stop = int(signature(**inputs_of(generate_request(ids, 10)))["token_ids"].numpy()[0, PROMPT + 9])
    full = median_seconds(lambda: call(generate_request(ids, 256)), warmup=1, repeats=1)
    cut = median_seconds(lambda: call(generate_request(ids, 256, stop_token_ids=[stop])), warmup=1, repeats=1)
    out["stop_after_10_of_256_s"] = {"without": full, "with": cut}
    prefill, decode_chunk = loaded.signatures["prefill"], loaded.signatures["decode_chunk"]

    def first_chunk():
        state = prefill(**inputs_of(generate_request(ids, tokens)))
        return decode_chunk(**inputs_of(decode_chunk_request(state, 8)))["token_ids"].numpy()

    out["first_chunk_of_8_s"] = median_seconds(first_chunk, warmup=1, repeats=2)
    modules = [m for m in ("keras_tfam", "keras_hub") if m in sys.modules]
    out["modules"] = modules
    return out


def export_option(parser):
    parser.add_argument("--exports", default=EXPORTS, help=argparse.SUPPRESS)  # where the library's cases export


def main():
    cases = [f"{side}-{p}" for p in PRECISIONS for side in ("library", "served")]
    args = case_arguments(__doc__.splitlines()[0], cases, tokens=64, repeats=1, options=export_option)
    if args.case:
        side, precision = args.case.split("-")
        if side == "library":
            from pipelines.served_decoding import DEFAULT_BATCH_SIZES

            # The export users get (TF Serving's default batch sizes); under --smoke, only the sizes measured.
            sizes, export_sizes = (SMOKE_SIZES, BATCHES) if args.smoke else ({}, DEFAULT_BATCH_SIZES)
            result = library(precision, args.tokens, args.exports, sizes, export_sizes)
        else:
            result = served(precision, args.tokens, args.exports)
        print(json.dumps(result))
        return
    precisions = PRECISIONS[:1] if args.smoke else PRECISIONS
    if args.smoke:  # a tiny model's export, in a folder of its own
        args.exports = smoke_folder("served_generate")
        skipped(", ".join(f"{side}-{p}" for p in PRECISIONS[1:] for side in ("library", "served")), "--smoke: float32")
    cases = [case for case in cases if case.split("-")[1] in precisions]
    arguments = ("--tokens", args.tokens, "--exports", args.exports)
    results = interleaved_processes(os.path.abspath(__file__), cases, args.repeats, *arguments, smoke=args.smoke)
    print(f"{machine()}; GPT-2 small, random weights, {PROMPT}-token prompts, {args.tokens} greedy new tokens")
    for precision in precisions:
        ours = max(results[f"library-{precision}"], key=lambda r: r["tokens_per_s"]["1"])
        theirs = max(results[f"served-{precision}"], key=lambda r: r["tokens_per_s"]["1"])
        print(f"\n| {precision} | library tok/s | served tok/s | served / library | same tokens |")
        print("|---|---:|---:|---:|---|")
        for batch in map(str, BATCHES):
            a, b = ours["tokens_per_s"][batch], theirs["tokens_per_s"][batch]
            same = ours["tokens"][batch] == theirs["tokens"][batch]
            print(f"| batch {batch} | {a:.1f} | {b:.1f} | {b / a:.2f}x | {same} |")
        stops = theirs["stop_after_10_of_256_s"]
        print(
            f"served: load and warmup replay {theirs['load_and_warmup_s']:.0f} s; a stop after 10 of 256 tokens "
            f"{stops['with']:.2f} s (without {stops['without']:.2f} s); prefill and a first decode_chunk of 8 "
            f"{theirs['first_chunk_of_8_s']:.2f} s"
        )
        print(
            f"first request after load and warmup {theirs['first_request_s']:.2f} s; "
            f"8 single-row requests: {theirs['requests_per_s']['one_by_one']:.2f} requests/s one by one, "
            f"{theirs['requests_per_s']['merged']:.2f} merged; processors on: "
            f"{ours['processors_ms_per_step']['1']:.2f} / {ours['processors_ms_per_step']['8']:.2f} ms more per step "
            f"at batch 1 / 8; a stop after 10 of 256 tokens: {ours['stop_after_10_of_256_s']['with']:.2f} s "
            f"(without {ours['stop_after_10_of_256_s']['without']:.2f} s); first streamed chunk of 8 "
            f"{ours['first_chunk_of_8_s']:.2f} s; served process imported {theirs['modules'] or 'no keras_tfam'}"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
