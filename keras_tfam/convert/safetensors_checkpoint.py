"""The tensors of a Hugging Face checkpoint directory: one `model.safetensors` or shards with an index.

The safetensors format is an 8-byte little-endian header length, a JSON header
`{name: {"dtype", "shape", "data_offsets"}}` and the raw little-endian bytes
(https://github.com/huggingface/safetensors). It is read here through a memory
map, one tensor at a time, so a loader holds at most one tensor beside the
model it fills (peak memory near one copy of the model), and bfloat16
tensors, which NumPy lacks, arrive as `ml_dtypes.bfloat16` (a dependency of
both TensorFlow and JAX).
"""

import json
import os
import struct

import ml_dtypes
import numpy as np

from keras_tfam.convert.undrawn_variables import fill

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


class SafetensorsCheckpoint:
    """Lazy access to the tensors of a checkpoint directory, one file or shards.

    The directory holds `model.safetensors`, or the shards named by
    `model.safetensors.index.json`.

    Every error names the file, and the tensor where one is at fault.

    Args:
        directory: the checkpoint directory.

    Examples:
        >>> checkpoint = SafetensorsCheckpoint("tests/fixtures/hf-llama-tiny")  # 4 shards and an index
        >>> checkpoint.tensor("model.embed_tokens.weight").shape
        (320, 32)
    """

    def __init__(self, directory):
        self.directory = directory
        index_path = os.path.join(directory, INDEX)
        single_path = os.path.join(directory, SINGLE)
        if os.path.isfile(index_path):
            self._shard_of = _read_index(index_path)
        elif os.path.isfile(single_path):
            self._shard_of = None
        else:
            found = sorted(os.listdir(directory)) if os.path.isdir(directory) else "no such directory"
            raise FileNotFoundError(
                f"No {SINGLE} (nor {INDEX}) in {directory!r} (found: {found}). Convert PyTorch .bin "
                "checkpoints to safetensors first."
            )
        self._headers = {}
        if self._shard_of is None:
            self._entries = dict.fromkeys(self._header(SINGLE)[0], SINGLE)
        else:
            missing = sorted({shard for shard in self._shard_of.values() if not os.path.isfile(self._path(shard))})
            if missing:
                raise FileNotFoundError(f"Shard(s) {missing} named by {index_path} are missing from {directory!r}")
            self._entries = dict(self._shard_of)

    def _path(self, file):
        return os.path.join(self.directory, file)

    def _header(self, file):
        if file not in self._headers:
            self._headers[file] = _read_header(self._path(file))
        return self._headers[file]

    def names(self):
        """Every tensor name, in file order (shard by shard)."""
        return sorted(self._entries, key=lambda name: (self._entries[name], name))

    def file_of(self, name):
        """The file holding tensor `name`."""
        return self._path(self._entries[name])

    def tensor(self, name):
        """Tensor `name` as a read-only NumPy array backed by the file (copy it to keep it)."""
        if name not in self._entries:
            raise KeyError(f"No tensor {name!r} in the checkpoint of {self.directory!r}")
        file = self._entries[name]
        header, data_start = self._header(file)
        if name not in header:
            raise ValueError(f"Tensor {name!r} is listed by {INDEX} in {file}, which does not hold it")
        entry = header[name]
        begin, end = entry["data_offsets"]
        dtype = np.dtype(_DTYPES[entry["dtype"]])
        memory = np.memmap(self._path(file), dtype=np.uint8, mode="r", offset=data_start + begin, shape=(end - begin,))
        return memory.view(dtype).reshape(entry["shape"])


def assign_tensors(mapping, tensors, rename=lambda name: name, ignore=lambda name: False, source=None):
    """Assigns checkpoint tensors to a model's variables through `mapping`, one tensor at a time.

    Args:
        mapping: `{name: [(variable, transform or None), ...]}`, the names
            after `rename`; a transform cuts the variable's part of a tensor.
        tensors: a `SafetensorsCheckpoint` (read one tensor at a time), or
            a `{name: array}` dict (another library's weights in memory).
        rename: maps a checkpoint name to the mapping's.
        ignore: the (renamed) names to skip (buffers, a tied head).
        source: what the tensors come from, in error messages (a dict's).

    Every error names the tensor, and the file where it comes from one; a
    float tensor holding a NaN or an infinity is refused.
    """
    if isinstance(tensors, SafetensorsCheckpoint):
        checkpoint, source = tensors, f"the checkpoint in {tensors.directory!r}"
        stored, read, where = checkpoint.names(), checkpoint.tensor, checkpoint.file_of
    else:
        stored, read, where = list(tensors), tensors.__getitem__, lambda name: source
    names = {rename(name): name for name in stored if not ignore(rename(name))}
    missing = sorted(set(mapping) - set(names))
    unexpected = sorted(set(names) - set(mapping))
    if missing or unexpected:
        raise ValueError(f"Tensors of {source} do not match the model. Missing: {missing}. Unexpected: {unexpected}.")
    for name in sorted(names, key=lambda name: where(names[name])):
        value = read(names[name])
        check_finite(value, f"Tensor {names[name]!r} in {where(names[name])}")
        for variable, transform in mapping[name]:
            part = value if transform is None else transform(value)
            if tuple(part.shape) != tuple(variable.shape):
                raise ValueError(
                    f"Shape mismatch for tensor {names[name]!r} in {where(names[name])}: the model "
                    f"expects {tuple(variable.shape)}, the checkpoint has {tuple(value.shape)}."
                )
            fill(variable, np.asarray(part, dtype=_numpy_dtype(variable)))
        del value


def check_finite(value, what):
    """A `ValueError` naming `what` when the float array `value` holds a NaN or an infinity."""
    value = np.asarray(value)
    if value.dtype.kind not in "fc" and value.dtype != ml_dtypes.bfloat16:
        return
    finite = np.isfinite(value.astype(np.float32) if value.dtype == ml_dtypes.bfloat16 else value)
    if not finite.all():
        first = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(
            f"{what} holds {int(finite.size - finite.sum())} NaN or infinite value(s) (the first at index {first}): "
            "the checkpoint is damaged; download or save it again"
        )


def _numpy_dtype(variable):
    dtype = str(getattr(variable.dtype, "name", variable.dtype)).replace("torch.", "")
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


def _read_index(path):
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
        weight_map = index["weight_map"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is not a safetensors index with a weight_map ({type(error).__name__}: {error})"
        ) from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{path}: `weight_map` must map tensor names to shard file names")
    return weight_map


def _read_header(path):
    """`({name: entry}, data_start)` of a safetensors file; a `ValueError` naming the file when it is not one."""
    size = os.path.getsize(path)

    def broken(reason):
        return ValueError(f"{path} cannot be read as safetensors ({reason}; {size:,} bytes): is the download complete?")

    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise broken("shorter than its 8-byte header length")
        (length,) = struct.unpack("<Q", prefix)
        if length > size - 8:
            raise broken(f"its header claims {length:,} bytes")
        try:
            header = json.loads(f.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise broken(f"its header is not JSON: {error}") from None
    if not isinstance(header, dict):
        raise broken("its header is not a JSON object")
    header.pop("__metadata__", None)
    data_start = 8 + length
    for name, entry in header.items():
        try:
            begin, end = entry["data_offsets"]
            dtype = np.dtype(_DTYPES[entry["dtype"]])
            count = int(np.prod(entry["shape"], dtype=np.int64))
        except (KeyError, TypeError, ValueError) as error:
            raise broken(f"tensor {name!r} has an unreadable entry ({type(error).__name__}: {error})") from None
        if end - begin != count * dtype.itemsize or data_start + end > size:
            raise broken(f"tensor {name!r} ends past the file or does not match its shape {entry['shape']}")
    return header, data_start
