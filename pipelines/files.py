"""Crash-safe files: atomic writes, content digests, reads that name the file when it is damaged.

Every file a run writes goes through `atomic_path`: it is written under a
temporary name in the same folder (`.tmp-<random>-<name>`, so suffixes that
savers insist on, like `.keras`, are kept), flushed to disk, and renamed over
the target; the folder is flushed too, so the rename survives a power cut.
A process killed at any moment leaves either the old file or the new one,
plus at most a temporary that `remove_temporaries` deletes later.

Files that cannot be checked by parsing them (checkpoints) are described by
a JSON sidecar holding their size and SHA-256 (`write_with_sidecar`), written
before the rename so that a kill between the two leaves a sidecar that still
describes the file in place (`previous`).
"""

import contextlib
import hashlib
import json
import os
import secrets
import shutil

from pipelines.errors import CorruptFileError
from pipelines.faults import fault_point

TEMP_PREFIX = ".tmp-"


def fsync_directory(path):
    """Flushes a folder's entries (renames, new files) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path):
    """Flushes a file, or every file and folder under `path`, to disk."""
    if os.path.isdir(path):
        for root, _, names in os.walk(path):
            for name in names:
                fsync_tree(os.path.join(root, name))
            fsync_directory(root)
        return
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def temporary_path(path):
    """A fresh temporary name beside `path` that keeps its suffix."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f"{TEMP_PREFIX}{secrets.token_hex(4)}-{name}")


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


@contextlib.contextmanager
def atomic_path(path, fault=None):
    """Yields a temporary path to write `path` to (a file or a folder); renames it into place.

    On a normal exit the temporary is flushed to disk and renamed over `path`
    (a folder must not exist yet: `os.replace` cannot replace a non-empty
    one); on an exception it is removed. `fault` names the kill point
    (`pipelines.faults`) between the flush and the rename.
    """
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    temp = temporary_path(path)
    try:
        yield temp
        fsync_tree(temp)
        if fault:
            fault_point(fault)
        os.replace(temp, path)
    except BaseException:
        _remove(temp)
        raise
    fsync_directory(directory)


def atomic_write_bytes(path, data, fault=None):
    with atomic_path(path, fault) as temp:
        with open(temp, "wb") as f:
            f.write(data)


def atomic_write_text(path, text, fault=None):
    atomic_write_bytes(path, text.encode("utf-8"), fault)


def atomic_write_json(path, value, fault=None):
    atomic_write_text(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n", fault)


def read_json(path):
    """The JSON value in `path`; a `CorruptFileError` naming the file if it is empty or not JSON."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.strip():
        raise CorruptFileError(path, f"is empty ({len(data)} bytes)")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptFileError(path, f"is not valid JSON ({error}; {len(data)} bytes)") from None


def bytes_digest(data):
    """`{"size": bytes, "sha256": hex}` of `data`."""
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def file_digest(path):
    """`{"size": bytes, "sha256": hex}` of a file."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
            size += len(block)
    return {"size": size, "sha256": sha.hexdigest()}


def digest_problem(path, expected):
    """None if `path` has the size and SHA-256 in `expected`, else what is wrong with it."""
    if not os.path.isfile(path):
        return "is missing"
    actual = file_digest(path)
    if actual["size"] < expected["size"]:
        return f"is truncated ({actual['size']:,} of {expected['size']:,} bytes)"
    if actual["size"] != expected["size"]:
        return f"has {actual['size']:,} bytes where {expected['size']:,} were written"
    if actual["sha256"] != expected["sha256"]:
        return "does not have the content that was written (SHA-256 differs)"
    return None


def sidecar_path(path):
    """`checkpoints/best.keras` -> `checkpoints/best.json`."""
    return os.path.splitext(path)[0] + ".json"


def write_with_sidecar(path, write, record, fault=None):
    """Writes `path` with `write(temp_path)`, atomically, and its sidecar with `record` + digest.

    The sidecar is written after the new file is complete and before it is
    renamed into place; it keeps the record of the file it replaces as
    `previous`, so a kill between the two writes leaves a consistent pair.
    """
    previous = None
    if os.path.isfile(path):
        try:
            previous = verify_with_sidecar(path)
        except CorruptFileError:
            pass  # a damaged file: nothing worth describing
        else:
            if previous is None or "sha256" not in previous:
                previous = {**(previous or {}), **file_digest(path)}
            previous.pop("previous", None)
    with atomic_path(path, fault) as temp:
        write(temp)
        entry = {**record, **file_digest(temp)}
        atomic_write_json(sidecar_path(path), {**entry, "previous": previous})
    return entry


def verify_with_sidecar(path):
    """The sidecar record describing the file at `path`, or None if it has no sidecar.

    A record without `sha256` (written by an older version) is returned
    unchecked: the caller checks the file some other way.

    Raises:
        CorruptFileError: the file is missing, truncated or altered, or its
            sidecar is damaged (then `error.path` is the sidecar's).
    """
    sidecar = sidecar_path(path)
    if not os.path.isfile(sidecar):
        return None
    record = read_json(sidecar)
    if not isinstance(record, dict):
        raise CorruptFileError(sidecar, f"does not describe a file (it holds a {type(record).__name__})")
    if "sha256" not in record:
        return record
    problem = digest_problem(path, record)
    if problem is None:
        return record
    previous = record.get("previous")
    # Killed between writing the sidecar and renaming the new file: the file
    # in place is the one the sidecar replaced.
    if previous and digest_problem(path, previous) is None:
        return previous
    raise CorruptFileError(path, f"{problem} (according to {os.path.basename(sidecar)})")


def set_aside(path):
    """Renames a damaged file to `<path>.corrupt` (replacing an older one); returns the new name."""
    target = path + ".corrupt"
    _remove(target)
    os.replace(path, target)
    return target


def remove_temporaries(directory):
    """Deletes the temporaries that killed writers left in `directory` (not in its subfolders).

    Only call it while holding the folder's lock: a live writer's temporary
    looks the same. Also removes the temporaries of earlier versions.
    """
    if not os.path.isdir(directory):
        return []
    removed = []
    for name in os.listdir(directory):
        legacy = name.startswith("incomplete-epoch-") or name.endswith(".json.tmp")
        if name.startswith(TEMP_PREFIX) or legacy:
            _remove(os.path.join(directory, name))
            removed.append(name)
    return removed
