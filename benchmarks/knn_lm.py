"""kNN-LM on the mini protocol: test perplexity of a trained GPT-2 with a datastore of its training split.

    python benchmarks/knn_lm.py --run runs/tiny --data-dir ../shared/data/wikitext-2

Mini protocol (not WikiText-2 test perplexity): the GPT-2 of a `tfam train`
run trained on the validation split, so the datastore (Khandelwal et al.
2020) holds every (final hidden state -> next token) pair of the validation
split's 128-token blocks, and the test split is evaluated in the same blocks.

1. Builds the datastore (exact search: batched matmul + top-k over chunks).
2. One pass over the test split records, per token, the LM's log-probability
   of the target and its `k` nearest entries (distances, and whether each
   holds the target), so that `p = lambda p_kNN + (1 - lambda) p_LM` is
   computed for several `lambda` (and temperatures) from one retrieval.
3. Checks that path against `KNNLM` evaluated by `evaluate_perplexity`
   (what `tfam eval` runs) on the first `--check-batches` batches, and
   times both (the cost of retrieval per token).

The mini protocol has no split left for tuning `lambda` and the temperature:
the paper's setting (`lambda = 0.25`, temperature 1) is applied to the whole
test split, and a setting tuned on the first half of the test tokens is
reported on the second half.
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mini_protocol import load_mini_protocol, perplexities, smoke_run  # noqa: E402
from timing import add_smoke, machine, smoke_folder, smoke_settings  # noqa: E402

from keras_tfam.models import KNNLM  # noqa: E402
from keras_tfam.retrieval import Datastore  # noqa: E402
from keras_tfam.retrieval.datastore import logits_and_hidden_states  # noqa: E402
from pipelines.evaluation import evaluate_perplexity  # noqa: E402


def retrieve_targets(lm, datastore, blocks, batch_size):
    """Per real test token: LM log-prob of the target, neighbour distances, neighbour holds the target."""
    inputs, targets, weights = blocks

    @tf.function
    def step(x, y):
        logits, hidden = logits_and_hidden_states(lm, x)
        log_lm = tf.gather(tf.nn.log_softmax(logits), y, batch_dims=2)
        distances, tokens = datastore.search(hidden)
        return log_lm, distances, tf.equal(tokens, y[..., None])

    log_lm, distances, hits = [], [], []
    for i in range(0, len(inputs), batch_size):
        keep = weights[i : i + batch_size] > 0
        outputs = step(inputs[i : i + batch_size], targets[i : i + batch_size])
        for collected, value in zip((log_lm, distances, hits), outputs):
            collected.append(np.asarray(value)[keep])
    return np.concatenate(log_lm).astype(np.float64), np.concatenate(distances).astype(np.float64), np.concatenate(hits)


def knn_nll(log_lm, distances, hits, interpolation, temperature):
    """Total NLL of `lambda p_kNN + (1 - lambda) p_LM` from the recorded neighbours."""
    scaled = -distances / temperature
    scaled -= scaled.max(-1, keepdims=True)
    weights = np.exp(scaled)
    p_knn = (weights * hits).sum(-1) / weights.sum(-1)
    with np.errstate(divide="ignore"):
        log_p = np.logaddexp(np.log(interpolation) + np.log(p_knn), np.log1p(-interpolation) + log_lm)
    return float(-log_p.sum())


INTERPOLATIONS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4)
TEMPERATURES = (1.0, 3.0, 10.0, 30.0, 100.0)


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="runs/tiny")
    parser.add_argument("--data-dir", default="../shared/data/wikitext-2")
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--interpolation", type=float, default=0.25)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--chunk-size", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--check-batches", type=int, default=8)
    parser.add_argument("--neighbours", help="an .npz to save the recorded neighbours to (or read them from)")
    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), k=4, check_batches=1, neighbours=None)
    start = time.perf_counter()
    if args.smoke:
        args.run, args.data_dir = smoke_run(smoke_folder("knn_lm"))

    gpt2, _, splits = load_mini_protocol(args.run, args.data_dir)
    print(f"machine: {machine()}")
    print(
        f"mini protocol (trained on valid, evaluated on test): {args.run}, {gpt2.num_layers} layers, "
        f"width {gpt2.hidden_dim}, vocabulary {gpt2.vocabulary_size}"
    )

    inputs, targets, weights, _ = splits["valid"]
    t0 = time.perf_counter()
    datastore = Datastore.from_model(
        gpt2,
        inputs,
        targets,
        weights,
        batch_size=args.batch_size,
        k=args.k,
        temperature=args.temperature,
        chunk_size=args.chunk_size,
    )
    build = time.perf_counter() - t0
    megabytes = datastore.size * (datastore.key_dim + 1) * 4 / 2**20
    print(
        f"datastore: {datastore.size} entries x {datastore.key_dim} (float32 keys + ids: {megabytes:.0f} MiB), "
        f"built in {build:.0f} s"
    )

    test_inputs, test_targets, test_weights, words = splits["test"]
    t0 = time.perf_counter()
    if args.neighbours and os.path.isfile(args.neighbours):
        recorded = np.load(args.neighbours)
        log_lm, distances, hits = recorded["log_lm"], recorded["distances"], recorded["hits"]
    else:
        log_lm, distances, hits = retrieve_targets(
            gpt2, datastore, (test_inputs, test_targets, test_weights), args.batch_size
        )
        if args.neighbours:
            np.savez(args.neighbours, log_lm=log_lm, distances=distances, hits=hits)
    retrieval = time.perf_counter() - t0
    tokens = len(log_lm)
    print(f"test: {tokens} tokens, {words} words; one pass with retrieval (k={args.k}): {retrieval:.0f} s")
    print(f"neighbours holding the target: {100 * hits.any(-1).mean():.1f}% of test tokens have one among the {args.k}")

    lm_result = perplexities(float(-log_lm.sum()), tokens, words)
    paper = perplexities(knn_nll(log_lm, distances, hits, args.interpolation, args.temperature), tokens, words)
    print(
        f"whole test split: GPT-2 word ppl {lm_result['word_perplexity']:.2f}; kNN-LM with the paper's "
        f"lambda {args.interpolation}, temperature {args.temperature}: {paper['word_perplexity']:.2f} "
        f"({100 * (paper['word_perplexity'] / lm_result['word_perplexity'] - 1):+.1f}%)"
    )

    # lambda and temperature chosen on the first half of the test tokens, reported on the second half.
    half = tokens // 2
    tune, report = slice(0, half), slice(half, None)
    grid = [(lam, temp) for temp in TEMPERATURES for lam in INTERPOLATIONS]
    tuned = {setting: knn_nll(log_lm[tune], distances[tune], hits[tune], *setting) for setting in grid}
    best = min(tuned, key=tuned.get)
    print(
        f"tuned on the first half ({half} tokens): lambda {best[0]}, temperature {best[1]} "
        f"(token ppl {np.exp(tuned[best] / half):.2f} vs GPT-2 {np.exp(-log_lm[tune].mean()):.2f})"
    )
    held_tokens = tokens - half
    print("| second half of test | lambda | temperature | token ppl | change |")
    print("|---|---|---|---|---|")
    lm_held = float(np.exp(-log_lm[report].mean()))
    print(f"| GPT-2 | - | - | {lm_held:.2f} | |")
    for label, (lam, temp) in (
        ("kNN-LM, paper setting", (args.interpolation, args.temperature)),
        ("kNN-LM, tuned on the first half", best),
    ):
        ppl = float(np.exp(knn_nll(log_lm[report], distances[report], hits[report], lam, temp) / held_tokens))
        print(f"| {label} | {lam} | {temp} | {ppl:.2f} | {100 * (ppl / lm_held - 1):+.1f}% |")

    # The same numbers through KNNLM and evaluate_perplexity (tfam eval's function), and the cost per token.
    knn = KNNLM(gpt2, datastore, interpolation=args.interpolation)
    check = slice(0, args.check_batches * args.batch_size)
    check_blocks = (test_inputs[check], test_targets[check], test_weights[check])
    check_tokens = int(test_weights[check].sum())
    seconds = {}
    for name, model in (("GPT-2", gpt2), ("kNN-LM", knn)):
        dataset = tf.data.Dataset.from_tensor_slices(check_blocks).batch(args.batch_size)
        evaluate_perplexity(model, dataset.take(1), 1)  # compile
        t0 = time.perf_counter()
        result = evaluate_perplexity(model, dataset, check_tokens)
        seconds[name] = time.perf_counter() - t0
        print(
            f"check, first {check_tokens} test tokens through evaluate_perplexity: {name} token ppl "
            f"{result['token_perplexity']:.3f} in {seconds[name]:.1f} s"
        )
    sub = slice(0, check_tokens)
    recorded = perplexities(
        knn_nll(log_lm[sub], distances[sub], hits[sub], args.interpolation, args.temperature), check_tokens
    )
    print(f"  (from the recorded neighbours: {recorded['token_perplexity']:.3f})")
    per_token = 1000 * (seconds["kNN-LM"] - seconds["GPT-2"]) / check_tokens
    print(
        f"cost: retrieval adds {per_token:.2f} ms per token, {seconds['kNN-LM'] / seconds['GPT-2']:.1f}x the "
        f"evaluation time of the LM alone"
    )
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
