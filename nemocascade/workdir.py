"""A workdir holds one run: an exclusive lock while a process uses it, and the config it was started with.

Lock. `workdir/.lock` is `flock`ed (exclusive, non-blocking) for the whole run and holds the owner's pid, host
and start time. The kernel drops the lock when the process dies however it dies, so a killed run never leaves
a stale lock; a second run on the same workdir stops at once with `errors.WorkdirBusy` naming the holder.
(flock is per host: on a network filesystem shared by several hosts only process 0 of a run takes it. A workdir on
an object store, `gs://...`, cannot be locked: a warning says so.)

Config. The first start writes the full resolved config to `config.json` (`save_config`). A later start on the
same workdir is a resume: its config must equal the recorded one, key by key, or it is refused
(`errors.BadInput`) with every changed key listed as `old -> new`. Exceptions:
  * stages added at the end of `stage_order` (or dropped from its end), with their `stages.<name>.*` keys:
    extending a finished run with new arms is the same run, grown;
  * keys matching a pattern in `allow` (fnmatch, e.g. `eval.n` or `eval.*`): the change is accepted and
    returned, so the driver records it in the run log and then saves the new config as the reference.
"""
from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import socket
import sys
import time

from nemocascade import files, hosts
from nemocascade.configs import flatten, parse_stage_order
from nemocascade.errors import BadInput, WorkdirBusy
from nemocascade.files import atomic_write

LOCK_FILE = ".lock"
CONFIG_FILE = "config.json"


class WorkdirLock:
    """Context manager holding `workdir/.lock` exclusively (see the module docstring)."""

    def __init__(self, workdir: str):
        self.path = os.path.join(workdir, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        if not files.is_local(self.path):  # an object store has no locks
            print(f"warning: {self.path} is not on a local filesystem, so the workdir cannot be locked; nothing "
                  "stops a second run on this workdir", file=sys.stderr)
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if not isinstance(err, BlockingIOError):  # a filesystem without flock (some network mounts)
                os.close(fd)
                print(f"warning: cannot lock {self.path} ({err}); nothing stops a second run on this workdir",
                      file=sys.stderr)
                return
            holder = os.read(fd, 4096).decode("utf-8", "replace")
            os.close(fd)
            try:
                h = json.loads(holder)
                who = f"pid {h['pid']} on host {h['host']} (since {h['started']})"
            except (ValueError, KeyError, TypeError):
                who = "another process (no owner recorded yet)"
            raise WorkdirBusy(f"workdir {os.path.dirname(self.path)} is in use by {who}; one run per workdir: "
                              "wait for it, stop it, or pass another --workdir") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _plain(obj):
    """JSON round trip (tuples -> lists, numpy scalars -> numbers) so a recorded and a live config compare."""
    return json.loads(json.dumps(obj, sort_keys=True, default=lambda o: o.tolist() if hasattr(o, "tolist")
                                 else str(o)))


def config_changes(old: dict, new: dict) -> tuple[list[tuple[str, object, object]], tuple | None]:
    """(changed keys as (key, old, new) with `<absent>` for a missing side, growth). Growth is
    ("stage_order", old order, new order) when the order only grew or shrank at its end, else None; the keys of
    the stages in only one of the two orders are then not changes. A key one side lacks is a change: a workdir
    recorded by an older version, before a key existed, starts fresh."""
    old, new = _plain(old), _plain(new)
    orders = [parse_stage_order(c.pop("stage_order", [])) for c in (old, new)]
    short, long_ = sorted(orders, key=len)
    grown = long_[len(short):] if long_[:len(short)] == short else []
    exempt = tuple(f"stages.{s}." for s in grown)
    fo, fn = flatten(old), flatten(new)
    if not grown:
        fo["stage_order"], fn["stage_order"] = orders
    missing = "<absent>"
    changes = [(k, fo.get(k, missing), fn.get(k, missing)) for k in sorted(set(fo) | set(fn))
               if fo.get(k, missing) != fn.get(k, missing) and not k.startswith(exempt)]
    return changes, (("stage_order", *orders) if grown else None)


def save_config(workdir: str, config: dict) -> None:
    """Record `config` as the one this workdir runs (after `check_config` and every other resume check passed,
    so a refused start changes nothing). Process 0 writes it."""
    if hosts.is_lead():
        atomic_write(os.path.join(workdir, CONFIG_FILE), json.dumps(_plain(config), indent=2, sort_keys=True) + "\n")


def check_config(workdir: str, config: dict, allow=()) -> list[tuple[str, object, object]]:
    """On a resume, refuse any change of the recorded config that is not allowed (module docstring); writes
    nothing. Returns the accepted changes (allowed keys, a grown stage list) to record in the run log."""
    path = os.path.join(workdir, CONFIG_FILE)
    if not files.exists(path):
        return []
    try:
        recorded = files.read_json(path)
    except (OSError, ValueError) as err:
        raise BadInput(f"{path} is unreadable ({err}); it records the config this workdir was started with. "
                       "Restore it, or use a new --workdir") from None
    changes, growth = config_changes(recorded, config)
    refused = [c for c in changes if not any(fnmatch.fnmatchcase(c[0], p) for p in allow)]
    if refused:
        lines = "\n".join(f"  {k}: {o!r} -> {n!r}" for k, o, n in refused)
        raise BadInput(f"{path}: this workdir was started with another config; a resume must be the same run. "
                       f"Changed key(s):\n{lines}\nUse a new --workdir, restore the values, or allow named keys "
                       f"with --allow_config_change=KEY[,KEY...] (e.g. eval.*)")
    return changes + ([growth] if growth else [])
