"""How many XLA compilations this process has run, and their seconds: `compiles.count()` -> (n, seconds).

A listener on JAX's own monitoring event (`/jax/core/compile/backend_compile_duration`, one per backend compile),
registered once on import. The trainer logs the difference per step (`compiles`, `compile_s` in metrics.jsonl),
so a shape that recompiles every step shows up in the metrics, and benchmarks/speed.py asserts that timed steps
compile nothing.
"""
from __future__ import annotations

import threading

import jax

_EVENT = "/jax/core/compile/backend_compile_duration"
_lock = threading.Lock()
_n, _seconds = 0, 0.0


def _listen(event: str, duration: float, **_):
    global _n, _seconds
    if event == _EVENT:
        with _lock:
            _n += 1
            _seconds += duration


jax.monitoring.register_event_duration_secs_listener(_listen)


def count() -> tuple[int, float]:
    """(compilations so far, their total seconds) in this process since nemocascade.compiles was imported."""
    with _lock:
        return _n, _seconds


class Since:
    """Compilations since the last `take()` (or construction): `take()` -> {"compiles": n, "compile_s": s}."""

    def __init__(self):
        self._last = count()

    def take(self) -> dict[str, float]:
        now = count()
        out = {"compiles": float(now[0] - self._last[0]), "compile_s": now[1] - self._last[1]}
        self._last = now
        return out
