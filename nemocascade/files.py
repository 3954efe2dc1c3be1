"""Atomic file writes: readers (and a run resumed after a crash) see the old file or the new one,
never half of one."""
from __future__ import annotations

import os
import tempfile


def atomic_write(path: str, data: str | bytes) -> None:
    """Write to a temp file in the same directory (os.replace is atomic only within one filesystem),
    fsync, then os.replace. Creates parent directories."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; run artefacts are shared like any other file
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
