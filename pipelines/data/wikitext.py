"""WikiText files: finding splits, reading lines strictly, counting words.

A split is read as UTF-8 text, one line per paragraph or heading. The file's
final newline ends the last line (it does not start an empty one), so the
validation split reads as 3,760 lines and 217,646 tokens (words plus one
`<eos>` per line), the official counts.
"""

import os

SPLITS = ("train", "valid", "test")
# The variants of the TFDS builder (`pipelines.data.wikitext_tfds`), named here
# so that a config can be checked without importing TensorFlow Datasets.
WIKITEXT_VARIANTS = ("wikitext-2-v1", "wikitext-2-raw-v1", "wikitext-103-v1", "wikitext-103-raw-v1")
SPLIT_ALIASES = {"validation": "valid", "val": "valid"}
EXPECTED = "wiki.{split}.tokens (wikitext-2-v1) or wiki.{split}.raw (wikitext-2-raw-v1)"
HOW_TO_GET = (
    "Download https://wikitext.smerity.com/wikitext-2-v1.zip (or wikitext-2-raw-v1.zip), unzip it and "
    "pass the folder holding the wiki.*.tokens files."
)


def canonical_split(split):
    split = SPLIT_ALIASES.get(split, split)
    if split not in SPLITS:
        raise ValueError(
            f"`split` must be one of {SPLITS} (or the path of a text file or folder). Received: split={split!r}"
        )
    return split


def find_split(data_dir, split):
    """Path of `split` in `data_dir` (or a `wikitext-2*` folder inside it)."""
    split = canonical_split(split)
    if not data_dir or not os.path.isdir(data_dir):
        raise FileNotFoundError(
            f"Data directory {data_dir!r} does not exist. Expected it to hold "
            f"{EXPECTED.format(split=split)}. {HOW_TO_GET}"
        )
    candidates = [data_dir] + [
        os.path.join(data_dir, d) for d in sorted(os.listdir(data_dir)) if d.startswith("wikitext")
    ]
    for folder in candidates:
        for suffix in ("tokens", "raw"):
            path = os.path.join(folder, f"wiki.{split}.{suffix}")
            if os.path.isfile(path):
                return path
    raise FileNotFoundError(
        f"No {split} split in {data_dir!r}: expected {EXPECTED.format(split=split)} there or in a "
        f"wikitext-2* subfolder. {HOW_TO_GET}"
    )


def read_lines(path):
    """Lines of a UTF-8 text file, without their newlines. Errors name the file and byte."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No such file: {path!r}")
    with open(path, "rb") as f:
        data = f.read()
    if not data.strip():
        raise ValueError(f"{path!r} is empty: no text to read")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path!r} is not valid UTF-8: byte 0x{data[error.start]:02x} at byte offset {error.start} ({error.reason})"
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def read_corpus(path):
    """Lines of a text file, or of every file in a directory (sorted by name)."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if os.path.isfile(os.path.join(path, f)))
        if not files:
            raise FileNotFoundError(f"Directory {path!r} holds no files")
        return [line for f in files for line in read_lines(f)]
    return read_lines(path)


def split_lines(data_dir, split):
    """Lines of a split: any text file or directory given as `split` (or as `data_dir`),
    else the WikiText split `split` of `data_dir` (as in `find_split`)."""
    if not is_named_split(split) and os.path.exists(split):
        return read_corpus(split)
    if data_dir and os.path.isfile(data_dir):
        return read_corpus(data_dir)
    if not is_named_split(split):
        raise FileNotFoundError(
            f"No such file or folder: {split!r} (a split is train, valid, test, or the path of a text file or folder)"
        )
    return read_lines(find_split(data_dir, split))


def count_words(lines):
    """Words of the standard word-level setting: whitespace words + one `<eos>` per line."""
    return sum(len(line.split()) for line in lines) + len(lines)


def count_characters(lines):
    """Unicode characters of the lines, one newline per line included (as the char tokenizer reads them)."""
    return sum(len(line) for line in lines) + len(lines)


def is_named_split(split):
    """True for a WikiText split name (`train`, `valid`, `test`, `validation`), False for a path."""
    return split in SPLITS or split in SPLIT_ALIASES


def split_stats(lines):
    words = sum(len(line.split()) for line in lines)
    return {"lines": len(lines), "words": words, "tokens": words + len(lines)}
