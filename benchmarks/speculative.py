"""Speculative decoding on a trained pair (mini protocol): plain, draft-model, prompt-lookup and early-exit greedy
decoding, ours and transformers' (`assistant_model`, `prompt_lookup_num_tokens`) on the same weights.

    tfam train --config gpt2_tiny ... --out runs/gpt2_tiny                      # the target (bash scripts/main.sh)
    tfam train --config gpt2_tiny --num-layers 1 --hidden-dim 64 ... --out runs/draft   # the draft, same tokenizer
    python benchmarks/speculative.py --target runs/gpt2_tiny --draft runs/draft --data-dir ../shared/data/wikitext-2 \
        [--ks 1 2 4] [--tokens 64] [--prompts 8] [--peers-python .venv-peers/bin/python]

Our cases run in this process, transformers' in one of its own (`--peers-python`), on the pair exported with
`save_to_huggingface`. The prompts: the first 32 tokens of `--prompts` test blocks spread over the split; greedy,
`--tokens` new tokens, no stop token. For each case: tokens/s at batch 1 (each prompt alone) and 4 (ours), the
speed-up over plain decoding of the same library, whether the tokens are plain decoding's, and for drafted cases
the tokens per pass of the target (from the tokens: every drafter here is deterministic) with the acceptance rate
`a` (the draft's greedy token agreeing with the target's, teacher-forced) and the speed-up the formula
`(1 - a^(K+1)) / ((1 - a)(1 + K c))` predicts, `c` the draft's step cost over the target's (their plain tok/s).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import add_smoke, machine, skipped, smoke_folder, smoke_settings  # noqa: E402

PROMPT_LENGTH, BATCH = 32, 4


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help="the target's run directory (tfam train)")
    parser.add_argument("--draft", help="the draft's run directory, trained with the same tokenizer")
    parser.add_argument("--data-dir", help="the WikiText-2 folder (its test split)")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4], help="drafted tokens per pass")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--prompts", type=int, default=8, help="prompts (a multiple of 4)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case; the median counts")
    parser.add_argument("--peers-python", help="the Python of transformers (none: ours only)")
    parser.add_argument("--transformers", help=argparse.SUPPRESS)  # a JSON request: the peers' process
    add_smoke(parser)
    args = smoke_settings(parser.parse_args(), ks=[2], tokens=4, prompts=BATCH, repeats=1)
    if not args.transformers and not args.smoke and not (args.target and args.draft and args.data_dir):
        parser.error("--target, --draft and --data-dir are required")
    if args.prompts % BATCH or min(args.ks + [args.tokens, args.prompts, args.repeats]) < 1:
        parser.error(f"--prompts must be a positive multiple of {BATCH}, the counts positive. Received: {vars(args)}")
    return args


def timed(generate, batches, repeats):
    """`(tokens (N, T) int, tokens/s)`: `generate(batch)` over every batch, the median of `repeats` after a
    warm-up; tokens/s counts the new tokens of every row."""
    outputs = [np.asarray(generate(batch)) for batch in batches]  # the warm-up compiles
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            generate(batch)
        seconds.append(time.perf_counter() - start)
    return np.concatenate(outputs), float(np.median(seconds))


def agreement(draft_logits, tokens):
    """`(N, new)` bool: the draft's greedy token after each prefix equals the token there (teacher-forced)."""
    return np.argmax(draft_logits[:, PROMPT_LENGTH - 1 : -1], axis=-1) == tokens[:, PROMPT_LENGTH:]


def passes(agrees, drafted, rows):
    """Passes of the target per new token of the drafted loop, rows of `rows` at a time sharing a position: a pass
    keeps each row's drafts up to its first miss, the batch advances by the fewest kept plus one."""
    total = 0
    for group in range(0, len(agrees), rows):
        hits, index, count = agrees[group : group + rows], 0, 0
        while index < hits.shape[1]:
            window = hits[:, index : index + drafted]
            kept = np.cumprod(np.pad(window, ((0, 0), (0, drafted - window.shape[1]))), axis=1).sum(axis=1)
            index, count = index + int(kept.min()) + 1, count + 1
        total += count
    return total / (len(agrees) * agrees.shape[1] / rows)


def ours(args):
    import keras

    import keras_tfam
    from keras_tfam.generation import Generator
    from keras_tfam.models import EarlyExitLM
    from pipelines.commands import load_run
    from pipelines.data.lm_stream import lm_dataset, make_blocks, tokenize_lines
    from pipelines.data.wikitext import split_lines
    from pipelines.evaluation import evaluate_perplexity

    keras_tfam.cpu.configure()
    target, tokenizer = load_run(args.target, needs_tokenizer=True)
    draft, draft_tokenizer = load_run(args.draft, needs_tokenizer=True)
    if draft_tokenizer.fingerprint() != tokenizer.fingerprint():
        raise SystemExit(f"{args.draft} does not tokenize as {args.target}")
    tokens = tokenize_lines(tokenizer, split_lines(args.data_dir, "test"))
    quality = {}
    for name, model in (("target", target), ("draft", draft)):
        result = evaluate_perplexity(model, lm_dataset(tokens, 128, 16, tokenizer.eos_id))
        quality[name] = {"test_token_perplexity": result["token_perplexity"], "layers": model.num_layers}
    blocks = make_blocks(tokens, 128, tokenizer.eos_id)[0]
    picked = blocks[np.linspace(0, len(blocks) - 1, args.prompts).astype(int), :PROMPT_LENGTH].astype("int32")
    drafts = {"draft": draft}
    if target.num_layers > 1:  # its first layer through the shared head drafts
        drafts["early-exit"] = EarlyExitLM(target).draft_model(1)
    cases = {"plain": {}}
    for k in args.ks:
        cases.update({f"{name}-{k}": {"draft_model": model, "num_draft_tokens": k} for name, model in drafts.items()})
        cases[f"lookup-{k}"] = {"prompt_lookup_num_tokens": k}
    results = {"quality": quality, "cases": {}}
    for rows in (1, BATCH):
        batches = [picked[i : i + rows] for i in range(0, len(picked), rows)]
        for name, options in cases.items():
            out, seconds = timed(lambda ids: target.generate(ids, args.tokens, **options), batches, args.repeats)
            results["cases"][f"{name}@{rows}"] = {"tokens_per_s": out.shape[0] * args.tokens / seconds, "tokens": out}
        for name, model in drafts.items():  # the draft's own step cost
            generator = Generator(model)  # one, so that its compiled loop is reused
            _, seconds = timed(lambda ids: generator.generate(ids, args.tokens), batches, args.repeats)
            results["cases"][f"{name}-alone@{rows}"] = {"tokens_per_s": len(picked) * args.tokens / seconds}
    plain = results["cases"]["plain@1"]["tokens"]
    results["agreement"] = {
        name: agreement(keras.ops.convert_to_numpy(model.call_with_cache(plain, model.init_cache(len(plain),
                        plain.shape[1]), 0).logits), plain)
        for name, model in drafts.items()
    }  # fmt: skip
    results["prompts"] = picked
    return target, draft, results


def transformers_process(request):
    """In the peers' Python: transformers' greedy decoding, plain, assisted and prompt lookup, of each prompt."""
    import torch
    import transformers

    torch.set_grad_enabled(False)
    target = transformers.AutoModelForCausalLM.from_pretrained(request["target"]).eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(request["draft"]).eval()
    cases = {"plain": {}}
    for k in request["ks"]:
        cases[f"draft-{k}"] = dict(
            assistant_model=draft, num_assistant_tokens=k, num_assistant_tokens_schedule="constant",
            assistant_confidence_threshold=0.0,
        )  # fmt: skip
        cases[f"lookup-{k}"] = {"prompt_lookup_num_tokens": k}
    out = {"versions": f"torch {torch.__version__}, transformers {transformers.__version__}", "cases": {}}
    new = request["tokens"]
    for name, options in cases.items():

        def generate(ids, options=options):
            inputs = torch.tensor([ids], dtype=torch.long)
            config = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None)
            return target.generate(inputs, attention_mask=torch.ones_like(inputs), **config, **options)[0].tolist()

        tokens = [generate(ids) for ids in request["prompts"]]
        seconds = []
        for _ in range(request["repeats"]):
            start = time.perf_counter()
            for ids in request["prompts"]:
                generate(ids)
            seconds.append(time.perf_counter() - start)
        out["cases"][name] = {"tokens_per_s": len(tokens) * new / float(np.median(seconds)), "tokens": tokens}
    return out


def main():
    args = parse_args()
    if args.transformers:
        with open(args.transformers) as f:
            print(json.dumps(transformers_process(json.load(f))))
        return
    if args.smoke:  # a tiny target of two layers and a draft of one, with the same tokenizer
        from mini_protocol import smoke_run

        folder = smoke_folder("speculative")
        args.target, args.data_dir = smoke_run(folder, "target", **{"num-layers": 2})
        args.draft, _ = smoke_run(folder, "draft", **{"hidden-dim": 16})
        skipped("transformers")
        args.peers_python = None
    target, draft, results = ours(args)
    theirs = None
    if args.peers_python:
        folder = tempfile.mkdtemp(prefix="keras_tfam_speculative_")
        request = {"target": os.path.join(folder, "target"), "draft": os.path.join(folder, "draft"), "ks": args.ks,
                   "tokens": args.tokens, "repeats": args.repeats, "prompts": results["prompts"].tolist()}  # fmt: skip
        target.save_to_huggingface(request["target"])
        draft.save_to_huggingface(request["draft"])
        with open(os.path.join(folder, "request.json"), "w") as f:
            json.dump(request, f)
        done = subprocess.run(
            [args.peers_python, __file__, "--transformers", os.path.join(folder, "request.json")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        theirs = json.loads(done.stdout.strip().splitlines()[-1])
    report(args, results, theirs)


def report(args, results, theirs):
    cases, quality = results["cases"], results["quality"]
    print(f"{machine()}; {args.prompts} prompts of {PROMPT_LENGTH} test tokens, {args.tokens} greedy tokens each")
    for name, q in quality.items():
        print(f"- {name}: {q['layers']} layers, test token perplexity {q['test_token_perplexity']:.1f}")
    plain = cases["plain@1"]["tokens"]
    print("\n| library | case | batch | tok/s | vs plain | plain's tokens | passes per token | a | formula |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|")
    for key, case in cases.items():
        name, rows = key.split("@")
        if name.endswith("-alone"):
            continue
        rows = int(rows)
        base = cases[f"plain@{rows}"]["tokens_per_s"]
        same = bool((case["tokens"] == plain).all())
        speed = case["tokens_per_s"]
        row = f"| keras_tfam | {name} | {rows} | {speed:.1f} | {speed / base:.2f}x | {same} |"
        kind = name.rsplit("-", 1)[0]
        if kind in results["agreement"]:
            k, agrees = int(name.rsplit("-", 1)[1]), results["agreement"][kind]
            a = float(agrees.mean())
            c = base / cases[f"{kind}-alone@{rows}"]["tokens_per_s"]
            expected = k + 1 if a == 1 else (1 - a ** (k + 1)) / (1 - a)  # tokens per pass
            formula = expected / (1 + k * c)
            row += f" {passes(agrees, k, rows):.2f} | {a:.2f} | {formula:.2f}x (c = {c:.2f}) |"
        else:
            row += " - | - | - |"
        print(row)
    if theirs is not None:
        base = theirs["cases"]["plain"]["tokens_per_s"]
        for name, case in theirs["cases"].items():
            ours_speed = cases[f"{name}@1"]["tokens_per_s"]
            same = case["tokens"] == plain.tolist()
            print(f"| transformers | {name} | 1 | {case['tokens_per_s']:.1f} | {case['tokens_per_s'] / base:.2f}x | "
                  f"{same} | keras_tfam / transformers: {ours_speed / case['tokens_per_s']:.2f}x | | |")  # fmt: skip
        print(f"\ntransformers: {theirs['versions']}")


if __name__ == "__main__":
    main()
