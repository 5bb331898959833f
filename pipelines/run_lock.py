"""One process at a time in a run (or export) directory."""

import datetime
import fcntl
import json
import os
import socket
import sys

from pipelines.errors import RunInUse, notice


def _pid_running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, as another user
        return True
    return True


def describe_holder(holder):
    """`pid <pid> on <host> since <start time> (<command>)` from a lock's record."""
    if not holder:
        return "another process (it has not written its pid yet)"
    text = f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')}"
    command = str(holder.get("command") or "")
    if len(command) > 160:
        command = command[:157] + "..."
    return text + (f" ({command})" if command else "")


def lock_holder(directory, name=".lock"):
    """The record of the process holding `RunLock(directory, name)` now (`{}` if it has not written it yet),
    or None when the lock is free.

    Only a lock file left in place is probed, with a shared lock taken and
    dropped at once: a free directory is never locked.
    """
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_record(fd) or {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_record(fd):
    """The holder's record in a lock file (None if it is empty or damaged)."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, 1 << 16)
    try:
        return json.loads(data.decode("utf-8")) if data.strip() else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


class RunLock:
    """An exclusive, non-blocking lock on a directory, held for the life of a process.

    The lock is `flock` on `<directory>/<name>`: the kernel releases it when
    its process ends, however it ends, so a killed run never blocks the next
    one. The file records the holder (pid, host, start time, command), which
    is what a second process names when it refuses to start; a file still
    there when the lock is free was left by a process that was killed, and
    the next holder says that it takes it over. Released, the file is deleted.

    Args:
        directory: the folder to lock (created if missing).
        name: the lock file's name in it.
        remove_if_unused: on release, delete `directory` again if this lock
            created it and nothing else was written there.

    Example:

    ```python
    with RunLock("runs/a"):
        ...  # train; a second `RunLock("runs/a")` raises RunInUse meanwhile
    ```
    """

    def __init__(self, directory, name=".lock", remove_if_unused=True):
        self.directory = os.path.abspath(directory)
        self.name = name
        self.path = os.path.join(self.directory, name)
        self.remove_if_unused = remove_if_unused
        self._fd = None
        self._created = False

    def acquire(self):
        self._created = not os.path.isdir(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_record(fd)
                os.close(fd)
                raise RunInUse(
                    f"{self.directory} is in use by {describe_holder(holder)}. One process at a time: wait "
                    "for it to end (or stop it; rerunning the same command then resumes)."
                ) from None
            # The holder we waited for may have deleted the file on release and
            # a third process created a new one: lock the file that is there.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        previous = _read_record(fd)
        if previous is not None:
            same_host = previous.get("host") == socket.gethostname()
            gone = same_host and not _pid_running(int(previous.get("pid") or 0))
            state = "is no longer running" if gone else "no longer holds it"

            notice(f"{self.path} was left by {describe_holder(previous)}, which {state}: taking it over")
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(["tfam" if sys.argv[0].endswith(("tfam", "cli.py")) else sys.argv[0]] + sys.argv[1:]),
        }
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(record).encode("utf-8"))
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self):
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None
        self._cleanup_directory()

    def _cleanup_directory(self):
        if self._created and self.remove_if_unused:
            try:
                os.rmdir(self.directory)
            except OSError:
                pass  # not empty: something was written there

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()
