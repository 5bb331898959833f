"""Tokenizers whose tokenize/detokenize are TensorFlow ops (a SavedModel can embed them).

Each tokenizer maps a batch of text lines `(N,)` to ragged ids `(N, None)`,
every line ending in the tokenizer's end-of-line token, so that a split
tokenized line by line and concatenated is the split's token stream.

- `WordTokenizer`: the standard WikiText setting. Whitespace-separated
  words, `<eos>` at the end of every line, `<unk>` kept as a token (WikiText
  already replaced rare words by it); out-of-vocabulary words map to `<unk>`.
  Vocabulary from the train split, most frequent first.
- `BPETokenizer`: GPT-2 byte-level BPE. Training uses Hugging Face
  `tokenizers` (its Rust trainer writes exactly GPT-2's `vocab.json` +
  `merges.txt`); tokenizing in the graph uses keras-hub's `BytePairTokenizer`,
  which reads the same two files, so the real GPT-2 vocabulary loads too. Byte-level: detokenize(tokenize(text)) ==
  text for any text.
- `CharTokenizer`: one id per Unicode character, for quick experiments on any
  text file.
- `CheckpointTokenizer`: the tokenizer of an imported Hugging Face checkpoint
  (`tfam train --init-from`): its `tokenizer.json` or SentencePiece
  `tokenizer.model`, run by `keras_tfam.convert.HuggingFaceTokenizer` with the
  ids of transformers. Eagerly (the training data, `tfam generate`) it runs in
  Python; in a graph (an export's `generate_text`) it runs as TensorFlow ops,
  `pipelines.data.graph_tokenizer.GraphTokenizer`, with the same ids and text.
  A pipeline without an exact graph version (`in_graph` false, the reason in
  `not_in_graph`) is exported with the token-level signatures only.

A saved tokenizer is a folder: its files (written atomically) and
`tokenizer.json`, written last, holding the kind and each file's size and
SHA-256, so that `load_tokenizer` can tell a damaged file from a good one.
"""

import collections
import hashlib
import json
import os

import numpy as np
import tensorflow as tf

from pipelines.errors import CorruptFileError
from pipelines.files import atomic_write_bytes, atomic_write_json, bytes_digest, digest_problem, read_json

EOS, UNK = "<eos>", "<unk>"
ENDOFTEXT = "<|endoftext|>"


class Tokenizer(tf.Module):
    """Interface: `tokenize(lines) -> RaggedTensor`, `detokenize(ids) -> strings`."""

    kind = None
    #: Whether tokenize/detokenize are TensorFlow ops (an export can embed them).
    in_graph = True
    #: The id that ends a line; a stream is read as if preceded by one.
    eos_id = None

    def tokenize(self, lines):
        raise NotImplementedError

    def tokenize_prompt(self, prompts):
        raise NotImplementedError

    def detokenize(self, ids):
        raise NotImplementedError

    @property
    def vocabulary_size(self):
        raise NotImplementedError

    def files(self):
        """`{file name: bytes}`: what `save` writes and `load` reads back."""
        raise NotImplementedError

    def fingerprint(self):
        """SHA-256 (hex) of the kind and the saved files: equal fingerprints tokenize alike."""
        sha = hashlib.sha256(self.kind.encode("utf-8"))
        for name, data in sorted(self.files().items()):
            sha.update(f"\0{name}\0{len(data)}\0".encode("utf-8"))
            sha.update(data)
        return sha.hexdigest()

    def save(self, directory):
        """Writes the files, then `tokenizer.json` with their digests (each file atomically)."""
        os.makedirs(directory, exist_ok=True)
        files = self.files()
        for name, data in files.items():
            os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
            atomic_write_bytes(os.path.join(directory, name), data)
        manifest = {
            "kind": self.kind,
            "vocabulary_size": self.vocabulary_size,
            "files": {name: bytes_digest(data) for name, data in files.items()},
        }
        atomic_write_json(os.path.join(directory, "tokenizer.json"), manifest)


def _lookup_table(tokens, default):
    keys = tf.constant(tokens)
    values = tf.range(len(tokens), dtype=tf.int32)
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default_value=default)


def _as_ragged(ids):
    ids = tf.convert_to_tensor(ids) if not isinstance(ids, tf.RaggedTensor) else ids
    if isinstance(ids, tf.RaggedTensor):
        return ids
    if ids.shape.rank == 1:
        ids = ids[None]
    return tf.RaggedTensor.from_tensor(ids)


class WordTokenizer(Tokenizer):
    """Word-level tokenizer: whitespace words plus `<eos>` per line.

    Args:
        vocabulary: list of word types; must contain `<eos>` and `<unk>`.
    """

    kind = "word"
    file_names = ("vocab.txt",)

    def __init__(self, vocabulary):
        super().__init__()
        missing = [t for t in (EOS, UNK) if t not in vocabulary]
        if missing:
            raise ValueError(f"`vocabulary` must contain {missing}. Received {len(vocabulary)} types")
        self.vocabulary = list(vocabulary)
        self.eos_id = self.vocabulary.index(EOS)
        self.unk_id = self.vocabulary.index(UNK)
        self._table = _lookup_table(self.vocabulary, self.unk_id)
        self._words = tf.constant(self.vocabulary)

    @classmethod
    def train(cls, lines, max_size=None, min_count=1):
        """Vocabulary of `lines`: every type, most frequent first (ties: first seen)."""
        counts = collections.Counter()
        for line in lines:
            counts.update(line.split())
            counts[EOS] += 1
        counts.setdefault(UNK, 0)
        ordered = sorted(counts, key=lambda w: -counts[w])  # stable: first seen wins ties
        ordered = [w for w in ordered if counts[w] >= min_count or w in (EOS, UNK)]
        if max_size is not None:
            keep = ordered[:max_size]
            for special in (EOS, UNK):
                if special not in keep:
                    keep[-1 if special == UNK else -2] = special
            ordered = keep
        return cls(ordered)

    @property
    def vocabulary_size(self):
        return len(self.vocabulary)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def tokenize(self, lines):
        words = tf.strings.split(lines)
        eos = tf.fill(tf.stack([words.nrows(), 1]), EOS)
        words = tf.concat([words, tf.RaggedTensor.from_tensor(eos)], axis=1)
        return tf.ragged.map_flat_values(self._table.lookup, words)

    def tokenize_prompt(self, prompts):
        """Like `tokenize`, without the end-of-line token."""
        return tf.ragged.map_flat_values(self._table.lookup, tf.strings.split(prompts))

    def detokenize(self, ids):
        ids = _as_ragged(ids)
        words = tf.ragged.map_flat_values(lambda i: tf.gather(self._words, i), ids)
        text = tf.strings.reduce_join(words, axis=-1, separator=" ")
        text = tf.strings.regex_replace(text, f" ?{EOS} ?", "\n")
        return text

    def files(self):
        return {"vocab.txt": ("\n".join(self.vocabulary) + "\n").encode("utf-8")}

    @classmethod
    def load(cls, directory):
        with open(os.path.join(directory, "vocab.txt"), encoding="utf-8") as f:
            return cls([line.rstrip("\n") for line in f if line.rstrip("\n")])


class CharTokenizer(Tokenizer):
    """Character-level tokenizer: one id per Unicode character, `\\n` ends a line.

    Args:
        vocabulary: list of single characters; must contain `"\\n"`. Unknown
            characters map to the last id, `<unk>`.
    """

    kind = "char"
    file_names = ("chars.json",)

    def __init__(self, vocabulary):
        super().__init__()
        vocabulary = [c for c in vocabulary if c != UNK]
        if "\n" not in vocabulary:
            raise ValueError("`vocabulary` must contain the newline character")
        self.vocabulary = list(vocabulary) + [UNK]
        self.eos_id = self.vocabulary.index("\n")
        self.unk_id = len(self.vocabulary) - 1
        self._table = _lookup_table(self.vocabulary, self.unk_id)
        self._chars = tf.constant(self.vocabulary[:-1] + ["\ufffd"])

    @classmethod
    def train(cls, lines, max_size=None):
        counts = collections.Counter("\n")
        for line in lines:
            counts.update(line)
        ordered = sorted(counts, key=lambda c: -counts[c])
        return cls(ordered[: max_size - 1] if max_size else ordered)

    @property
    def vocabulary_size(self):
        return len(self.vocabulary)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def tokenize(self, lines):
        chars = tf.strings.unicode_split(tf.strings.join([lines, "\n"]), "UTF-8")
        return tf.ragged.map_flat_values(self._table.lookup, chars)

    def tokenize_prompt(self, prompts):
        """Like `tokenize`, without the end-of-line token."""
        return tf.ragged.map_flat_values(self._table.lookup, tf.strings.unicode_split(prompts, "UTF-8"))

    def detokenize(self, ids):
        ids = _as_ragged(ids)
        chars = tf.ragged.map_flat_values(lambda i: tf.gather(self._chars, i), ids)
        return tf.strings.reduce_join(chars, axis=-1)

    def files(self):
        return {"chars.json": json.dumps(self.vocabulary[:-1], ensure_ascii=False).encode("utf-8")}

    @classmethod
    def load(cls, directory):
        with open(os.path.join(directory, "chars.json"), encoding="utf-8") as f:
            return cls(json.load(f))


class BPETokenizer(Tokenizer):
    """GPT-2 byte-level BPE from `vocab.json` + `merges.txt` (keras-hub ops in the graph).

    Args:
        vocabulary: path of `vocab.json` (or the dict).
        merges: path of `merges.txt` (or the list of merge strings).
    """

    kind = "bpe"
    file_names = ("vocab.json", "merges.txt")

    def __init__(self, vocabulary, merges):
        super().__init__()
        import keras_hub

        if isinstance(vocabulary, str):
            with open(vocabulary, encoding="utf-8") as f:
                vocabulary = json.load(f)
        if isinstance(merges, str):
            with open(merges, encoding="utf-8") as f:
                merges = [m for m in f.read().split("\n") if m and not m.startswith("#version")]
        vocabulary, merges = dict(vocabulary), list(merges)
        specials = [t for t in (ENDOFTEXT,) if t in vocabulary]
        # Eager calls run keras-hub's Rust path (fast corpus tokenization),
        # traced calls its TensorFlow ops: the same vocabulary and merges.
        self._bpe = keras_hub.tokenizers.BytePairTokenizer(
            vocabulary, merges, unsplittable_tokens=specials or None, dtype="int32"
        )
        self._vocabulary_json = json.dumps(vocabulary, ensure_ascii=False)
        self._merges_text = "\n".join(merges)
        self.eos_id = int(self._bpe.token_to_id("\u010a"))  # byte-level "\n"
        self.endoftext_id = vocabulary.get(ENDOFTEXT)
        self._size = len(vocabulary)

    @classmethod
    def train(cls, lines, vocabulary_size=8192, min_frequency=2):
        """Trains byte-level BPE on `lines` with Hugging Face `tokenizers`."""
        from tokenizers import ByteLevelBPETokenizer

        trainer = ByteLevelBPETokenizer(add_prefix_space=False)
        trainer.train_from_iterator(
            (line + "\n" for line in lines),
            vocab_size=vocabulary_size,
            min_frequency=min_frequency,
            special_tokens=[ENDOFTEXT],
            show_progress=False,
        )
        model = json.loads(trainer.to_str())["model"]
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
        return cls(model["vocab"], merges)

    @property
    def vocabulary_size(self):
        return self._size

    def tokenize(self, lines):
        lines = tf.strings.join([tf.convert_to_tensor(lines, tf.string), "\n"])
        return _ragged(self._bpe.tokenize(lines))

    def tokenize_prompt(self, prompts):
        """Like `tokenize`, without the end-of-line token."""
        return _ragged(self._bpe.tokenize(prompts))

    def detokenize(self, ids):
        text = self._bpe.detokenize(_as_ragged(ids))
        return tf.convert_to_tensor(text, tf.string)

    def files(self):
        return {
            "vocab.json": self._vocabulary_json.encode("utf-8"),
            "merges.txt": ("#version: 0.2\n" + self._merges_text + "\n").encode("utf-8"),
        }

    @classmethod
    def load(cls, directory):
        return cls(os.path.join(directory, "vocab.json"), os.path.join(directory, "merges.txt"))


def _ragged(ids):
    """keras-hub's eager (Rust) path returns lists of ids; the graph path a RaggedTensor."""
    if isinstance(ids, (list, tuple)):
        lengths = [len(row) for row in ids]
        flat = np.fromiter((i for row in ids for i in row), np.int32, sum(lengths))
        ids = tf.RaggedTensor.from_row_lengths(flat, tf.constant(lengths, tf.int64))
    return ids


class CheckpointTokenizer(Tokenizer):
    """The tokenizer of a Hugging Face checkpoint directory, as transformers runs it (in Python).

    Each line is its ids (no BOS/EOS) followed by the id of a newline, the
    end-of-line token, so a split is the text of its lines as the model reads
    a document.

    Args:
        directory: a folder with `tokenizer.json` or `tokenizer.model` (and
            optionally `tokenizer_config.json`, `special_tokens_map.json`).
    """

    kind = "huggingface"
    folder = "huggingface"
    carried = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")
    file_names = (folder + "/tokenizer_config.json",)

    def __init__(self, directory):
        super().__init__()
        from keras_tfam.convert import HuggingFaceTokenizer

        self._tokenizer = HuggingFaceTokenizer(directory)
        self._files = {}
        for name in self.carried:
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    self._files[f"{self.folder}/{name}"] = f.read()
        newline = self._tokenizer.encode("\n", add_special_tokens=False)
        if not newline:
            raise ValueError(f"The tokenizer of {directory!r} gives no id for a newline")
        self.eos_id = int(newline[-1])
        self.bos_id = self._tokenizer.bos_token_id
        from pipelines.data.graph_tokenizer import GraphTokenizer, UnsupportedTokenizer

        try:
            self._graph = GraphTokenizer(self._tokenizer.to_json())
            self.not_in_graph = None
        except UnsupportedTokenizer as error:
            self._graph, self.not_in_graph = None, str(error)
        self.in_graph = self._graph is not None

    @property
    def vocabulary_size(self):
        return self._tokenizer.vocabulary_size

    @property
    def library_tokenizer(self):
        """The `keras_tfam.convert.HuggingFaceTokenizer` it runs."""
        return self._tokenizer

    def _encode(self, lines, end):
        lines = [line.decode("utf-8") for line in np.asarray(tf.convert_to_tensor(lines, tf.string)).reshape(-1)]
        rows = [self._tokenizer.encode(line, add_special_tokens=False) + end for line in lines]
        lengths = [len(row) for row in rows]
        flat = np.fromiter((i for row in rows for i in row), np.int32, sum(lengths))
        return tf.RaggedTensor.from_row_lengths(flat, tf.constant(lengths, tf.int64))

    def tokenize(self, lines):
        return self._encode(lines, [self.eos_id])

    def tokenize_prompt(self, prompts):
        if self.in_graph and not tf.executing_eagerly():
            return self._graph.encode(prompts)
        return self._encode(prompts, [])

    def detokenize(self, ids):
        if self.in_graph and not tf.executing_eagerly():
            return self._graph.decode(ids)
        rows = _as_ragged(ids).to_list()
        return tf.constant([self._tokenizer.decode(row) for row in rows], tf.string)

    @property
    def huggingface_tokenizer(self):
        """The checkpoint's `keras_tfam.convert.HuggingFaceTokenizer` (what a Hugging Face export writes)."""
        return self._tokenizer

    def files(self):
        return dict(self._files)

    @classmethod
    def load(cls, directory):
        return cls(os.path.join(directory, cls.folder))


TOKENIZERS = {"word": WordTokenizer, "bpe": BPETokenizer, "char": CharTokenizer, "huggingface": CheckpointTokenizer}


def _load_checked(cls, directory):
    """`cls.load(directory)`; a file that is missing or does not parse raises a `CorruptFileError` naming it."""
    files = " + ".join(os.path.join(directory, name) for name in cls.file_names)
    try:
        return cls.load(directory)
    except FileNotFoundError as error:
        raise CorruptFileError(error.filename or files, "is missing") from None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise CorruptFileError(
            files, f"cannot be read as a {cls.kind} tokenizer ({type(error).__name__}: {error})"
        ) from None


def load_tokenizer(directory):
    """Loads a tokenizer saved with `save`, or a GPT-2 `vocab.json` + `merges.txt` directory.

    Raises:
        CorruptFileError: a file is truncated or altered (its digest differs
            from the one `tokenizer.json` records), or does not parse.
    """
    meta = os.path.join(directory, "tokenizer.json")
    if os.path.isfile(meta):
        manifest = read_json(meta)
        kind = manifest.get("kind") if isinstance(manifest, dict) else None
        if kind not in TOKENIZERS:
            raise CorruptFileError(meta, f"names no known tokenizer kind (kind={kind!r}; known: {tuple(TOKENIZERS)})")
        # Older runs recorded the kind only; newer ones every file's digest.
        for name, expected in manifest.get("files", {}).items():
            problem = digest_problem(os.path.join(directory, name), expected)
            if problem is not None:
                raise CorruptFileError(os.path.join(directory, name), f"{problem} (according to tokenizer.json)")
        tokenizer = _load_checked(TOKENIZERS[kind], directory)
        expected_size = manifest.get("vocabulary_size")
        if expected_size is not None and tokenizer.vocabulary_size != expected_size:
            raise CorruptFileError(
                directory, f"holds {tokenizer.vocabulary_size} tokens where tokenizer.json records {expected_size}"
            )
        return tokenizer
    if os.path.isfile(os.path.join(directory, "vocab.json")) and os.path.isfile(os.path.join(directory, "merges.txt")):
        return _load_checked(BPETokenizer, directory)
    raise FileNotFoundError(
        f"No tokenizer in {directory!r}: expected tokenizer.json (saved by keras_tfam) or GPT-2's "
        "vocab.json + merges.txt"
    )


def train_tokenizer(kind, lines, vocabulary_size=None, checkpoint=None):
    """Trains the tokenizer `kind` (`"word"`, `"bpe"`, `"char"`) on `lines`; `"huggingface"` reads the
    one of the `checkpoint` directory instead."""
    if kind not in TOKENIZERS:
        raise ValueError(f"`tokenizer` must be one of {tuple(TOKENIZERS)}. Received: tokenizer={kind!r}")
    if kind == "huggingface":
        return CheckpointTokenizer(checkpoint)
    if kind == "bpe":
        return BPETokenizer.train(lines, vocabulary_size or 8192)
    return TOKENIZERS[kind].train(lines, max_size=vocabulary_size)
