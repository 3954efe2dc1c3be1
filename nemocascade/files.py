"""Every file a run reads or writes goes through one path type, `etils.epath.Path` (what orbax and TFDS use), so
a workdir, its checkpoints and its data can live on `gs://` (or any epath backend) as well as on a local disk.

Paths stay strings in the code (`os.path.join` joins `gs://bucket/run` and `summary.json` correctly); the
functions here do the I/O. Two differences between local and remote storage matter and are handled here:

- Atomic replacement. Locally `atomic_write` writes a temp file beside the target, fsyncs and `os.replace`s it.
  An object store replaces an object whole on upload, so there it is one write.
- Formats a C++ library reads only from local files (TFDS's array_record data) are kept in a local mirror of
  the remote directory (`local_mirror`) and copied with `sync_tree`.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile

from etils import epath


def is_local(p) -> bool:
    """True unless `p` is a URI (`gs://...`, `s3://...`)."""
    return "://" not in os.fspath(p)


def path(p) -> epath.Path:
    """The epath of `p`; a local path made absolute (the working directory may change)."""
    return epath.Path(os.path.abspath(p) if is_local(p) else os.fspath(p))


def exists(p) -> bool:
    return path(p).exists()


def isdir(p) -> bool:
    return path(p).is_dir()


def listdir(p) -> list[str]:
    """Names in directory `p`, sorted; [] when it does not exist."""
    d = path(p)
    return sorted(c.name for c in d.iterdir()) if d.is_dir() else []


def makedirs(p) -> None:
    path(p).mkdir(parents=True, exist_ok=True)


def read_text(p) -> str:
    return path(p).read_text()


def read_bytes(p) -> bytes:
    return path(p).read_bytes()


def read_json(p):
    return json.loads(read_text(p))


def remove(p) -> None:
    """Delete file `p` if it exists."""
    path(p).unlink(missing_ok=True)


def rmtree(p) -> None:
    """Delete directory `p` and everything under it, if it exists."""
    d = path(p)
    if d.exists():
        d.rmtree()


def rename(src, dst) -> None:
    """Move `src` to `dst` (atomic on one local filesystem; a copy then a delete on an object store)."""
    path(src).rename(path(dst))


def atomic_write(p, data: str | bytes) -> None:
    """Readers (and a run resumed after a crash) see the old file or the new one, never half of one. Locally: a
    temp file in the same directory (os.replace is atomic only within one filesystem), fsync, os.replace. On an
    object store an upload replaces the object whole. Creates parent directories."""
    if not is_local(p):
        target = path(p)
        target.parent.mkdir(parents=True, exist_ok=True)
        (target.write_bytes if isinstance(data, bytes) else target.write_text)(data)
        return
    parent = os.path.dirname(os.path.abspath(p))
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(p)}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; run artefacts are shared like any other file
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def sync_tree(src, dst, last: str | None = None) -> int:
    """Copy every file under directory `src` to the same relative path under `dst` unless `dst` already has it
    at the same size; returns how many were copied. A missing `src` copies nothing. Files only grow or appear
    in the trees this mirrors (built datasets, TensorBoard event files), so size is the test of staleness. Files
    named `last` are copied after all others (a marker that says the rest is complete)."""
    src, dst, copied = path(src), path(dst), 0
    if not src.is_dir():
        return 0
    for rel in sorted(_files_under(src), key=lambda rel: (os.path.basename(rel) == last, rel)):
        f, out = src / rel, dst / rel
        if out.exists() and out.stat().length == f.stat().length:
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(f.read_bytes())
        copied += 1
    return copied


def _files_under(d: epath.Path, prefix: str = "") -> list[str]:
    """Paths of the files under `d`, relative to it (iterdir, not walk: fsspec's walk drops the URI scheme)."""
    out = []
    for child in d.iterdir():
        rel = f"{prefix}{child.name}"
        out += _files_under(child, rel + "/") if child.is_dir() else [rel]
    return out


def local_mirror(remote) -> str:
    """A local directory that stands for remote directory `remote` on this host (under $NEMOCASCADE_CACHE, default
    ~/.cache/nemocascade), named after it so two remote directories never share one."""
    root = os.environ.get("NEMOCASCADE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "nemocascade")
    key = os.fspath(remote)
    name = key.split("://", 1)[-1].strip("/").replace("/", "_")[-80:]
    return os.path.join(root, "mirror", f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:10]}")
