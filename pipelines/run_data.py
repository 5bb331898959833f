"""A run's tokenizer and token streams: trained or loaded and checked, cached in the run (`tfam train`)."""

import hashlib
import os
import re

import numpy as np

from pipelines.data.lm_stream import tokenize_lines
from pipelines.data.tokenizers import load_tokenizer, train_tokenizer
from pipelines.data.wikitext import is_named_split, split_lines
from pipelines.errors import CorruptFileError, notice
from pipelines.files import atomic_path, bytes_digest, file_digest, read_json, set_aside


def run_tokenizer(run_dir, config, train_lines):
    """The run's tokenizer: loaded (and checked), or trained; `(tokenizer, needs_saving)`.

    A damaged tokenizer file is repaired by training again on the train
    split, which is deterministic: the retrained files must have the digests
    that `tokenizer.json` recorded, or the run stops.
    """
    directory = os.path.join(run_dir, "tokenizer")
    if not os.path.isdir(directory) or not os.listdir(directory):
        return train_tokenizer(config.tokenizer, train_lines, config.vocabulary_size, config.init_from), True
    try:
        return load_tokenizer(directory), False
    except CorruptFileError as error:
        damage = error
    except FileNotFoundError:  # files without tokenizer.json: a save that older versions did not finish
        damage = CorruptFileError(directory, "holds no complete tokenizer (no tokenizer.json)")
    retrained = train_tokenizer(config.tokenizer, train_lines, config.vocabulary_size, config.init_from)
    digests = {name: bytes_digest(data) for name, data in retrained.files().items()}
    try:
        recorded = read_json(os.path.join(directory, "tokenizer.json")).get("files")
    except (CorruptFileError, AttributeError):
        # The manifest itself is damaged: compare with the files on disk instead.
        recorded = {
            name: file_digest(os.path.join(directory, name))
            for name in digests
            if os.path.isfile(os.path.join(directory, name))
        }
    if recorded != digests:
        raise CorruptFileError(
            damage.path,
            damage.problem,
            action="training the tokenizer again on the train split does not give the recorded one "
            "(tokenizer.json), so the run cannot go on with it: restore the file, or start a new run "
            "in another --out",
        )
    notice(f"{damage}: trained the tokenizer again on the train split (identical to the recorded one) and rewrote it")
    set_aside(directory)
    save_tokenizer(retrained, directory)
    return retrained, False


def save_tokenizer(tokenizer, directory):
    # Staged in a temporary folder and renamed: a kill leaves no half tokenizer.
    with atomic_path(directory, fault="tokenizer-write") as staging:
        tokenizer.save(staging)


# Bump when tokenization changes, so that caches of the old code are not reused.
_CACHE_VERSION = 1


def cached_tokens(run_dir, tokenizer, lines, split):
    """The split's token stream, cached in the run under a key of everything that produced it.

    The key hashes the tokenizer (kind, vocabulary, merges) and the text
    itself, so another tokenizer or an edited file never reads a stale
    cache. A cache that does not read back as int32 ids of this vocabulary
    is rebuilt.
    """
    key = hashlib.sha256(f"tfam-cache-{_CACHE_VERSION}\0{tokenizer.fingerprint()}\0".encode("utf-8"))
    for line in lines:
        key.update(line.encode("utf-8"))
        key.update(b"\n")
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", os.path.basename(os.path.normpath(split))) or "split"
    path = os.path.join(run_dir, "cache", f"{label}-{key.hexdigest()[:20]}.npy")
    if os.path.isfile(path):
        try:
            tokens = np.load(path, allow_pickle=False)
            problem = None
        except (ValueError, OSError, EOFError) as error:
            problem = f"cannot be read ({error})"
        else:
            if tokens.dtype != np.int32 or tokens.ndim != 1:
                problem = f"holds {tokens.dtype} of shape {tokens.shape}, not a stream of int32 ids"
            elif tokens.size and (tokens.min() < 0 or tokens.max() >= tokenizer.vocabulary_size):
                problem = f"holds ids outside [0, {tokenizer.vocabulary_size})"
        if problem is None:
            return tokens
        notice(f"{path} {problem}: tokenizing {split} again")
    tokens = tokenize_lines(tokenizer, lines)
    with atomic_path(path, fault="cache-write") as temp:
        with open(temp, "wb") as f:
            np.save(f, tokens)
    return tokens


def split_text(config, split):
    """A split's lines: a text file or folder given as the split, a WikiText split of `data_dir`,
    or, for a named split without `data_dir` only, WikiText downloaded through the TFDS builder."""
    if config.data_dir or not is_named_split(split):
        return split_lines(config.data_dir, split)
    from pipelines.data.wikitext_tfds import tfds_split_lines

    return tfds_split_lines(config.dataset, split)
