"""Early-exit decoding (CALM) on the mini protocol: tokens/s and test perplexity vs ordinary decoding.

    python benchmarks/early_exit.py --run runs/tiny --data-dir ../shared/data/wikitext-2

Mini protocol (not WikiText-2 test perplexity): the GPT-2 of a `tfam train`
run trained on the validation split; the test split is evaluated.

1. CALM fine-tuning of that GPT-2 (Schuster et al. 2022): the per-layer loss
   through the shared head, weighted `w_i = i / sum j`, on the validation
   blocks except the last `--calibration-blocks` (held out to calibrate).
2. The early-exit classifier, backbone frozen, on CALM's consistency oracle
   (layer i's top token == the last layer's).
3. For both confidence measures and each threshold (1.0 = ordinary
   decoding: nothing exits and no confidence is computed):
   - test perplexity over the first `--eval-blocks` 128-token test blocks,
     teacher-forced one token at a time through `call_with_cache`, so exits
     and the propagated caches are exactly those of generation; the mean
     number of layers run, and how often the top token equals the full
     model's;
   - tokens/s at batch 1 of decoding a test block (teacher-forced, so the
     exits are those of real text) and of greedy `model.generate` after a
     test prompt (the library's compiled generation loop), each timed
     alternately with threshold 1 on the same compiled function (the
     threshold is a variable), so that the ratio holds on a busy machine.
4. Learn-then-Test (CALM's calibration) on the held-out blocks (one block =
   one example): the smallest threshold whose rate of tokens differing from
   the full model is at most `--tolerance` with probability `1 - --epsilon`
   (Hoeffding: with n blocks, the empirical rate must be below about
   `tolerance - sqrt(ln(1/epsilon) / 2n)`); and grid search (empirical rate
   at most the tolerance).

Timings are medians of `--repeats` calls after a compiling call.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mini_protocol import load_mini_protocol, perplexities, smoke_run  # noqa: E402
from timing import add_smoke, machine, median_seconds, smoke_folder, smoke_settings  # noqa: E402

from keras_tfam.models import EarlyExitLM, grid_search_threshold, learn_then_test  # noqa: E402


def calm_finetune(model, inputs, targets, weights, steps, batch_size, learning_rate):
    calm = model.layer_logits_model()
    layers = model.num_layers
    calm.compile(
        keras.optimizers.AdamW(learning_rate, weight_decay=0.0, global_clipnorm=1.0),
        [keras.losses.SparseCategoricalCrossentropy(from_logits=True)] * layers,
        loss_weights=EarlyExitLM.calm_loss_weights(layers),
        jit_compile=True,
    )
    data = tf.data.Dataset.from_tensor_slices((inputs, tuple([targets] * layers), tuple([weights] * layers)))
    data = data.shuffle(len(inputs), seed=0).repeat().batch(batch_size, drop_remainder=True)
    calm.fit(data, steps_per_epoch=steps, epochs=1, shuffle=False, verbose=0)


def train_classifier(model, inputs, weights, steps, batch_size):
    labels = model.consistency_labels(inputs, batch_size)
    classifier = model.exit_classifier_model()
    model.backbone.trainable = False
    classifier.compile(keras.optimizers.Adam(1e-3), keras.losses.BinaryCrossentropy(), jit_compile=True)
    data = tf.data.Dataset.from_tensor_slices((inputs, labels, weights)).shuffle(len(inputs), seed=0).repeat()
    classifier.fit(
        data.batch(batch_size, drop_remainder=True), steps_per_epoch=steps, epochs=1, shuffle=False, verbose=0
    )
    model.backbone.trainable = True
    return float(labels[weights > 0].mean())


def teacher_forced_scorer(model):
    """A compiled `(inputs, targets, weights, full_top) -> (nll, layers, mismatches per row)` over one batch."""

    @tf.function(jit_compile=True)
    def score(inputs, targets, weights, full_top):
        batch, length = inputs.shape
        cache = model.init_cache(batch, length)
        zeros = tf.zeros((batch,), tf.float32)

        def body(t, cache, nll, layers, mismatches):
            token = tf.reshape(tf.gather(inputs, t, axis=1), (batch, 1))
            step = model.early_exit_step(token, cache, t)
            log_p = tf.nn.log_softmax(step["logits"][:, 0])
            w = tf.gather(weights, t, axis=1)
            nll += -tf.gather(log_p, tf.gather(targets, t, axis=1), batch_dims=1) * w
            layers += tf.cast(step["exit_layers"], tf.float32) * w
            differs = tf.not_equal(tf.argmax(log_p, -1, output_type=tf.int32), tf.gather(full_top, t, axis=1))
            mismatches += tf.cast(differs, tf.float32) * w
            return t + 1, step["cache"], nll, layers, mismatches

        _, _, nll, layers, mismatches = tf.while_loop(
            lambda t, *_: t < length, body, (tf.constant(0), cache, zeros, zeros, zeros)
        )
        return nll, layers, mismatches

    return score


def full_top_tokens(backbone, inputs, batch_size):
    tops = [np.asarray(backbone(inputs[i : i + batch_size])).argmax(-1) for i in range(0, len(inputs), batch_size)]
    return np.concatenate(tops).astype("int32")


def evaluate(score, blocks, full_top, batch_size):
    inputs, targets, weights = blocks
    totals = np.zeros(3)
    per_row = []
    for i in range(0, len(inputs), batch_size):
        part = slice(i, i + batch_size)
        nll, layers, mismatches = score(inputs[part], targets[part], weights[part], full_top[part])
        totals += [float(tf.reduce_sum(nll)), float(tf.reduce_sum(layers)), float(tf.reduce_sum(mismatches))]
        per_row.append(np.asarray(mismatches) / weights[part].sum(-1))
    count = float(weights.sum())
    return {
        "nll": totals[0],
        "tokens": count,
        "layers": totals[1] / count,
        "agreement": 1 - totals[2] / count,
        "row_mismatch": np.concatenate(per_row),
    }


def generation_layers(score, tokens, prompt_length):
    """Mean blocks run per new token of a greedy `generate` output (its steps, replayed teacher-forced)."""
    weights = np.zeros(tokens[:, 1:].shape, "float32")
    weights[:, prompt_length - 1 :] = 1.0  # the steps that chose the new tokens
    _, layers, _ = score(tokens[:, :-1], tokens[:, 1:], weights, tokens[:, 1:])
    return float(np.sum(layers)) / weights.sum()


def interleaved_seconds(run, model, threshold, repeats):
    """Median seconds of `run()` at threshold 1 and at `threshold`, timed alternately (load drifts)."""
    times = {1.0: [], threshold: []}
    run()  # compiles on the first call
    for _ in range(repeats):
        for value in times:
            model.threshold = value
            start = time.perf_counter()
            run()
            times[value].append(time.perf_counter() - start)
    model.threshold = threshold
    return statistics.median(times[1.0]), statistics.median(times[threshold])


def main():
    import keras_tfam

    keras_tfam.cpu.configure()  # pooled tensor memory, as `tfam` runs
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="runs/tiny")
    parser.add_argument("--data-dir", default="../shared/data/wikitext-2")
    parser.add_argument("--finetune-steps", type=int, default=150)
    parser.add_argument("--classifier-steps", type=int, default=150)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--calibration-blocks", type=int, default=256)
    parser.add_argument("--eval-blocks", type=int, default=128)
    parser.add_argument("--eval-batch", type=int, default=64)
    parser.add_argument("--thresholds", type=float, nargs="+", default=[1.0, 0.9, 0.8, 0.6, 0.4, 0.2])
    parser.add_argument("--tolerance", type=float, default=0.1)
    parser.add_argument("--epsilon", type=float, default=0.05)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--weights", help="a .weights.h5 to save the fine-tuned model to (or load it from)")
    add_smoke(parser)
    smoke = dict(finetune_steps=2, classifier_steps=2, batch_size=4, calibration_blocks=4, eval_blocks=4)
    smoke.update(eval_batch=4, thresholds=[0.5], prompt=8, new=4, repeats=1, weights=None)
    args = smoke_settings(parser.parse_args(), **smoke)
    keras.utils.set_random_seed(0)
    start = time.perf_counter()
    if args.smoke:  # two layers: one to exit after
        args.run, args.data_dir = smoke_run(smoke_folder("early_exit"), **{"num-layers": 2})

    gpt2, _, splits = load_mini_protocol(args.run, args.data_dir)
    inputs, targets, weights, _ = splits["valid"]
    held = slice(len(inputs) - args.calibration_blocks, None)
    train = slice(0, len(inputs) - args.calibration_blocks)
    calibration = (inputs[held], targets[held], weights[held])
    test = tuple(x[: args.eval_blocks] for x in splits["test"][:3])
    print(f"machine: {machine()}")
    print(
        f"mini protocol (trained on valid, evaluated on test): {args.run}, {gpt2.num_layers} layers, "
        f"width {gpt2.hidden_dim}, vocabulary {gpt2.vocabulary_size}; test: first {args.eval_blocks} blocks "
        f"of 128 tokens ({int(test[2].sum())} tokens); calibration: last {args.calibration_blocks} valid blocks"
    )

    before = full_top_tokens(gpt2, test[0], args.eval_batch)
    original = EarlyExitLM(gpt2, threshold=1.0)
    original_result = evaluate(teacher_forced_scorer(original), test, before, args.eval_batch)
    print(
        f"original GPT-2 (before CALM fine-tuning): test token perplexity "
        f"{perplexities(original_result['nll'], original_result['tokens'])['token_perplexity']:.2f}"
    )

    models = {
        "softmax_response": original,
        "classifier": EarlyExitLM(gpt2, confidence="classifier", threshold=1.0),
    }
    models["classifier"](test[0][:1])  # builds it (for saving and loading its weights)
    if args.weights and os.path.isfile(args.weights):
        models["classifier"].load_weights(args.weights)
        print(f"CALM fine-tuned GPT-2 and exit classifier loaded from {args.weights}")
    else:
        t0 = time.perf_counter()
        calm_finetune(
            original,
            inputs[train],
            targets[train],
            weights[train],
            args.finetune_steps,
            args.batch_size,
            args.learning_rate,
        )
        print(
            f"CALM fine-tuning: {args.finetune_steps} steps of {args.batch_size} x 128 tokens, "
            f"{time.perf_counter() - t0:.0f} s"
        )
        t0 = time.perf_counter()
        positives = train_classifier(
            models["classifier"], inputs[train][:256], weights[train][:256], args.classifier_steps, args.batch_size
        )
        print(
            f"exit classifier: {args.classifier_steps} steps, {time.perf_counter() - t0:.0f} s "
            f"({100 * positives:.0f}% of intermediate top tokens agree with the last layer's)"
        )
        if args.weights:
            models["classifier"].save_weights(args.weights)

    full_test = full_top_tokens(gpt2, test[0], args.eval_batch)
    full_calibration = full_top_tokens(gpt2, calibration[0], args.eval_batch)
    prompt = splits["test"][0][:1, : args.prompt].astype("int32")
    text = (test[0][:1], test[1][:1], test[2][:1], full_test[:1])
    print(
        f"speed, batch 1, XLA, each threshold timed alternately with threshold 1 (ordinary decoding), "
        f"median of {args.repeats}: decoding a 128-token test block (teacher-forced) and greedy generation "
        f"of {args.new} tokens after a {args.prompt}-token test prompt"
    )
    print(
        "| confidence | threshold | test token ppl | ppl / ordinary | top-1 = full model | layers | "
        "decoding tok/s (vs ordinary) | speed-up | generation tok/s (vs ordinary) | speed-up | layers (generation) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ordinary_ppl = None
    for name, model in models.items():
        score = teacher_forced_scorer(model)
        for threshold in sorted(set(args.thresholds) | {1.0}, reverse=True):
            model.threshold = threshold
            result = evaluate(score, test, full_test, args.eval_batch)
            ppl = perplexities(result["nll"], result["tokens"])["token_perplexity"]
            ordinary_ppl = ordinary_ppl or ppl
            layers = generation_layers(score, model.generate(prompt, args.new), args.prompt)
            decode = interleaved_seconds(lambda: score(*text)[0].numpy(), model, threshold, args.repeats)
            generate = interleaved_seconds(lambda: model.generate(prompt, args.new), model, threshold, args.repeats)
            rates = [128 / decode[1], 128 / decode[0], args.new / generate[1], args.new / generate[0]]
            print(
                f"| {name} | {threshold:.2f} | {ppl:.2f} | {ppl / ordinary_ppl:.3f} | "
                f"{100 * result['agreement']:.1f}% | {result['layers']:.2f} | {rates[0]:.0f} ({rates[1]:.0f}) | "
                f"{rates[0] / rates[1]:.2f}x | {rates[2]:.0f} ({rates[3]:.0f}) | {rates[2] / rates[3]:.2f}x | "
                f"{layers:.2f} |"
            )
        model.threshold = 1.0

        risks = {}

        def risk(threshold, model=model, score=score, risks=risks):
            if threshold not in risks:
                model.threshold = threshold
                risks[threshold] = evaluate(score, calibration, full_calibration, args.eval_batch)["row_mismatch"]
            return risks[threshold]

        chosen, records = learn_then_test(risk, args.thresholds, args.tolerance, args.epsilon)
        grid, _ = grid_search_threshold(risk, args.thresholds, args.tolerance)
        tested = ", ".join(f"{r['threshold']:.2f}: risk {r['risk']:.3f}, p {r['p_value']:.2g}" for r in records)
        print(
            f"{name}: Learn-then-Test (tolerance {args.tolerance}, epsilon {args.epsilon}) -> threshold "
            f"{chosen:.2f} [{tested}]; grid search -> {grid:.2f}"
        )
    seconds = median_seconds(lambda: gpt2.generate(prompt, max_new_tokens=args.new), warmup=1, repeats=args.repeats)
    print(
        f"reference: GPT2LM.generate of the fine-tuned GPT-2 (no exit head), same prompt: "
        f"{args.new / seconds:.0f} tokens/s"
    )
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
