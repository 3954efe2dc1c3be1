"""A process pool for verifiers, with a per-call timeout that kills hung workers.

METHOD.md "Rewards per domain": verification runs in parallel across processes. Verifiers see model
output, so any call may raise, hang (sympy on a pathological expression, an infinite loop in generated
code) or crash its interpreter; none of that may stall or kill the RL step. Contract of
:meth:`VerifierPool.score`: one float per item, in item order; a call that raises, returns something
``float()`` rejects, exceeds its timeout or kills its worker scores 0.0, and is counted in
:attr:`VerifierPool.last_stats` (``timeouts`` / ``errors`` / ``crashes`` of the last ``score`` call), which
the RL metrics log as ``verifier_timeouts`` / ``verifier_errors`` / ``verifier_crashes``. The verifiers
score bad *input* 0.0 themselves; an exception reaching the pool is a verifier bug, so it is counted.

Why our own pool rather than ``concurrent.futures.ProcessPoolExecutor``: a running future cannot be
cancelled, so a hung call would hold its worker forever, and a worker that dies breaks the whole
executor. Here each worker is a ``multiprocessing.Process`` with its own pipe and runs one call at a
time; the parent waits on all pipes with a deadline per call and, when a deadline passes, kills that
one worker (SIGKILL) and starts a fresh one.

Workers are started with the "spawn" context: the parent holds JAX/XLA threads and forking a
multi-threaded process can deadlock the child. Spawn costs an interpreter start plus the import of
``fn``'s module per worker (again after each kill), and, like every spawn pool, it re-imports the
launching script, which must therefore guard its entry point with ``if __name__ == "__main__":``.
Neither start-up nor loading ``fn`` counts against a call's timeout: both get the boot limit, and the
call's deadline starts after them.
``fn`` travels by reference: a module-level function of a module a fresh interpreter can import, or of a file
loaded by path under a name no other interpreter knows (an experiment config file): such a function travels as
(file, name) and each worker runs the file once (:func:`portable`).
Each worker runs ``fn`` in its main thread, so verifiers may use ``signal`` timers
(:func:`~nemocascade.rewards.limits.call_with_timeout`, which ``rewards/math.py`` uses around sympy).
Workers are daemon processes: a verifier must not use ``multiprocessing`` itself, and one that starts
subprocesses (code execution) must bound and reap them itself -- killing a hung worker does not kill
its children.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import wait

from nemocascade.rewards.limits import call_with_timeout

_CTX = mp.get_context("spawn")
_STOP = b"stop"  # not a valid pickle, so no task can look like it
_READY = b"ready"
_BOOT_TIMEOUT_S = 120.0  # interpreter start + imports; generous for a loaded machine
_LOADING, _LOADED = "loading", "loaded"  # a worker's notes around loading a new fn (its module's import)
OUTCOMES = ("timeouts", "errors", "crashes")  # the keys of VerifierPool.last_stats
_FILE_MODULES: dict[str, object] = {}  # path -> module, in a worker: files loaded by `_file_function`


def _file_function(path: str, name: str):
    """The function `name` of the Python file at `path`, which this process runs once (its folder joins
    sys.path first, as `configs.add_import_dir` does, so a config's `from _common import ...` works)."""
    module = _FILE_MODULES.get(path)
    if module is None:
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.append(folder)
        stem = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(f"nemocascade_verifier_file_{stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _FILE_MODULES[path] = module
    return getattr(module, name)


class _ByFile:
    """Pickles as `_file_function(path, name)`: the worker unpickles the function itself."""

    def __init__(self, path: str, name: str):
        self.path, self.name = path, name

    def __reduce__(self):
        return _file_function, (self.path, self.name)


def portable(fn):
    """`fn`, or a `_ByFile` for it when it is a module-level function of a top-level module that a fresh
    interpreter cannot import by name but that has a file (a config file loaded by path)."""
    module = getattr(fn, "__module__", None) or ""
    if "." in module or module in sys.builtin_module_names or not isinstance(fn, type(portable)):
        return fn  # a package's module, a builtin, a callable object: pickled by reference as it is
    if module == "__main__" or importlib.machinery.PathFinder.find_spec(module) is not None:
        return fn
    try:
        path = inspect.getfile(inspect.unwrap(fn))
    except TypeError:
        return fn
    name = fn.__qualname__
    if not os.path.isfile(path) or "." in name:
        return fn  # no file to run (a module made in memory): the workers' load error names it
    return _ByFile(os.path.abspath(path), name)


def _worker_main(conn) -> None:
    """Worker loop: receive ``(index, pickled fn, pickled args)``, reply ``(index, score, raised, load_error)``.

    ``fn`` and ``args`` travel pickled inside the message so that failing to load them is reported, not fatal. A
    new ``fn`` (other bytes than the last one's) is loaded between two notes, ``(_LOADING, index)`` and
    ``(_LOADED, index)``: the parent gives the load the boot time limit and starts the call's clock after it.
    ``_STOP`` exits.
    """
    # Ctrl-C reaches the whole process group; the parent decides when workers die, not the terminal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn.send_bytes(_READY)
    fn_blob, fn = None, None
    while True:
        try:
            task = conn.recv_bytes()
        except (EOFError, OSError):
            return  # parent gone
        if task == _STOP:
            return
        index, new_fn_blob, args_blob = pickle.loads(task)
        try:
            if new_fn_blob != fn_blob:
                conn.send((_LOADING, index))
                fn, fn_blob = pickle.loads(new_fn_blob), new_fn_blob
                conn.send((_LOADED, index))
            args = pickle.loads(args_blob)
        except BaseException as e:  # fn's module does not import here: a setup error, not a bad item
            fn_blob = None
            conn.send((index, 0.0, False, f"{type(e).__name__}: {e}"))
            continue
        try:
            value, raised = float(fn(*args)), False
        except BaseException:  # includes SystemExit from a verifier: still one bad item, not a dead pool
            value, raised = 0.0, True
        conn.send((index, value, raised, None))


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self):
        self.conn, child_conn = _CTX.Pipe()
        self.proc = _CTX.Process(target=_worker_main, args=(child_conn,), daemon=True)
        self.proc.start()
        child_conn.close()  # so the parent's recv sees EOF when the child dies
        self.task: int | None = None  # index of the item it is running
        self.deadline = 0.0
        self.booted = False

    def send(self, payload: bytes) -> None:
        """Send a task once the worker has booted, so start-up time never counts against a call."""
        if not self.booted:
            if not self.conn.poll(_BOOT_TIMEOUT_S) or self.conn.recv_bytes() != _READY:
                pid = self.proc.pid
                raise RuntimeError(f"verifier worker {pid} failed to start within {_BOOT_TIMEOUT_S} s")
            self.booted = True
        self.conn.send_bytes(payload)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


class VerifierPool:
    """``score(fn, items)`` = ``[fn(*item) for item in items]`` in parallel, each call time-boxed.

    ``num_workers``: processes (None -> ``os.cpu_count()``); 0 runs every call inline in this process,
    for debugging and tiny runs, under the same ``timeout_s`` (``limits.call_with_timeout``: it interrupts
    Python code, and, in the main thread, sleeps and waits; it cannot stop a verifier that swallows
    ``BaseException`` or one long C call, and no crash is survived: use workers for untrusted volume).
    ``timeout_s``: default per-call limit, counted from when the call reaches its worker.
    Use as a context manager or call :meth:`close`. ``score`` may be called from several threads (calls
    are serialised); ``last_stats`` then belongs to whichever call finished last.
    """

    def __init__(self, num_workers: int | None = None, timeout_s: float = 5.0):
        if num_workers is None:
            num_workers = os.cpu_count() or 1
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0 (0 = inline), got {num_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.num_workers, self.timeout_s = num_workers, timeout_s
        self._workers = [_Worker() for _ in range(num_workers)]
        self._lock = threading.Lock()
        self._closed = False
        self.last_stats = dict.fromkeys(OUTCOMES, 0)

    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the current worker processes (a killed worker's replacement has a new PID)."""
        return [w.proc.pid for w in self._workers]

    def score(self, fn, items: list[tuple], timeout_s: float | None = None) -> list[float]:
        """One float per item, in item order; a raising, hung (> ``timeout_s``) or crashing call -> 0.0.

        Afterwards ``last_stats`` counts this call's items by outcome: ``timeouts`` (ran past
        ``timeout_s``), ``errors`` (raised, returned a non-number, or had unpicklable arguments) and
        ``crashes`` (killed its worker process).

        ``fn`` must be picklable by reference (a module-level function such as
        ``nemocascade.rewards.math.score``); ``items`` are argument tuples. An unpicklable ``fn`` is a
        programming error and raises TypeError; so is an ``fn`` that the workers cannot import
        (RuntimeError), which would otherwise score every item 0.0 in silence. An unpicklable item
        scores 0.0.
        """
        if self._closed:
            raise RuntimeError("VerifierPool.score called after close()")
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        for k, item in enumerate(items):
            if not isinstance(item, (tuple, list)):
                raise TypeError(f"items[{k}] must be a tuple of fn's arguments, got {type(item).__name__}")
        items = [tuple(item) for item in items]
        if self.num_workers:
            try:
                fn_blob = pickle.dumps(portable(fn))  # the same bytes for every item: a worker loads fn once
            except Exception as e:
                raise TypeError(f"VerifierPool needs a picklable module-level fn, got {fn!r}: {e}") from e
        with self._lock:
            stats = dict.fromkeys(OUTCOMES, 0)
            if self.num_workers == 0:
                results = [_call_inline(fn, args, timeout_s, stats) for args in items]
            else:
                results = self._run(fn_blob, items, timeout_s, stats)
            self.last_stats = stats
            return results

    def _run(self, fn_blob: bytes, items: list[tuple], timeout_s: float, stats: dict[str, int]) -> list[float]:
        results = [0.0] * len(items)  # anything that never reports back keeps 0.0
        queue = iter(range(len(items)))

        def dispatch(i: int) -> None:
            """Give worker i the next item (pickled here, so a bad item cannot break the pipe)."""
            worker = self._workers[i]
            worker.task = None
            for index in queue:
                try:
                    payload = pickle.dumps((index, fn_blob, pickle.dumps(items[index])))
                except Exception:
                    stats["errors"] += 1  # this item's args cannot cross a process boundary: 0.0
                    continue
                try:
                    worker.send(payload)
                except (OSError, EOFError):  # died while idle (killed from outside): replace, resend once
                    worker = self._replace(i)
                    worker.send(payload)
                worker.task, worker.deadline = index, time.monotonic() + timeout_s
                return

        try:
            for i in range(len(self._workers)):
                dispatch(i)
            self._collect(results, stats, dispatch, timeout_s)
        except BaseException:
            # A worker still running an abandoned call would answer the *next* batch with a stale
            # (index, value): replace every busy worker before letting the error out.
            for i, worker in enumerate(self._workers):
                if worker.task is not None:
                    self._replace(i)
            raise
        return results

    def _collect(self, results: list[float], stats: dict[str, int], dispatch, timeout_s: float) -> None:
        """Wait for replies and deadlines until every worker is idle, refilling each freed worker."""
        while busy := [w for w in self._workers if w.task is not None]:
            next_deadline = min(w.deadline for w in busy)
            ready = wait([w.conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            for i, worker in enumerate(self._workers):
                if worker.task is None:
                    continue
                if worker.conn in ready:
                    try:
                        reply = worker.conn.recv()
                    except (EOFError, OSError):  # died mid-call (os._exit, OOM kill, segfault)
                        stats["crashes"] += 1
                        self._replace(i)
                    else:
                        if reply[0] in (_LOADING, _LOADED):  # a load has the boot limit; then the call starts
                            worker.deadline = time.monotonic() + (_BOOT_TIMEOUT_S if reply[0] == _LOADING
                                                                  else timeout_s)
                            continue
                        index, value, raised, load_error = reply
                        worker.task = None
                        if load_error is not None:
                            raise RuntimeError(
                                f"a verifier worker could not unpickle the fn or item {index} ({load_error});"
                                " fn must be importable by module path in a fresh interpreter")
                        results[index] = value
                        stats["errors"] += raised
                elif time.monotonic() >= worker.deadline:
                    stats["timeouts"] += 1
                    self._replace(i)  # hung past its deadline
                else:
                    continue
                dispatch(i)

    def _replace(self, i: int) -> _Worker:
        self._workers[i].kill()
        self._workers[i] = _Worker()
        return self._workers[i]

    def close(self) -> None:
        """Stop all workers (politely, then by force). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for w in self._workers:
            try:
                w.conn.send_bytes(_STOP)
            except OSError:
                pass
        for w in self._workers:
            w.proc.join(timeout=1.0)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join()
            w.conn.close()
        self._workers = []

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _call_inline(fn, args: tuple, timeout_s: float, stats: dict[str, int]) -> float:
    try:
        value, timed_out = call_with_timeout(timeout_s, fn, *args)
        if not timed_out:
            return float(value)
        stats["timeouts"] += 1
    except Exception:
        stats["errors"] += 1
    return 0.0
