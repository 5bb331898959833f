"""Prompt lookup decoding against plain greedy decoding, ours and transformers', on the same GPT-2 small weights.

    bash benchmarks/install_peers.sh
    python benchmarks/prompt_lookup.py [--tokens 64] [--repeats 1] [--peers-python .venv-peers/bin/python]

The weights: GPT-2 small with random weights, written by transformers (`generate_vs_transformers.write_checkpoint`)
and imported by us. The prompt repeats itself (32 random tokens twice, then their first 8), greedy decoding. Each
case runs in a fresh process:

- `keras_tfam-plain`, `keras_tfam-lookup-K` (K = 2, 4, 8 drafted tokens): tokens/s at batch 1 and 4;
- `transformers-plain`, `transformers-lookup-K`: tokens/s at batch 1 (transformers' prompt lookup takes one row).

Prints tokens/s, the speed-up over plain decoding of the same library, the passes of the model per new token and
the acceptance rate of the drafts (both from the tokens: the drafter is deterministic), and whether every case gave
plain decoding's tokens.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import (  # noqa: E402
    case_arguments,
    interleaved_processes,
    machine,
    median_seconds,
    run_json,
    skipped,
    smoke_folder,
    tiny_gpt2_checkpoint,
)

DRAFTS = (2, 4, 8)
CASES = [
    f"{lib}-{kind}" for lib in ("keras_tfam", "transformers") for kind in ["plain", *(f"lookup-{k}" for k in DRAFTS)]
]
BATCHES = {"keras_tfam": (1, 4), "transformers": (1,)}
CHECKPOINT = os.path.join(tempfile.gettempdir(), "keras_tfam_prompt_lookup_gpt2")


def prompts(batch):
    text = np.random.default_rng(batch).integers(0, 50257, size=(batch, 32))
    return np.concatenate([text, text, text[:, :8]], axis=1).astype("int32")


def passes(tokens, prompt_width, new, drafted, ngram=2):
    """`(passes, accepted drafts)` of the drafted loop over `tokens` `(B, prompt_width + new)`: at each pass every
    row keeps its drafts up to its first miss, the batch advances by the fewest kept plus one."""
    from keras_tfam.generation import PromptLookup

    lookup = PromptLookup(drafted, ngram)
    index, count, kept = prompt_width, 1, 0  # the prefill's pass
    while index < prompt_width + new:
        padded = np.pad(tokens, ((0, 0), (0, drafted)))
        drafts = np.asarray(lookup.draft(padded, np.int32(index)))
        truth = padded[:, index : index + drafted]
        hits = np.cumprod(drafts == truth, axis=1).sum(axis=1)
        step = min(int(hits.min()) + 1, prompt_width + new - index)
        kept, index, count = kept + step - 1, index + step, count + 1
    return count, kept


def run_case(case, tokens, export_dir):
    library, kind = case.split("-", 1)
    drafted = None if kind == "plain" else int(kind.split("-")[1])
    out = {"tokens_per_s": {}, "tokens": {}}
    if library == "keras_tfam":
        import keras_tfam

        keras_tfam.cpu.configure()
        from keras_tfam.models import GPT2LM

        model = GPT2LM.from_huggingface(export_dir)
        options = {} if drafted is None else {"prompt_lookup_num_tokens": drafted}

        def generate(ids):
            return np.asarray(model.generate(ids, tokens, **options))

    else:
        import torch
        import transformers

        torch.set_grad_enabled(False)
        model = transformers.GPT2LMHeadModel.from_pretrained(export_dir).eval()
        options = {} if drafted is None else {"prompt_lookup_num_tokens": drafted}

        def generate(ids):
            inputs = torch.tensor(ids, dtype=torch.long)
            config = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
            return model.generate(inputs, attention_mask=torch.ones_like(inputs), **config, **options).numpy()

    for batch in BATCHES[library]:
        ids = prompts(batch)
        result = generate(ids)
        out["tokens_per_s"][batch] = batch * tokens / median_seconds(lambda: generate(ids), warmup=0, repeats=3)
        out["tokens"][batch] = result[:, : ids.shape[1] + tokens].tolist()
    return out


def checkpoint_option(parser):
    parser.add_argument("--checkpoint", default=CHECKPOINT, help=argparse.SUPPRESS)  # the weights every case loads


def main():
    args = case_arguments(__doc__.splitlines()[0], CASES, tokens=64, repeats=1, peers=True, options=checkpoint_option)
    if args.case:
        print(json.dumps(run_case(args.case, args.tokens, args.checkpoint)))
        return
    if args.smoke:  # a tiny GPT-2 of our own: plain decoding and one drafted case of ours
        args.checkpoint = os.path.join(smoke_folder("prompt_lookup"), "gpt2")
        tiny_gpt2_checkpoint(args.checkpoint)
    else:
        here = os.path.dirname(os.path.abspath(__file__))
        run_json(os.path.join(here, "generate_vs_transformers.py"), "--engine", "write", "--checkpoint",
                 args.checkpoint, python=args.peers_python)  # fmt: skip
    arguments = ("--tokens", args.tokens, "--checkpoint", args.checkpoint)
    if args.smoke:
        skipped(", ".join(CASES[2:4]), "--smoke drafts 2 tokens only")
        skipped(", ".join(CASES[4:]))
        results = interleaved_processes(__file__, CASES[:2], args.repeats, *arguments, smoke=True)
    else:
        ours = interleaved_processes(__file__, CASES[:4], args.repeats, *arguments)
        theirs = interleaved_processes(__file__, CASES[4:], args.repeats, *arguments, python=args.peers_python)
        results = {**ours, **theirs}
    print(
        f"{machine()}; GPT-2 small, random weights; a 72-token prompt that repeats itself, {args.tokens} greedy tokens"
    )
    print("\n| case | batch | tok/s | vs plain | passes per token | drafts kept | plain's tokens |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for case in results:
        library = case.split("-")[0]
        best = max(results[case], key=lambda r: r["tokens_per_s"]["1"])
        plain = max(results[f"{library}-plain"], key=lambda r: r["tokens_per_s"]["1"])
        for batch in map(str, BATCHES[library]):
            speed, base = best["tokens_per_s"][batch], plain["tokens_per_s"][batch]
            same = best["tokens"][batch] == results["keras_tfam-plain"][0]["tokens"][batch]
            row = f"| {case} | {batch} | {speed:.1f} | {speed / base:.2f}x |"
            if "lookup" in case:
                drafted = int(case.split("-")[-1])
                tokens = np.asarray(best["tokens"][batch])
                count, kept = passes(tokens, prompts(int(batch)).shape[1], args.tokens, drafted)
                row += f" {count / args.tokens:.2f} | {kept / max(count - 1, 1) / drafted:.0%} |"
            else:
                row += " 1.00 | - |"
            print(f"{row} {same} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
