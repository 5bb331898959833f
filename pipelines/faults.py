"""Named kill points, so that tests can kill a run at an exact moment instead of by timing.

`TFAM_FAULT=<point>[:<count>]` SIGKILLs the process the `count`-th time
(default: the first) it reaches `fault_point(<point>)`. Without the variable
a fault point does nothing. The points:

    train-begin      the model is built, compiled and restored; no step taken
    step             after each training step (`step:3`: inside the second
                     epoch of a run with 2 steps per epoch)
    tokenizer-write  the tokenizer is staged, not yet renamed into place
    cache-write      a tokenized split is written, not yet renamed into place
    backup-write     a backup's weights are written, not yet renamed into place
    best-write       a better checkpoint and its best.json are written, the
                     checkpoint not yet renamed into place
    final-write      the same for final.keras
    export-write     the SavedModel is staged, not yet renamed to its version
"""

import collections
import os
import signal
import sys

_reached = collections.Counter()


def fault_point(name):
    """Kills this process with SIGKILL if `TFAM_FAULT` names `name` (and this is the count-th time)."""
    spec = os.environ.get("TFAM_FAULT")
    if not spec:
        return
    point, _, count = spec.partition(":")
    if point != name:
        return
    _reached[name] += 1
    if _reached[name] == int(count or 1):
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
