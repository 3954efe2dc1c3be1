"""SIGINT/SIGTERM as a request to stop at the next step boundary, not an exception in the middle of one.

A stage's step loop (`stages.common.Trainer.steps`) calls `check(where)` after each step has been logged and
checkpointed; the driver calls it between stages. The first signal only sets a flag, so the step in flight
finishes, its metrics row is written and its state saved; `check` then raises `errors.Interrupted`, which
`experiments/run.py` turns into one line and exit status 128 + signal. A second signal while the first is
pending raises KeyboardInterrupt at once (the impatient user's escape; the last periodic checkpoint stands).
"""
from __future__ import annotations

import signal
import threading

from nemocascade.errors import Interrupted

_pending: list[int] = []  # signals received and not yet honoured


def _handler(signum, frame):
    if _pending:  # asked twice: stop now
        raise KeyboardInterrupt(f"second {signal.Signals(signum).name}")
    _pending.append(signum)


def install() -> None:
    """Route SIGINT and SIGTERM to the flag (main thread only; a no-op elsewhere, e.g. under a notebook's
    worker thread, where the default behaviour stays)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _pending.clear()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _handler)


def requested() -> int | None:
    """The pending signal number, if any."""
    return _pending[0] if _pending else None


def check(where: str = "") -> None:
    """Raise `Interrupted` if a stop was requested (and clear the request)."""
    if _pending:
        signum = _pending.pop(0)
        _pending.clear()
        raise Interrupted(signum, where)
