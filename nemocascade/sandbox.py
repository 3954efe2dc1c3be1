"""Run untrusted Python source (model-written code) in a separate, locked-down process.

METHOD.md "Rewards per domain": model-written code runs with time and memory limits, no network and no writes
outside a scratch directory. :func:`run_python` runs one program, :func:`run_many` several in parallel (threads,
each waiting on its own subprocess). Every call reaps what it started before it returns: the namespace's init
(whose death takes every process in the namespace with it), then the whole process group, SIGKILLed and waited for.

Layers, outermost first. ``isolation`` names the strongest level this machine allows (:func:`available_isolation`):

``"root-ns"`` (running as root, ``unshare``/``setpriv``/``mount`` present)
    * fresh network (loopback down: no connection to anything, 127.0.0.1 included), PID (the program is PID 1
      and sees no outside process), IPC, UTS and mount namespaces;
    * in the mount namespace: ``/`` read-only, a private ``/proc``, a private 1 MiB ``/dev/shm``, and the scratch
      directory a fresh size-capped tmpfs (gone with the namespace);
    * a random unprivileged uid/gid (no supplementary groups, no capabilities, ``no_new_privs``), so RLIMIT_NPROC
      (which root ignores) and file permissions apply. A directory above the interpreter that this uid cannot
      enter (``/root`` for a pyenv Python) is covered by an empty tmpfs with only the interpreter's prefix
      bind-mounted back in (its secrets stay hidden).
``"user-ns"`` (unprivileged user namespaces allowed)
    the same inside a user namespace, where the program is root, mapped to the caller's uid. For a non-root caller
    RLIMIT_NPROC then counts per namespace (Linux >= 5.14); for a root caller the mapped uid is root, which
    ignores RLIMIT_NPROC -- hence "root-ns" for root.
``"hook-only"``
    no namespaces: resource limits and the audit hook only.

In every level:
    * a new session and process group; ``setpriv --pdeathsig KILL`` makes the sandbox die with the thread that
      started it (a :class:`~nemocascade.rewards.pool.VerifierPool` worker killed for a timeout takes its sandbox
      with it);
    * ``python -I -S -B``: no ``PYTHON*`` variables, no site-packages, no cwd on ``sys.path``; an environment of
      only ``PATH``/``HOME``/``TMPDIR``/``LANG``; stdin /dev/null (with ``tests``: a pipe, read to EOF and
      replaced by /dev/null before the program); cwd the scratch directory; stdout + stderr capped: more kills
      the run, and the pipes are drained during teardown (a flood ends at once, not at the teardown timeout);
    * a bootstrap (``sandbox_boot.py``, passed as ``-c``) sets RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE,
      RLIMIT_NOFILE and RLIMIT_CORE=0, then installs a ``sys.addaudithook`` hook (which cannot be removed) before
      the program runs. The hook refuses fork/exec/spawn/system/subprocess, signals to other processes, sockets,
      ctypes, sub-interpreters, gc object walks, code-object construction, setrlimit, importing C modules that reach
      the OS without audit events (``_posixsubprocess``, ``_ctypes``, ``_sqlite3``, ...), ``chdir``, links and
      symlinks; any write, create, delete, rename, chmod, ... outside the scratch directory (paths resolved with
      symlinks followed; a PathLike path is refused for writes since its ``__fspath__`` is program code); a ``..``
      out of a directory below the scratch directory, or after a name in a relative path (the hook resolves ``..``
      by name, the kernel through the directory, which a racing rename can move up mid-walk:
      ``a/b/../../proc/self/mem`` then reads memory); opening a directory outside it (no ``dir_fd`` escapes);
      reading ``/proc/<pid>`` of other processes, its own ``/proc/<pid>/mem`` (any task's) and memory devices;
      adding audit hooks; replacing the code or defaults of the bootstrap's own functions; and every route to a
      frame object: ``sys._getframe`` (a ValueError, which ``namedtuple``/``typing``/``enum``/``logging`` treat as
      "no frame"), ``sys._current_frames``, ``sys.settrace``/``setprofile`` (so ``threading.settrace`` too), and
      reading ``tb_frame``/``gi_frame``/``cr_frame``/``ag_frame``. ``gc.set_debug`` is a stand-in that refuses
      (``DEBUG_SAVEALL`` puts cyclic garbage, frames included, in ``gc.garbage`` without an audit event). Signal
      handlers receive frames and ``signal.signal`` raises no audit event, so ``_signal`` is a stand-in with the
      same constants whose functions refuse (``import signal`` works), and ``_imp.create_builtin``, which could
      build the real one again without an audit event, is deleted once every other builtin module is imported.

Test harness (``run_python(program, tests=...)``, used by ``rewards.code.passes_tests``). The exit status proves
nothing: a program can exit 0 before its tests run. So the parent writes a per-run secret
(``secrets.token_hex(16)``) and the tests, ``secret + "\\n" + tests``, to the child's stdin; the bootstrap reads
it before any program code runs (the pipe is then gone), runs the program, then the tests in a namespace of
their own (program globals, builtins and modules copied before the program, comparisons made strict; details in
``sandbox_boot.py``), and only after the last test returned writes ``"\\n<secret> PASS\\n"`` to fd 1 and
``_exit(0)``s. The run passes iff stdout ends with exactly that line and the exit status is 0: an early exit of
any kind, a fake verdict, output after the verdict (a thread) all fail. The secret lives only in two frame
locals of the bootstrap: no frame object, no gc walk, no ``/proc/self/mem``, no stdin reaches it; the tests are
never on disk and their code objects are reachable only through frames. A test that passes one of its own
functions to the program hands it the tests' namespace (``__globals__``), so tests must not.

The audit hook is a Python-level guard, not a boundary (PEP 578): crafted bytecode (``marshal.loads``, which
imports need) can corrupt memory, read the secret and disable the hook, and calls without audit events stay
open (e.g. ``os.write`` to any fd it holds). It is the whole defence only in ``"hook-only"``; in the namespace
levels the kernel enforces the isolation rules on its own (``tests/test_sandbox.py`` runs every attack with the
hook off), but not the harness's secrecy: that rests on the hook at every level.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import secrets
import select
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ISOLATION_LEVELS = ("root-ns", "user-ns", "hook-only")  # strongest first
_SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
_UID_BASE, _UID_SPAN = 1_500_000_000, 500_000_000  # far above any real or container-mapped uid
_SCRATCH_PARENT = "/tmp"  # must be enterable by the sandbox uid (tempfile.gettempdir() may not be)
_PROBE_TIMEOUT_S = 20.0  # first sandbox start on a loaded machine
_TEARDOWN_TIMEOUT_S = 10.0  # a namespace with thousands of processes (a bomb) takes a few seconds to empty


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-run resource limits (see the module docstring for where each one is enforced)."""

    timeout_s: float = 5.0  # wall clock, enforced by the parent
    memory_mb: int = 512  # RLIMIT_AS of the program
    cpu_s: int | None = None  # RLIMIT_CPU; None -> ceil(timeout_s) + 1
    max_procs: int = 16  # RLIMIT_NPROC (threads count too)
    max_file_mb: int = 16  # RLIMIT_FSIZE: largest file it may write
    scratch_mb: int = 32  # size of the scratch tmpfs (namespace levels)
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_output_bytes: int = 1 << 20  # stdout + stderr; more kills the run


@dataclasses.dataclass(frozen=True)
class Result:
    """Outcome of one run. ``ok`` iff it exited with status 0 within every limit and, with ``tests``, the
    harness's verdict arrived (stripped from ``stdout``)."""

    ok: bool
    returncode: int  # of the direct child; negative: killed by that signal (unshare may relay it as 1)
    stdout: str
    stderr: str
    timed_out: bool = False
    output_exceeded: bool = False
    duration_s: float = 0.0
    isolation: str = ""
    pid: int | None = None  # pid of the direct child = its process group and session id
    uid: int | None = None  # the unprivileged uid it ran as ("root-ns" only)


# --------------------------------------------------------------------------------------- bootstrap
# The code that runs inside the sandbox's Python process, before (and with tests, after) the program:
# ``python -I -S -B -c _BOOT program cpu_s mem_bytes nproc fsize nofile hook harness``. Read, not imported:
# its defaults are bound from the child's ``sys`` when it runs there.
_BOOT = Path(__file__).with_name("sandbox_boot.py").read_text(encoding="utf-8")

# Runs as root (of the new namespaces) between unshare and the drop to the sandbox uid. Arguments:
# base work owner_opts hide prefix scratch_mb, then the command to exec.
_PRELUDE = r'''
set -e
umask 022
base=$1 work=$2 owner=$3 hide=$4 prefix=$5 mb=$6
shift 6
mount -t tmpfs -o "size=${mb}m,mode=0700$owner" nc-scratch "$work"
if [ -n "$hide" ]; then
    mkdir "$base/prefix"
    mount --bind "$prefix" "$base/prefix"
    mount -t tmpfs -o size=1m,mode=0755 nc-hide "$hide"
    mkdir -p "$prefix"
    mount --move "$base/prefix" "$prefix"
    rmdir "$base/prefix"
fi
mount -o remount,bind,ro /
if [ -d /dev/shm ]; then mount -t tmpfs -o size=1m,mode=1777 nc-shm /dev/shm; fi
cd "$work"
unset OLDPWD PWD
exec "$@"
'''
_NAMESPACES = ("--net", "--pid", "--ipc", "--uts", "--mount", "--fork", "--kill-child", "--mount-proc")


def _tool(name: str) -> str | None:
    return shutil.which(name, path=_SAFE_PATH)


def _hidden_ancestor(path: str) -> str:
    """The highest directory on ``path`` that other users cannot enter ("" if none)."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        if not os.stat(d).st_mode & 0o001:
            return d
    return ""


def _command(isolation: str, base: str, work: str, program: str, uid: int | None, lim: Limits,
             audit_hook: bool, harness: bool = False) -> list[str]:
    """argv of one run at ``isolation`` (the caller has checked the tools exist)."""
    cpu_s = lim.cpu_s if lim.cpu_s is not None else math.ceil(lim.timeout_s) + 1
    boot = [sys.executable, "-I", "-S", "-B", "-c", _BOOT, program, str(cpu_s),
            str(lim.memory_mb << 20), str(lim.max_procs), str(lim.max_file_mb << 20),
            str(lim.max_open_files), str(int(audit_hook)), str(int(harness))]
    setpriv = _tool("setpriv")
    die_with_parent = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    if isolation == "hook-only":
        return die_with_parent + boot
    unshare, sh = _tool("unshare"), _tool("sh")
    if isolation == "root-ns":
        prefix = os.path.realpath(sys.base_prefix)
        hide = _hidden_ancestor(prefix)
        drop = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--pdeathsig", "KILL", "--"]
        return (die_with_parent + [unshare, *_NAMESPACES, "--", sh, "-c", _PRELUDE, "sh", base, work,
                                   f",uid={uid},gid={uid}", hide, prefix, str(lim.scratch_mb)] + drop + boot)
    if isolation == "user-ns":
        inner = [setpriv, "--no-new-privs", "--pdeathsig", "KILL", "--"] if setpriv else []
        return (die_with_parent + [unshare, "--user", "--map-root-user", *_NAMESPACES, "--", sh, "-c", _PRELUDE,
                                   "sh", base, work, "", "", "", str(lim.scratch_mb)] + inner + boot)
    raise ValueError(f"unknown isolation {isolation!r}; expected one of {ISOLATION_LEVELS}")


@functools.lru_cache(maxsize=None)
def available_isolation() -> tuple[str, ...]:
    """Isolation levels that work on this machine, strongest first (``"hook-only"`` always).

    A level counts only if a probe program actually runs under it (cached for the process).
    """
    _sweep_stale_scratch()
    levels = []
    have = {t: _tool(t) is not None for t in ("unshare", "setpriv", "mount", "sh")}
    if os.geteuid() == 0 and all(have.values()):
        levels.append("root-ns")
    if have["unshare"] and have["mount"] and have["sh"]:
        levels.append("user-ns")
    return (*[lv for lv in levels if _probe(lv)], "hook-only")


def _scratch_parent() -> str | None:
    return _SCRATCH_PARENT if os.path.isdir(_SCRATCH_PARENT) else None


def _sweep_stale_scratch(min_age_s: float = 600.0) -> None:
    """Remove scratch directories left by processes that died mid-run (a pool worker killed for a
    timeout cannot clean up): named ``nc-sandbox-<creator pid>-``, creator gone, older than ``min_age_s``."""
    parent = _scratch_parent() or tempfile.gettempdir()
    for name in os.listdir(parent):
        parts = name.split("-")
        if not name.startswith("nc-sandbox-") or len(parts) < 4 or not parts[2].isdigit():
            continue
        path = os.path.join(parent, name)
        try:
            os.kill(int(parts[2]), 0)
            continue  # its creator still runs
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        try:
            if time.time() - os.lstat(path).st_mtime > min_age_s:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


def _probe(isolation: str) -> bool:
    try:
        return _run("print(6 * 7)", Limits(timeout_s=_PROBE_TIMEOUT_S), isolation, True).stdout == "42\n"
    except OSError:  # a tool that will not start
        return False


def _env(work: str) -> dict[str, str]:
    """The program's whole environment: nothing of the caller's leaks in."""
    return {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``/proc/PID/task/PID/children``, else a scan of ``/proc``)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        pass
    kids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            kids.append(int(entry))
    return kids


def _kill_all(pid: int, isolation: str, pipes: tuple = ()) -> None:
    """SIGKILL everything the run started. In the namespace levels ``pid`` is ``unshare``: kill its child,
    the namespace's init, whose death makes the kernel kill every process in the namespace; ``unshare``
    exits once the init is reaped, i.e. once the namespace is empty (wait for that, so nothing is still
    dying when we return, and no init is orphaned to the host's init as a zombie); then the whole group.
    Meanwhile ``pipes`` (the run's stdout/stderr) are drained and dropped: ``unshare`` reports its child's
    death on stderr, and behind a pipe that a flood filled it would block until the teardown timeout."""
    if isolation != "hook-only":
        for child in _children(pid):
            try:
                os.kill(child, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        give_up, open_pipes = time.monotonic() + _TEARDOWN_TIMEOUT_S, [p.fileno() for p in pipes]
        while not _exited(pid) and time.monotonic() < give_up:
            open_pipes = _drain(open_pipes, 0.002)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _drain(fds: list[int], timeout: float) -> list[int]:
    """Read and drop what the (non-blocking) ``fds`` hold, waiting up to ``timeout``; the fds still open."""
    if not fds:
        time.sleep(timeout)
        return fds
    ready, _, _ = select.select(fds, [], [], timeout)
    for fd in ready:
        try:
            while os.read(fd, 65536):
                pass
            fds = [f for f in fds if f != fd]  # EOF
        except BlockingIOError:
            pass
    return fds


def _exited(pid: int) -> bool:
    """True once the child has exited, without reaping it (so its process group id stays ours)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _collect(proc: subprocess.Popen, deadline: float, cap: int,
             payload: bytes = b"") -> tuple[bytes, bytes, bool, bool]:
    """Write ``payload`` to the child's stdin (if piped) and close it; read stdout/stderr until both close
    and the child exits, the deadline passes or output exceeds ``cap``. Returns (stdout, stderr, timed_out,
    output_exceeded); never reaps the child."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    sent = 0
    with selectors.DefaultSelector() as sel:
        for f in bufs:
            os.set_blocking(f.fileno(), False)
            sel.register(f, selectors.EVENT_READ)
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), True, False
            for key, _ in sel.select(timeout=left):
                if key.fileobj is proc.stdin:
                    try:
                        sent += os.write(key.fd, payload[sent:sent + 65536])
                    except BlockingIOError:
                        continue
                    except OSError:  # the child is gone or closed its stdin: nothing more to send
                        sent = len(payload)
                    if sent >= len(payload):
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                bufs[key.fileobj] += chunk
                if len(bufs[proc.stdout]) + len(bufs[proc.stderr]) > cap:
                    return bytes(bufs[proc.stdout])[:cap], bytes(bufs[proc.stderr])[:cap], False, True
    out, err = bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr])
    while not _exited(proc.pid):  # pipes closed but still running (closed its own stdout/stderr)
        if time.monotonic() >= deadline:
            return out, err, True, False
        time.sleep(0.005)
    return out, err, False, False


def _run(source: str, lim: Limits, isolation: str, audit_hook: bool, tests: str | None = None) -> Result:
    start = time.monotonic()
    secret = secrets.token_hex(16)  # with tests: the harness's proof that they passed (sandbox_boot.py)
    verdict = f"\n{secret} PASS\n".encode()
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if isolation == "root-ns" else None
    base = tempfile.mkdtemp(prefix=f"nc-sandbox-{os.getpid()}-", dir=_scratch_parent())
    try:
        os.chmod(base, 0o711)  # the sandbox uid may enter, not list
        program, work = os.path.join(base, "program.py"), os.path.join(base, "work")
        with open(program, "wb") as f:
            f.write(source.encode("utf-8", errors="replace"))
        os.chmod(program, 0o644)
        os.mkdir(work, 0o700)
        argv = _command(isolation, base, work, program, uid, lim, audit_hook, harness=tests is not None)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL if tests is None else subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work, env=_env(work),
                                start_new_session=True, close_fds=True)
        payload = b"" if tests is None else f"{secret}\n{tests}".encode("utf-8", errors="replace")
        try:
            out, err, timed_out, exceeded = _collect(proc, start + lim.timeout_s, lim.max_output_bytes, payload)
        finally:
            _kill_all(proc.pid, isolation, (proc.stdout, proc.stderr))  # whatever is left, every time
            returncode = proc.wait()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    passed = tests is None or out.endswith(verdict)  # the secret arrives only after the last test returned
    if tests is not None and passed:
        out = out[:-len(verdict)]
    ok = returncode == 0 and not timed_out and not exceeded and passed
    return Result(ok=ok, returncode=returncode, stdout=out.decode("utf-8", "replace"),
                  stderr=err.decode("utf-8", "replace"), timed_out=timed_out, output_exceeded=exceeded,
                  duration_s=time.monotonic() - start, isolation=isolation, pid=proc.pid, uid=uid)


def run_python(source: str, timeout_s: float = 5.0, memory_mb: int = 512, *, tests: str | None = None,
               isolation: str | None = None, audit_hook: bool = True, **limits) -> Result:
    """Run ``source`` as a Python program in the sandbox; never raises for anything the program does.

    ``tests``: trusted test source, run by the harness after the program (module docstring); ``ok`` then
    means the harness's secret verdict arrived (the tests returned), not just exit status 0.
    ``timeout_s``: wall clock from launch (namespace set-up and interpreter start included).
    ``memory_mb``: address-space limit. ``limits``: any other :class:`Limits` field.
    ``isolation``: None = strongest available (:func:`available_isolation`), or one of
    :data:`ISOLATION_LEVELS` (ValueError if it does not work here). ``audit_hook=False`` leaves only the
    kernel layers (for tests of those layers; never for untrusted code at ``"hook-only"``).
    """
    if timeout_s <= 0 or memory_mb <= 0:
        raise ValueError(f"timeout_s and memory_mb must be > 0, got {timeout_s}, {memory_mb}")
    lim = Limits(timeout_s=timeout_s, memory_mb=memory_mb, **limits)
    levels = available_isolation()
    if isolation is None:
        isolation = levels[0]
    elif isolation not in levels:
        raise ValueError(f"isolation {isolation!r} is not available here; available: {levels}")
    return _run(source, lim, isolation, audit_hook, tests)


def run_many(sources: list[str], timeout_s: float = 5.0, max_workers: int | None = None, **kwargs) -> list[Result]:
    """:func:`run_python` on each source, ``max_workers`` at a time (default: CPU count), results in order.

    Each run has its own ``timeout_s`` counted from its own launch, so one hung program costs one
    worker ``timeout_s`` and delays no other run beyond that.
    """
    if not sources:
        return []
    available_isolation()  # probe once here, not in every thread at the same time
    workers = max_workers or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=min(workers, len(sources)), thread_name_prefix="sandbox") as ex:
        return list(ex.map(lambda s: run_python(s, timeout_s, **kwargs), sources))
