"""Run untrusted Python source (model-written code) in a separate, locked-down process.

METHOD.md "Rewards per domain": model-written code runs in a sandbox with time and memory limits, no
network and no writes outside a scratch directory. :func:`run_python` runs one program, :func:`run_many`
runs several in parallel (threads, each waiting on its own subprocess). Every call reaps what it started
before it returns: the namespace's init (whose death takes every process in the namespace with it),
then the whole process group, SIGKILLed and waited for.

Layers, outermost first. ``isolation`` names the strongest level this machine allows
(:func:`available_isolation`, probed once per process):

``"root-ns"`` (running as root, ``unshare``/``setpriv``/``mount`` present)
    * fresh network namespace (a loopback that is down: no connection to anything, 127.0.0.1
      included), PID namespace (the program is PID 1 and sees no outside process), IPC, UTS and mount
      namespaces;
    * in the mount namespace: ``/`` remounted read-only, a private ``/proc``, a private 1 MiB
      ``/dev/shm``, and the scratch directory a fresh size-capped tmpfs (gone with the namespace);
    * the program runs as a random unprivileged uid/gid (no supplementary groups, no capabilities,
      ``no_new_privs``): RLIMIT_NPROC applies (root ignores it) and so do file permissions. A directory
      above the interpreter that this uid cannot enter (``/root`` for a pyenv Python) is covered by an
      empty tmpfs with only the interpreter's prefix bind-mounted back in (its secrets stay hidden).
``"user-ns"`` (unprivileged user namespaces allowed)
    the same namespaces and mounts inside a user namespace; the program is root there, mapped to the
    caller's uid. For a non-root caller RLIMIT_NPROC then counts per namespace (Linux >= 5.14); for a
    root caller the mapped uid is root, which ignores RLIMIT_NPROC -- hence "root-ns" for root.
``"hook-only"``
    no namespaces: resource limits and the audit hook below only.

In every level:
    * a new session and process group (``start_new_session``); ``setpriv --pdeathsig KILL`` makes the
      sandbox die with the thread that started it (a :class:`~nemocascade.rewards.pool.VerifierPool`
      worker killed for a timeout takes its sandbox with it);
    * ``python -I -S -B``: no ``PYTHON*`` variables, no site-packages (the standard library only), no
      cwd on ``sys.path``; an empty environment plus ``PATH``/``HOME``/``TMPDIR``/``LANG``; stdin =
      /dev/null; cwd = the scratch directory; stdout + stderr capped: more kills the run, and what is
      left in the pipes is drained during the teardown (a flood ends within ~0.1 s);
    * a bootstrap that sets RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE and
      RLIMIT_CORE=0, then installs a ``sys.addaudithook`` hook (which cannot be removed) before the
      program runs. The hook refuses fork/exec/spawn/system/subprocess, signals to other processes,
      sockets, ctypes, sub-interpreters, gc object walks, code-object construction, setrlimit,
      importing C modules that reach the OS without audit events (``_posixsubprocess``, ``_ctypes``,
      ``_sqlite3``, ...), ``chdir``, links and symlinks; any write, create, delete, rename, chmod, ...
      outside the scratch directory (paths resolved with symlinks followed; a PathLike path is refused
      for writes since its ``__fspath__`` is program code); opening a directory outside it (no
      ``dir_fd`` escapes); and reading ``/proc/<pid>`` of other processes.

The audit hook is a Python-level guard, not a boundary (PEP 578): crafted bytecode (``marshal.loads``,
which imports need) can corrupt memory and disable it, and calls without audit events stay open (e.g.
``signal.pidfd_send_signal``). It is the whole defence only in ``"hook-only"``; in the namespace levels
the kernel enforces the same rules on its own (``tests/test_sandbox.py`` runs every attack with the
hook switched off to show it).
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
    """Outcome of one run. ``ok`` iff it exited with status 0 within every limit."""

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
# Runs as `python -I -S -B -c _BOOT program cpu_s mem_bytes nproc fsize nofile hook` in the scratch
# directory, before the program: it sets the limits, installs the audit hook, then runs the program as
# `__main__` in a fresh module. It imports only C modules before the hook is in place.
_BOOT = r'''
import sys


def _install_hook():
    import _stat
    import posix

    # Everything the hook uses is bound as a positional default: no global or builtin name lookups
    # (the program could rebind those), no closure cells (writable through ``cell_contents``), no
    # mutable containers. A frame of the hook that leaks to the program (traceback, signal handler)
    # therefore holds nothing it could change, and replacing ``__code__``/``__defaults__`` is refused.
    def hook(event, args, home=posix.getcwd(), readlink=posix.readlink, lstat=posix.lstat,
             getcwd=posix.getcwd, getpid=posix.getpid, is_dir_mode=_stat.S_ISDIR, item=tuple.__getitem__,
             type=type, str=str, bytes=bytes, int=int, OSError=OSError, Denied=PermissionError,
             function=type(_install_hook),
             write_flags=posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND,
             refused=frozenset((
                 "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
                 "os.startfile", "subprocess.Popen", "os.killpg", "os.link", "os.symlink", "os.chdir",
                 "resource.setrlimit", "resource.prlimit", "gc.get_objects", "gc.get_referrers",
                 "gc.get_referents", "code.__new__", "cpython.PyInterpreterState_New", "sys.remote_exec")),
             refused_prefixes=("socket.", "ctypes.", "syslog.", "sqlite3.", "_posixshmem."),
             refused_modules=frozenset((
                 "_posixsubprocess", "_ctypes", "ctypes", "_sqlite3", "_dbm", "_gdbm", "_posixshmem",
                 "_multiprocessing", "_testcapi", "_testinternalcapi", "_xxsubinterpreters",
                 "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues")),
             path_events=frozenset((
                 "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime", "os.mkfifo",
                 "os.mknod", "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags")),
             code_attrs=("__code__", "__defaults__", "__kwdefaults__")):
        if event in refused or event.startswith(refused_prefixes):
            raise Denied("sandbox: " + event + " is not allowed")
        if event == "import":
            if type(args[0]) is not str or args[0].split(".")[0] in refused_modules:
                raise Denied("sandbox: this module is not allowed")
            return
        if event == "object.__setattr__":
            if type(args[0]) is function and (type(args[1]) is not str or args[1] in code_attrs):
                raise Denied("sandbox: functions' code and defaults are read-only")
            return
        if event == "os.kill":
            if args[0] != getpid():
                raise Denied("sandbox: no signals to other processes")
            return
        if event == "open":
            if type(args[0]) is int:
                return  # an fd it already holds
            paths, write = (args[0],), type(args[2]) is not int or args[2] & write_flags != 0
        elif event == "os.rename":
            paths, write = (args[0], args[1]), True
        elif event == "os.truncate":
            if type(args[0]) is int:
                return  # ftruncate needs an fd opened for writing, which passed the "open" check
            paths, write = (args[0],), True
        elif event in path_events:
            paths, write = (args[0],), True
        else:
            return
        for path in paths:
            if type(path) is str:
                text = path
            elif type(path) is bytes:
                text = path.decode("utf-8", "surrogateescape")
            elif write:  # a PathLike's __fspath__ is program code: it could answer differently later
                raise Denied("sandbox: writes need a str or bytes path")
            else:
                continue
            # Resolve like the kernel will: absolute, every existing symlink followed.
            todo, done, hops = (text if text.startswith("/") else getcwd() + "/" + text).split("/"), [], 0
            todo.reverse()
            while todo:
                part = todo.pop()
                if part == "" or part == ".":
                    continue
                if part == "..":
                    if done:
                        done.pop()
                    continue
                done.append(part)
                try:
                    link = readlink("/" + "/".join(done))
                except OSError:  # not a link, or missing: keep the name as it is
                    continue
                hops += 1
                if hops > 40:
                    raise Denied("sandbox: too many levels of symbolic links")
                done.pop()
                if link.startswith("/"):
                    done = []
                more = link.split("/")
                more.reverse()
                todo += more
            real = "/" + "/".join(done)
            if real == home or real.startswith(home + "/"):
                continue
            if write:
                raise Denied("sandbox: no writes outside the scratch directory: " + text)
            if real.startswith("/proc/"):
                pid = real.split("/")[2]
                if pid.isdigit() and pid != str(getpid()):
                    raise Denied("sandbox: no access to other processes: " + text)
            try:
                is_dir = is_dir_mode(item(lstat(real), 0))
            except OSError:
                is_dir = False
            if is_dir:  # a directory fd outside the scratch dir would let dir_fd= escape these checks
                raise Denied("sandbox: no directory handles outside the scratch directory: " + text)

    sys.addaudithook(hook)


def _boot():
    import resource
    program = sys.argv[1]
    cpu_s, mem, nproc, fsize, nofile, hook = (int(x) for x in sys.argv[2:8])
    for what, soft, hard in ((resource.RLIMIT_CPU, cpu_s, cpu_s), (resource.RLIMIT_AS, mem, mem),
                             (resource.RLIMIT_NPROC, nproc, nproc), (resource.RLIMIT_FSIZE, fsize, fsize),
                             (resource.RLIMIT_NOFILE, nofile, nofile), (resource.RLIMIT_CORE, 0, 0)):
        cap = resource.getrlimit(what)[1]
        if cap != resource.RLIM_INFINITY:
            soft, hard = min(soft, cap), min(hard, cap)
        resource.setrlimit(what, (soft, hard))
    with open(program, "rb") as f:
        code = compile(f.read(), "program.py", "exec")
    if hook:
        _install_hook()  # cwd is the scratch directory: the hook takes it as home
    main = type(sys)("__main__")
    main.__dict__.update(__builtins__=__builtins__, __file__="program.py")
    sys.modules["__main__"] = main
    sys.argv[:] = ["program.py"]
    exec(code, main.__dict__)


_boot()
'''

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
             audit_hook: bool) -> list[str]:
    """argv of one run at ``isolation`` (the caller has checked the tools exist)."""
    cpu_s = lim.cpu_s if lim.cpu_s is not None else math.ceil(lim.timeout_s) + 1
    boot = [sys.executable, "-I", "-S", "-B", "-c", _BOOT, program, str(cpu_s),
            str(lim.memory_mb << 20), str(lim.max_procs), str(lim.max_file_mb << 20),
            str(lim.max_open_files), str(int(audit_hook))]
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


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Read stdout/stderr until both close and the child exits, the deadline passes or output exceeds
    ``cap``. Returns (stdout, stderr, timed_out, output_exceeded); never reaps the child."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    with selectors.DefaultSelector() as sel:
        for f in bufs:
            os.set_blocking(f.fileno(), False)
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), True, False
            for key, _ in sel.select(timeout=left):
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


def _run(source: str, lim: Limits, isolation: str, audit_hook: bool) -> Result:
    start = time.monotonic()
    uid = _UID_BASE + secrets.randbelow(_UID_SPAN) if isolation == "root-ns" else None
    base = tempfile.mkdtemp(prefix=f"nc-sandbox-{os.getpid()}-", dir=_scratch_parent())
    try:
        os.chmod(base, 0o711)  # the sandbox uid may enter, not list
        program, work = os.path.join(base, "program.py"), os.path.join(base, "work")
        with open(program, "wb") as f:
            f.write(source.encode("utf-8", errors="replace"))
        os.chmod(program, 0o644)
        os.mkdir(work, 0o700)
        argv = _command(isolation, base, work, program, uid, lim, audit_hook)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=work, env=_env(work), start_new_session=True, close_fds=True)
        try:
            out, err, timed_out, exceeded = _collect(proc, start + lim.timeout_s, lim.max_output_bytes)
        finally:
            _kill_all(proc.pid, isolation, (proc.stdout, proc.stderr))  # whatever is left, every time
            returncode = proc.wait()
            proc.stdout.close()
            proc.stderr.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ok = returncode == 0 and not timed_out and not exceeded
    return Result(ok=ok, returncode=returncode, stdout=out.decode("utf-8", "replace"),
                  stderr=err.decode("utf-8", "replace"), timed_out=timed_out, output_exceeded=exceeded,
                  duration_s=time.monotonic() - start, isolation=isolation, pid=proc.pid, uid=uid)


def run_python(source: str, timeout_s: float = 5.0, memory_mb: int = 512, *, isolation: str | None = None,
               audit_hook: bool = True, **limits) -> Result:
    """Run ``source`` as a Python program in the sandbox; never raises for anything the program does.

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
    return _run(source, lim, isolation, audit_hook)


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
