"""Writes tests/fixtures/generation-references.json: transformers' greedy `generate` with logits processors.

For the tiny GPT-2 (../shared/fixtures/hf-gpt2-tiny) and Llama 3 (tests/fixtures/hf-llama-tiny)
checkpoints, float32 on the CPU, two prompts of 6 ids and 12 greedy new tokens per case: no processor,
each processor alone, and three pairs. Each case keeps keras_tfam's option names and values, the tokens
transformers chose (rows that stopped padded to 12 new tokens), the log-softmax of its raw logits (before
the processors) at each chosen token (0 after a row stopped) and the new tokens per row (the stop token
counted). Needs torch and transformers (the `bench` extra), no network:

    .venv/bin/python -m pip install -e '.[bench]'
    .venv/bin/python scripts/make_generation_references.py

Runs without TensorFlow (transformers and TensorFlow in one process crash).
"""

import argparse
import collections
import json
import os

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = {
    "hf-gpt2-tiny": os.path.join(HERE, "..", "..", "shared", "fixtures", "hf-gpt2-tiny"),
    "hf-llama-tiny": os.path.join(HERE, "..", "tests", "fixtures", "hf-llama-tiny"),
}
OUTPUT = os.path.join(HERE, "..", "tests", "fixtures", "generation-references.json")
PROMPT_LENGTH = 6
MAX_NEW_TOKENS = 12
# Processed scores of the chosen and the next best id closer than this would make a reference a coin toss.
MIN_MARGIN = 1e-4


def transformers_options(options):
    """transformers' `generate` arguments meaning keras_tfam's `options` (read from transformers' processors).

    `repetition_penalty`: RepetitionPenaltyLogitsProcessor, over the prompt and the generated ids (a
    positive logit divided by it, a negative one multiplied), each id once. `no_repeat_ngram_size`:
    NoRepeatNGramLogitsProcessor, n-grams of the prompt and the generated ids. `stop_token_ids`: the row
    ends after the id (kept, then `pad_token_id`). `min_new_tokens`: MinNewTokensLengthLogitsProcessor, the
    stop ids at -inf while fewer new tokens than it. `suppress_token_ids`: SuppressTokensLogitsProcessor,
    -inf at every step. `logit_bias`: SequenceBiasLogitsProcessor, sequences of one id added to its logit.
    """
    names = {
        "repetition_penalty": "repetition_penalty",
        "no_repeat_ngram_size": "no_repeat_ngram_size",
        "stop_token_ids": "eos_token_id",
        "min_new_tokens": "min_new_tokens",
        "suppress_token_ids": "suppress_tokens",
    }
    out = {"eos_token_id": None}
    for name, value in options.items():
        if name == "logit_bias":
            out["sequence_bias"] = {(int(i),): float(bias) for i, bias in value.items()}
        else:
            out[names[name]] = value
    return out


def generate(model, prompt_ids, pad, options):
    """`(token_ids [B, T + N], logprobs [B, N], num_generated [B])` of transformers' greedy `generate`."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor(prompt_ids),
            attention_mask=torch.ones(prompt_ids.shape, dtype=torch.long),
            max_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            num_beams=1,
            use_cache=True,
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
            **transformers_options(options),
        )
    new = out.sequences[:, PROMPT_LENGTH:].numpy()
    steps = new.shape[1]
    assert len(out.logits) == steps, (len(out.logits), steps)
    raw = torch.log_softmax(torch.stack(out.logits, 1).double(), -1).numpy()  # [B, steps, V]
    chosen = np.take_along_axis(raw, new[..., None], -1)[..., 0]
    stop = options.get("stop_token_ids", [])
    num_generated = np.full(len(new), steps)
    for b, row in enumerate(new):
        hits = np.flatnonzero(np.isin(row, stop))
        if hits.size:
            num_generated[b] = hits[0] + 1
    assert num_generated.max() == steps  # transformers decodes until the last row stops
    top2 = torch.stack(out.scores, 1).topk(2, -1).values.double().numpy()  # [B, steps, 2], after the processors
    new = np.pad(new, ((0, 0), (0, MAX_NEW_TOKENS - steps)), constant_values=pad)
    logprobs = np.zeros(new.shape)
    for b, n in enumerate(num_generated):
        assert (new[b, n:] == pad).all(), "a stopped row continues with padding"
        margin = (top2[b, :n, 0] - top2[b, :n, 1]).min()
        assert margin > MIN_MARGIN, f"row {b} has a near tie ({margin:.2g}) under {options}"
        logprobs[b, :n] = chosen[b, :n]
    token_ids = np.concatenate([prompt_ids, new], 1)
    return token_ids, logprobs, num_generated


def most_common(token_ids, exclude=()):
    counts = collections.Counter(token_ids[:, PROMPT_LENGTH:].reshape(-1).tolist())
    return next(int(i) for i, _ in counts.most_common() if i not in exclude)


def cases_for(model, prompt_ids, pad, plain):
    """keras_tfam options per case, chosen from the plain greedy tokens `plain` so that each changes them."""
    new = plain[:, PROMPT_LENGTH:]
    # Row 0 stops at its 3rd new token, or at its 1st when that id came before (a model repeating one id).
    stop = int(new[0, 2]) if new[0, 2] not in new[0, :2] else int(new[0, 0])
    assert stop != pad
    # The id greedy picks most often, then the one it picks most often once that is suppressed, and so on.
    suppress = []
    for _ in range(3):
        tokens = generate(model, prompt_ids, pad, {"suppress_token_ids": suppress} if suppress else {})[0]
        suppress.append(most_common(tokens, suppress))
    # Small against the logits' spread, so that they change some steps and not others.
    bias = {str(suppress[0]): -0.15, str(suppress[1]): 0.05}
    # With the bias, the id then chosen most often suppressed.
    biased = most_common(generate(model, prompt_ids, pad, {"logit_bias": bias})[0])
    stop_ids = [stop]
    return [
        ("plain", {}),
        ("repetition_penalty", {"repetition_penalty": 1.5}),
        ("no_repeat_ngram_size", {"no_repeat_ngram_size": 2}),
        ("stop_token_ids", {"stop_token_ids": stop_ids}),
        ("min_new_tokens", {"stop_token_ids": stop_ids, "min_new_tokens": 6}),
        ("suppress_token_ids", {"suppress_token_ids": suppress}),
        ("logit_bias", {"logit_bias": bias}),
        # Below 1 the penalty rewards repeated ids, which the n-gram ban then blocks.
        ("repetition_penalty+no_repeat_ngram_size", {"repetition_penalty": 0.6, "no_repeat_ngram_size": 2}),
        ("logit_bias+suppress_token_ids", {"logit_bias": bias, "suppress_token_ids": [biased]}),
        (
            "min_new_tokens+repetition_penalty",
            {"stop_token_ids": stop_ids, "min_new_tokens": 6, "repetition_penalty": 1.2},
        ),
    ]


def significant(values, digits=7):
    return [[float(f"{x:.{digits}g}") for x in row] for row in values]


def references(fixture, directory, seed):
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    # No stop ids, lengths or processors from the checkpoint's generation_config: each case sets its own.
    model.generation_config = transformers.GenerationConfig()
    # The last id pads (the tiny GPT-2 chooses id 0 throughout); no prompt holds it.
    pad = model.config.vocab_size - 1
    prompt_ids = np.random.default_rng(seed).integers(0, pad, (2, PROMPT_LENGTH))
    plain = generate(model, prompt_ids, pad, {})[0]
    out = []
    for name, options in cases_for(model, prompt_ids, pad, plain):
        token_ids, logprobs, num_generated = generate(model, prompt_ids, pad, options)
        # Each option must change the tokens: without any one of them, they differ.
        for option in options:
            fewer = {key: value for key, value in options.items() if key != option}
            without = generate(model, prompt_ids, pad, fewer)[0] if fewer else plain
            assert not np.array_equal(token_ids, without), f"{fixture} {name}: {option} changes no token"
        print(fixture, name, options, "num_generated", num_generated.tolist())
        out.append(
            dict(
                fixture=fixture,
                name=name,
                options=options,
                prompt_ids=prompt_ids.tolist(),
                pad_token_id=pad,
                max_new_tokens=MAX_NEW_TOKENS,
                token_ids=token_ids.tolist(),
                logprobs=significant(logprobs),
                num_generated=num_generated.tolist(),
            )
        )
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=OUTPUT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("transformers", transformers.__version__, "torch", torch.__version__)
    torch.manual_seed(0)
    cases = []
    for fixture, directory in FIXTURES.items():
        cases += references(fixture, directory, args.seed)
    with open(args.output, "w", encoding="utf-8") as f:
        # One case a line: small, and a changed reference shows as a changed line.
        lines = ",\n".join(json.dumps(case) for case in cases)
        f.write(f'{{"transformers": {json.dumps(transformers.__version__)}, "cases": [\n{lines}\n]}}\n')
    print("wrote", os.path.normpath(args.output), len(cases), "cases")


if __name__ == "__main__":
    main()
