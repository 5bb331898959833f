"""Writes the SentencePiece-only tokenizer fixtures under tests/fixtures/ (the `bench` extra: transformers).

A checkpoint directory may hold a SentencePiece `tokenizer.model` and no
`tokenizer.json` (Llama 2 and Mistral 7B v0.1 were published so; Gemma's
repositories hold both). Each fixture is such a directory: a SentencePiece BPE
model trained here with the `sentencepiece` trainer on WikiText-2 (validation
split) with the family's settings, a `tokenizer_config.json` as the family
writes it, and `reference.json`: texts (WikiText-2 test lines and edge cases:
leading, doubled and trailing spaces, tabs, newlines, unicode, special tokens
inside the text) with the ids and the decoded text of transformers' tokenizer.

    .venv/bin/python -m pip install -e '.[bench]'
    .venv/bin/python scripts/make_sentencepiece_fixtures.py [--data ../shared/data/wikitext-2]

Runs without TensorFlow (transformers and TensorFlow in one process crash).
"""

import argparse
import json
import os
import tempfile

import sentencepiece
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
EDGE_CASES = [
    "Hello",
    " Hello",
    "  two leading spaces",
    "a  b   c",
    "trailing ",
    "\tTab and\ttabs",
    "two\nlines",
    "naïve café 1,234.5 — 東京 🙂",
    "<unk> and </s> inside",
    "",
    " ",
    "<start_of_turn>user hi",
]
FAMILIES = {
    # Llama 2 / Mistral v0.1: a dummy prefix, no whitespace normalisation, digits split, byte fallback.
    "spm-llama-tiny": dict(
        trainer=dict(
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=True,
            byte_fallback=True,
            split_digits=True,
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            user_defined_symbols=["<start_of_turn>"],
        ),
        config={
            "tokenizer_class": "LlamaTokenizer",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": False,
            "legacy": False,
            "clean_up_tokenization_spaces": False,
        },
    ),
    # Llama 2 read the legacy way (`legacy: true`): the prefix before every piece of text.
    "spm-llama-legacy-tiny": dict(
        same_model_as="spm-llama-tiny",
        config={
            "tokenizer_class": "LlamaTokenizer",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "add_bos_token": True,
            "add_eos_token": True,
            "legacy": True,
            "clean_up_tokenization_spaces": False,
        },
    ),
    # Gemma: no dummy prefix, pad/eos/bos/unk at 0-3, byte fallback, a user-defined control-like piece.
    "spm-gemma-tiny": dict(
        trainer=dict(
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            byte_fallback=True,
            split_digits=True,
            pad_id=0,
            eos_id=1,
            bos_id=2,
            unk_id=3,
            pad_piece="<pad>",
            eos_piece="<eos>",
            bos_piece="<bos>",
            unk_piece="<unk>",
            user_defined_symbols=["<start_of_turn>"],
        ),
        config={
            "tokenizer_class": "GemmaTokenizer",
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "unk_token": "<unk>",
            "pad_token": "<pad>",
            "add_bos_token": True,
            "add_eos_token": False,
        },
    ),
}


def lines(data, split, count=None):
    with open(os.path.join(data, f"wiki.{split}.tokens"), encoding="utf-8") as f:
        text = [line.rstrip("\n") for line in f if line.strip()]
    return text[:count] if count else text


def write(name, spec, data):
    directory = os.path.join(ROOT, name)
    os.makedirs(directory, exist_ok=True)
    source = spec.get("same_model_as")
    if source:
        with open(os.path.join(ROOT, source, "tokenizer.model"), "rb") as f:
            model = f.read()
    else:
        with tempfile.TemporaryDirectory() as scratch:
            corpus = os.path.join(scratch, "corpus.txt")
            with open(corpus, "w", encoding="utf-8") as f:
                f.write("\n".join(lines(data, "valid", 4000)))
            sentencepiece.SentencePieceTrainer.train(
                input=corpus,
                model_prefix=os.path.join(scratch, "tokenizer"),
                model_type="bpe",
                vocab_size=700,
                character_coverage=1.0,
                minloglevel=2,
                **spec["trainer"],
            )
            with open(os.path.join(scratch, "tokenizer.model"), "rb") as f:
                model = f.read()
    with open(os.path.join(directory, "tokenizer.model"), "wb") as f:
        f.write(model)
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(spec["config"], f, indent=2)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    texts = lines(data, "test", 40) + EDGE_CASES
    ids = [tokenizer(text)["input_ids"] for text in texts]
    reference = {
        "transformers": transformers.__version__,
        "tokenizer_class": type(tokenizer).__name__,
        "texts": texts,
        "ids": ids,
        "decoded": [tokenizer.decode(row, skip_special_tokens=True) for row in ids],
    }
    with open(os.path.join(directory, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(reference, f, ensure_ascii=False, indent=0)
    assert sorted(os.listdir(directory)) == ["reference.json", "tokenizer.model", "tokenizer_config.json"]
    print(name, type(tokenizer).__name__, "vocabulary", len(tokenizer), "ids of", len(texts), "texts")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_data = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "wikitext-2")
    parser.add_argument("--data", default=default_data)
    parser.add_argument("--only", nargs="*", default=list(FAMILIES))
    args = parser.parse_args()
    print("transformers", transformers.__version__, "sentencepiece", sentencepiece.__version__)
    for name in args.only:
        write(name, FAMILIES[name], args.data)


if __name__ == "__main__":
    main()
