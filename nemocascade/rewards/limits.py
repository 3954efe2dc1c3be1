"""Bounds on one verifier call: how much text it reads and how long it runs.

Verifiers read model output, and a policy finds whatever makes them slow: deep nesting, huge numbers,
inputs on which a regex backtracks or sympy expands. Two bounds, meant to be used together:

* Size. Every verifier scores 0 a completion longer than :data:`MAX_COMPLETION_CHARS` before any regex or
  parser sees it, caps the span it really parses (math: the boxed answer), and does linear work on the
  rest. So no single C-level call (a regex, a big-int conversion, ``json.loads``) runs long, which the
  clock below needs: Python handles a signal or an asynchronous exception only between bytecodes.
* Time. :func:`call_with_timeout` interrupts a call after a wall-clock limit, in this process:

  - main thread: ``ITIMER_REAL`` + ``SIGALRM`` raise :class:`VerifierTimeout` into the call, blocking
    sleeps and waits included; the previous handler and timer are restored afterwards (an outer timer
    keeps its deadline, so limits nest);
  - any other thread (signals are main-thread only): a watchdog thread raises it asynchronously
    (``PyThreadState_SetAsyncExc``) into pure-Python code; a blocking call (sleep, lock, pipe read) is
    interrupted only once it returns.

  Neither is a sandbox: a call that catches ``BaseException`` can swallow the interruption (it still
  counts as timed out). Only a process boundary bounds anything (:class:`~nemocascade.rewards.pool.VerifierPool`
  with workers kills them).
"""

from __future__ import annotations

import ctypes
import functools
import signal
import threading
import time

# 4x the longest rollouts C2 samples (64K tokens at ~4 characters a token): no real completion comes near,
# and every verifier's work on this much text stays well under a second.
MAX_COMPLETION_CHARS = 1_000_000


def bounded_completion(score):
    """A reward ``score(completion, answer, ...)`` that returns 0.0 for a completion that is not a str or is
    longer than :data:`MAX_COMPLETION_CHARS`, before any of its own work: the size gate every verifier shares.
    (``functools.wraps`` keeps the name, so the pool's workers still unpickle the module's ``score``.)"""
    @functools.wraps(score)
    def gated(completion, answer, *args, **kwargs):
        if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
            return 0.0
        return score(completion, answer, *args, **kwargs)
    return gated


_REFIRE_S = 0.05  # how soon an expired limit interrupts again if its first interruption was swallowed


class VerifierTimeout(BaseException):
    """Raised into a call that outlived its limit. Not an ``Exception``: a verifier's own
    ``except Exception`` (bad input -> 0.0) must not swallow it."""


def call_with_timeout(timeout_s: float, fn, *args):
    """``(fn(*args), False)``, or ``(None, True)`` when ``fn`` ran past ``timeout_s`` seconds (module
    docstring says what interrupts it where). ``fn``'s own exceptions propagate; a call that swallowed
    the interruption and returned late gives ``(its value, True)``."""
    limit = _SignalLimit(timeout_s) if threading.current_thread() is threading.main_thread() else \
        _WatchdogLimit(timeout_s)
    result = None
    try:
        limit.arm()
        try:
            result = fn(*args)
        finally:
            limit.disarm()
    except VerifierTimeout:
        limit.disarm()  # again: the interruption may have landed inside the first disarm
        if not limit.expired:
            raise  # an enclosing limit's: it belongs to that call
        return None, True
    return result, limit.expired


class _SignalLimit:
    """ITIMER_REAL in the main thread, nesting inside an outer timer (ours or anyone's)."""

    def __init__(self, timeout_s: float):
        self.timeout_s, self.expired, self._armed, self._delegated = timeout_s, False, False, False

    def arm(self) -> None:
        now = time.monotonic()
        self._deadline = now + self.timeout_s
        outer_delay, self._outer_interval = signal.getitimer(signal.ITIMER_REAL)
        self._outer_deadline = now + outer_delay if outer_delay else None
        self._old_handler = signal.signal(signal.SIGALRM, self._on_alarm)
        self._armed = True
        delay = min(self.timeout_s, outer_delay) if outer_delay else self.timeout_s
        signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-6))

    def _on_alarm(self, signum, frame) -> None:
        now = time.monotonic()
        if now < self._deadline:  # the outer timer's deadline came first: its handler decides
            self._delegated = True  # so that disarm does not fire the outer timer a second time
            if callable(self._old_handler):
                self._old_handler(signum, frame)
            signal.setitimer(signal.ITIMER_REAL, max(self._deadline - now, 1e-6))
            return
        self.expired = True
        # Fire again soon: a handler that runs inside a finalizer (gc during the call) has its exception
        # swallowed as "unraisable", and the call would then run on unbounded. disarm() stops the repeats.
        signal.setitimer(signal.ITIMER_REAL, _REFIRE_S)
        raise VerifierTimeout(f"verifier call ran past {self.timeout_s} s")

    def disarm(self) -> None:
        if not self._armed:
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._old_handler if self._old_handler is not None else signal.SIG_DFL)
        self._armed = False
        if self._outer_deadline is not None and not self._delegated:  # due now if it passed meanwhile
            signal.setitimer(signal.ITIMER_REAL, max(self._outer_deadline - time.monotonic(), 1e-6),
                             self._outer_interval)


class _WatchdogLimit:
    """A timer thread that raises VerifierTimeout asynchronously into the calling thread."""

    def __init__(self, timeout_s: float):
        self.timeout_s, self.expired = timeout_s, False
        self._thread_id = threading.get_ident()
        self._lock = threading.Lock()
        self._active = False
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True

    def arm(self) -> None:
        self._active = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._active:
                self.expired = True
                _set_async_exc(self._thread_id, VerifierTimeout)
                # Again until disarmed: an exception delivered inside a finalizer is swallowed as "unraisable"
                self._timer = threading.Timer(_REFIRE_S, self._fire)
                self._timer.daemon = True
                self._timer.start()

    def disarm(self) -> None:
        with self._lock:
            self._timer.cancel()  # under the lock: _fire may be replacing it
            if self._active and self.expired:
                _set_async_exc(self._thread_id, None)  # not delivered yet (the call ended in C code): drop it
            self._active = False


def _set_async_exc(thread_id: int, exc) -> None:
    """Raise ``exc`` (a class) in thread ``thread_id`` at its next bytecode; None clears a pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                               ctypes.py_object(exc) if exc is not None else None)
