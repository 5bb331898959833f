"""Peak memory of building a kNN-LM datastore, against the bytes of the keys it holds.

    python benchmarks/datastore_memory.py [--blocks 768 --length 128 --hidden-dim 256]

`Datastore.from_model` runs an LM over a corpus and keeps one key (a final
hidden state, `hidden_dim` float32) per real token. The keys themselves are
`tokens * hidden_dim * 4` bytes and must be held once, in the layer's
variable. Everything above that is the cost of building them. Two builds are
measured, each figure in a fresh process after a warm-up on a small corpus:

- `from_model`: `Datastore.from_model`.
- `collect + concatenate`: what a user would otherwise write (and what
  `from_model` did before it streamed): a list of per-batch arrays,
  `np.concatenate`, then `set_entries`.

Two figures per build, both as a ratio to the key bytes:

- `rss`: the growth of the process's peak resident memory
  (`resource.getrusage().ru_maxrss`) across the build: NumPy arrays,
  TensorFlow tensors and the variable alike.
- `numpy`: the peak of Python-side allocations (`tracemalloc`: NumPy arrays,
  not TensorFlow's buffers).
"""

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BUILDS = ("from_model", "collect + concatenate")


def collect_and_concatenate(model, inputs, targets, batch_size):
    """The build `from_model` replaced: every batch's keys in a list, then one `np.concatenate`."""
    import numpy as np
    from keras import ops

    from keras_tfam.retrieval import Datastore
    from keras_tfam.retrieval.datastore import logits_and_hidden_states

    keys = []
    for start in range(0, len(inputs), batch_size):
        _, hidden = logits_and_hidden_states(model, inputs[start : start + batch_size].astype("int32"))
        keys.append(np.asarray(ops.convert_to_numpy(hidden), "float32").reshape(-1, hidden.shape[-1]))
    keys = np.concatenate(keys)
    datastore = Datastore(len(keys), keys.shape[-1], model.vocabulary_size, k=8)
    datastore.set_entries(keys, targets.reshape(-1))
    return datastore


def measure(build, figure, blocks, length, hidden_dim, batch_size):
    """Runs one build in this process; returns `figure` ("rss" or "numpy") as a ratio to the key bytes.

    One figure per process: tracemalloc's own bookkeeping would count in the RSS.
    """
    import resource
    import tracemalloc

    import numpy as np

    from keras_tfam.models import GPT2LM
    from keras_tfam.retrieval import Datastore

    vocabulary_size = 64
    model = GPT2LM(vocabulary_size, num_layers=1, num_heads=4, hidden_dim=hidden_dim, max_sequence_length=length)
    corpus = np.random.default_rng(0).integers(0, vocabulary_size, size=(blocks, length + 1))
    inputs, targets = corpus[:, :-1], corpus[:, 1:]

    def run(x, y):
        if build == "from_model":
            return Datastore.from_model(model, x, y, batch_size=batch_size, k=8)
        return collect_and_concatenate(model, x, y, batch_size)

    run(inputs[: 2 * batch_size], targets[: 2 * batch_size])  # warm-up: traces, allocator pools
    if figure == "numpy":
        tracemalloc.start()
        datastore = run(inputs, targets)
        grown = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        datastore = run(inputs, targets)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return grown / (datastore.size * datastore.key_dim * 4)


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=768)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--hidden-dim", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--build", choices=BUILDS, help=argparse.SUPPRESS)  # one build, in this process
    parser.add_argument("--figure", choices=("rss", "numpy"), help=argparse.SUPPRESS)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import add_smoke, skipped, smoke_settings

    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), blocks=64)  # keys of 8 MiB: a growth the RSS shows
    if args.build:
        print(json.dumps(measure(args.build, args.figure, args.blocks, args.length, args.hidden_dim, args.batch_size)))
        return
    key_mib = args.blocks * args.length * args.hidden_dim * 4 / 2**20
    print(f"datastore of {args.blocks} x {args.length} tokens, hidden_dim {args.hidden_dim}: keys {key_mib:.0f} MiB")
    print(f"{'build':>24} {'peak RSS growth / keys':>24} {'NumPy peak / keys':>19}")
    results = {}
    if args.smoke:
        skipped("the NumPy figure", "--smoke measures the RSS growth only: a process less per build")
    for build in BUILDS:
        result = {}
        for figure in ("rss",) if args.smoke else ("rss", "numpy"):
            command = [
                sys.executable,
                __file__,
                "--build",
                build,
                "--figure",
                figure,
                "--blocks",
                str(args.blocks),
                "--length",
                str(args.length),
                "--hidden-dim",
                str(args.hidden_dim),
                "--batch-size",
                str(args.batch_size),
            ]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            result[figure] = json.loads(output.splitlines()[-1])
        results[build] = result
        numpy = f"{result['numpy']:>18.2f}x" if "numpy" in result else f"{'-':>19}"
        print(f"{build:>24} {result['rss']:>23.2f}x {numpy}")
    ratio = results["collect + concatenate"]["rss"] / results["from_model"]["rss"]
    print(f"peak RSS growth, collect + concatenate / from_model: {ratio:.1f}x")


if __name__ == "__main__":
    main()
