"""The ways a run stops early on purpose, each with its exit status and a one-line message.

`experiments/run.py` prints `error: <message>` (or the interruption line) and exits with `exit_code`; no
traceback, since each message already names the culprit (a key, a file, a pid, a step).

    BadInput        2    a config key, value, path or resumed workdir that cannot work (before training)
    Diverged        3    `optim.max_nonfinite_steps` non-finite updates in a row (the last good checkpoint stays)
    WorkdirBusy     75   another live run holds the workdir's lock (EX_TEMPFAIL: try again later)
    Interrupted     128 + signal (130 SIGINT, 143 SIGTERM), after checkpointing at a step boundary
"""
from __future__ import annotations

import signal


class RunStop(Exception):
    """Base: a deliberate stop with its own exit status."""
    exit_code = 1


class BadInput(RunStop, ValueError):
    """Bad config, override, path or workdir; raised before anything trains. A ValueError, so callers that
    catch ValueError (tests, notebooks) keep working."""
    exit_code = 2


class Diverged(RunStop, RuntimeError):
    exit_code = 3


class WorkdirBusy(RunStop, RuntimeError):
    exit_code = 75


class Interrupted(RunStop):
    """SIGINT/SIGTERM honoured at a step boundary (see `nemocascade.interrupts`)."""

    def __init__(self, signum: int, where: str = ""):
        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name}{' ' + where if where else ''}; "
                         "run the same command again to resume")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def unknown_keys(part: str, given, known) -> list[str]:
    """`part.key: unknown key; known: [...]` for every key of a config part (`given`) not in `known`: the first
    check of every part's `problems`, so a misspelt key is named before any value is read."""
    return [f"{part}.{k}: unknown key; known: {sorted(known)}" for k in sorted(set(given) - set(known))]
