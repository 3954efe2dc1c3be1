"""nemocascade.sandbox and the code reward: adversarial programs, limits, reaping, parallel runs, the pool.

Every attack runs in up to three modes:
  * "default": through ``rewards.code.passes_tests`` (the strongest isolation here, audit hook on);
  * "hook-only": no namespaces, so the audit hook and the rlimits alone must stop it;
  * "<ns>-no-hook": the strongest namespace level with the audit hook OFF, so the kernel alone
    (namespaces, unprivileged uid, read-only root, RLIMIT_NPROC) must stop it.
After each: the run failed, its side effect did not happen, and no process of the run is left
(``_left_behind`` scans /proc for the run's session, process group, pid and sandbox uid).
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from nemocascade import sandbox
from nemocascade.rewards import code as code_reward
from nemocascade.rewards.pool import VerifierPool

LEVELS = sandbox.available_isolation()
NS_LEVELS = [lv for lv in LEVELS if lv != "hook-only"]
MODES = [pytest.param(None, True, id="default"), pytest.param("hook-only", True, id="hook-only")]
if NS_LEVELS:
    MODES.append(pytest.param(NS_LEVELS[0], False, id=f"{NS_LEVELS[0]}-no-hook"))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------------ helpers

def _procs() -> dict[int, tuple[str, int, int, int, int]]:
    """pid -> (state, ppid, pgid, sid, uid) of every process on the machine."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            uid = os.stat(f"/proc/{entry}").st_uid
        except (OSError, IndexError):
            continue
        out[int(entry)] = (fields[0], int(fields[1]), int(fields[2]), int(fields[3]), uid)
    return out


def _left_behind(r: sandbox.Result, wait_s: float = 5.0) -> list[int]:
    """Processes of run ``r`` (its pid, process group, session or sandbox uid) still alive after up to
    ``wait_s`` seconds, plus any zombie of ours. A zombie re-parented to the host's init is dead and
    init's to reap (only happens when the program kills its own launcher, see the user-ns-as-root case)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = [pid for pid, (state, ppid, pgid, sid, uid) in _procs().items()
                if (pid == r.pid or pgid == r.pid or sid == r.pid or (r.uid is not None and uid == r.uid))
                and (state != "Z" or ppid == os.getpid())]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def _run(source: str, isolation, hook: bool, monkeypatch, timeout_s: float = 1.5) -> sandbox.Result:
    """Run an attack in one mode; assert it failed and left nothing behind; return its Result."""
    if isolation is None:
        seen = []

        def spy(*args, **kwargs):
            seen.append(real(*args, **kwargs))
            return seen[-1]

        real = sandbox.run_python
        monkeypatch.setattr(sandbox, "run_python", spy)
        assert code_reward.passes_tests(source, "", timeout_s=timeout_s) is False
        monkeypatch.setattr(sandbox, "run_python", real)
        (r,) = seen
    else:
        r = sandbox.run_python(source, timeout_s=timeout_s, isolation=isolation, audit_hook=hook)
    assert not r.ok, r
    assert _left_behind(r) == []
    return r


def _root_in_user_ns(isolation, hook: bool) -> bool:
    """Kernel-only mode where the program is uid 0 outside its namespaces: RLIMIT_NPROC does not bind."""
    return isolation == "user-ns" and not hook and os.geteuid() == 0


@pytest.fixture(scope="module")
def listener():
    """A TCP server on 127.0.0.1 in the test's own network namespace."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        s.setblocking(False)
        yield s


# ----------------------------------------------------------------------------------- positive cases

def test_correct_program_passes_and_wrong_one_fails():
    tests = "assert f(1) == 4\nassert f(-3) == 0\n"
    assert code_reward.passes_tests("def f(x):\n    return x + 3\n", tests) is True
    assert code_reward.passes_tests("def f(x):\n    return x + 2\n", tests) is False
    assert code_reward.passes_tests("def f(x) return x", tests) is False  # syntax error
    assert code_reward.passes_tests("def f(x):\n    return x + 3\n", ["assert f(1) == 4", "assert f(2) == 5"]) is True
    with pytest.raises(TypeError):
        code_reward.passes_tests("", [1, 2])


@pytest.mark.parametrize("isolation", LEVELS)
def test_output_exit_status_scratch_and_clean_environment(isolation, monkeypatch):
    monkeypatch.setenv("NC_SANDBOX_TEST_SECRET", "hunter2")
    source = ("import os, sys, tempfile\n"
              "print('out', 6 * 7)\n"
              "print('err', file=sys.stderr)\n"
              "open('note.txt', 'w').write('kept')\n"
              "fd, path = tempfile.mkstemp()\n"
              "print(open('note.txt').read(), os.path.dirname(path) == os.getcwd() == os.environ['HOME'])\n"
              "print(sorted(os.environ), sys.flags.isolated, sys.flags.no_site)\n"
              "sys.exit(3)\n")
    r = sandbox.run_python(source, isolation=isolation)
    assert r.stdout == "out 42\nkept True\n['HOME', 'LANG', 'PATH', 'TMPDIR'] 1 1\n"
    assert r.stderr == "err\n"
    assert (r.returncode, r.ok, r.timed_out, r.isolation) == (3, False, False, isolation)
    assert _left_behind(r) == []
    r = sandbox.run_python("print('fine')", isolation=isolation)
    assert (r.ok, r.returncode, r.stdout) == (True, 0, "fine\n")


def test_unknown_or_unavailable_isolation_is_an_error():
    with pytest.raises(ValueError, match="not available"):
        sandbox.run_python("pass", isolation="vm")


def test_run_many_keeps_order_and_a_hung_run_delays_no_other():
    sources = ["import time\ntime.sleep(60)"] + [f"print({i} * {i})" for i in range(6)]
    start = time.monotonic()
    results = sandbox.run_many(sources, timeout_s=3.0, max_workers=3)
    elapsed = time.monotonic() - start
    assert results[0].timed_out and not results[0].ok and results[0].duration_s >= 3.0
    assert [r.stdout for r in results[1:]] == [f"{i * i}\n" for i in range(6)]
    assert all(r.ok and not r.timed_out for r in results[1:])
    assert elapsed < 3.0 + 2.5  # the hung run costs one worker its timeout, not the batch
    assert all(_left_behind(r) == [] for r in results)


# -------------------------------------------------------------------------------------------- attacks

@pytest.mark.parametrize("isolation,hook", MODES)
def test_infinite_loop_is_killed_at_the_deadline(isolation, hook, monkeypatch):
    start = time.monotonic()
    r = _run("while True:\n    pass\n", isolation, hook, monkeypatch, timeout_s=1.0)
    assert r.timed_out and time.monotonic() - start < 1.0 + 3.0


@pytest.mark.parametrize("isolation,hook", MODES)
def test_fork_bomb(isolation, hook, monkeypatch):
    # Failed forks are swallowed and retried, as in a real bomb: only the deadline ends it.
    r = _run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
             isolation, hook, monkeypatch, timeout_s=1.0)
    assert r.timed_out
    # Not swallowed: the first refused fork ends the run, with the hook's or the kernel's error.
    r = _run("import os\nwhile True:\n    os.fork()\n", isolation, hook, monkeypatch)
    assert ("PermissionError: sandbox: os.fork" in r.stderr or "BlockingIOError" in r.stderr
            or _root_in_user_ns(isolation, hook)), r.stderr


FORK_COUNT = """
import os, time
n = 0
while n < {cap}:
    try:
        pid = os.fork()
    except BlockingIOError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print(n)
"""


@pytest.mark.skipif("root-ns" not in LEVELS, reason="needs root and unshare/setpriv/mount")
def test_rlimit_nproc_binds_the_unprivileged_sandbox_uid():
    # Hook off: only RLIMIT_NPROC stops the forks. The program itself is 1 of the 16 processes of its uid.
    r = sandbox.run_python(FORK_COUNT.format(cap=1000), isolation="root-ns", audit_hook=False, max_procs=16)
    assert (r.ok, r.stdout) == (True, "15\n")
    assert _left_behind(r) == []  # the sleeping children died with the PID namespace


@pytest.mark.skipif(os.geteuid() != 0 or "user-ns" not in LEVELS, reason="needs root and user namespaces")
def test_root_in_a_user_namespace_ignores_rlimit_nproc():
    # Why root gets "root-ns": in "user-ns" the program is uid 0 outside too, and the kernel exempts
    # root from RLIMIT_NPROC, so only the audit hook (off here) and the deadline would stop a bomb.
    r = sandbox.run_python(FORK_COUNT.format(cap=40), isolation="user-ns", audit_hook=False, max_procs=16)
    assert (r.ok, r.stdout) == (True, "40\n")
    assert _left_behind(r) == []


@pytest.mark.parametrize("isolation,hook", MODES)
def test_subprocess_loop(isolation, hook, monkeypatch):
    r = _run("import subprocess\nwhile True:\n    subprocess.Popen(['/bin/sleep', '60'])\n",
             isolation, hook, monkeypatch)
    # Refused by the hook (PermissionError), or by RLIMIT_NPROC for the sandbox uid (BlockingIOError);
    # only the deadline stops it where the program is root outside too (user-ns run by root, no hook).
    assert "PermissionError" in r.stderr or "BlockingIOError" in r.stderr or _root_in_user_ns(isolation, hook)


@pytest.mark.parametrize("isolation,hook", MODES)
def test_memory_hog(isolation, hook, monkeypatch):
    # the memory limit, not the clock, must stop it: 1.5 s was too short to reach the limit with two training jobs
    # on the two cores (timed out with empty stderr once); idle it hits MemoryError in well under a second
    r = _run("chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))\n", isolation, hook, monkeypatch,
             timeout_s=10.0)
    assert "MemoryError" in r.stderr


@pytest.mark.parametrize("isolation,hook", MODES)
def test_output_flood_is_capped(isolation, hook, monkeypatch):
    r = _run("while True:\n    print('x' * 10000)\n", isolation, hook, monkeypatch)
    assert r.output_exceeded and len(r.stdout) <= sandbox.Limits().max_output_bytes


FLOODS = {
    "stderr_64k_writes": "import sys\nwhile True:\n    sys.stderr.write('x' * 65536)\n",
    "stdout_64k_writes": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "stderr_1_byte_writes": "import os\nwhile True:\n    os.write(2, b'x')\n",
}


@pytest.mark.parametrize("isolation", LEVELS)
@pytest.mark.parametrize("flood", sorted(FLOODS))
def test_a_flood_is_cut_and_killed_within_a_second(flood, isolation):
    # Was ~10 s at the namespace levels for stderr: unshare reports its child's death on stderr and blocked
    # on the pipe the flood had filled, until the teardown timeout.
    # 1-byte writes reach a 1 MiB cap in ~1M syscalls: 1.6-3.1 s on this kind of machine (idle to CI), so they get a
    # 64 KiB cap and the time left is the teardown the regression was in
    cap = 1 << 16 if "1_byte" in flood else sandbox.Limits().max_output_bytes
    r = sandbox.run_python(FLOODS[flood], timeout_s=30.0, isolation=isolation, max_output_bytes=cap)
    assert r.output_exceeded and not r.ok and not r.timed_out
    assert len(r.stdout) + len(r.stderr) <= 2 * cap
    assert r.duration_s < 1.5, r.duration_s
    assert _left_behind(r) == []


WRITES = {
    "test_dir": "open({victim!r}, 'w').write('pwned')",
    "world_writable_tmp": "open({tmp_victim!r}, 'w').write('pwned')",
    "remove": "import os\nos.remove({keep!r})",
    "rename": "import os\nos.rename({keep!r}, 'stolen')",
    "symlink": "import os\nos.symlink('/tmp', 'out')\nopen('out/' + {tmp_name!r}, 'w').write('pwned')",
    "dir_fd": "import os\nfd = os.open('/tmp', os.O_RDONLY)\n"
              "os.write(os.open({tmp_name!r}, os.O_CREAT | os.O_WRONLY, dir_fd=fd), b'pwned')",
}


@pytest.mark.parametrize("isolation,hook", MODES)
@pytest.mark.parametrize("attack", sorted(WRITES))
def test_no_writes_outside_scratch(attack, isolation, hook, monkeypatch, tmp_path):
    tmp_name = f"nc_pwned_{uuid.uuid4().hex}"
    paths = dict(victim=str(tmp_path / "pwned"), tmp_victim=f"/tmp/{tmp_name}", tmp_name=tmp_name,
                 keep=str(tmp_path / "keep"))
    (tmp_path / "keep").write_text("mine")
    try:
        r = _run(WRITES[attack].format(**paths), isolation, hook, monkeypatch)
        assert "Error" in r.stderr  # refused by the hook or by the kernel (EROFS, EACCES, ENOENT)
        assert not os.path.exists(paths["victim"]) and not os.path.exists(paths["tmp_victim"])
        assert (tmp_path / "keep").read_text() == "mine"
    finally:
        if os.path.exists(paths["tmp_victim"]):
            os.remove(paths["tmp_victim"])


@pytest.mark.parametrize("isolation,hook", MODES)
def test_no_network(isolation, hook, monkeypatch, listener):
    port = listener.getsockname()[1]
    r = _run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'pwned')\n",
             isolation, hook, monkeypatch)
    assert "PermissionError" in r.stderr or "Network is unreachable" in r.stderr, r.stderr
    with pytest.raises(BlockingIOError):  # nothing ever connected
        listener.accept()


@pytest.mark.parametrize("isolation,hook", MODES)
def test_cannot_signal_the_caller(isolation, hook, monkeypatch):
    me, group = os.getpid(), os.getpgid(0)
    r = _run(f"import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill({me}, signal.SIGKILL)\n"
             f"os.killpg({group}, signal.SIGKILL)\n", isolation, hook, monkeypatch)
    # Still here (this line runs), and the program saw its kill refused -- except where it is uid 0
    # outside too (user-ns run by root, no hook): kill(0) then reaches its own launcher, which it may kill.
    assert "PermissionError" in r.stderr or "ProcessLookupError" in r.stderr or _root_in_user_ns(isolation, hook)
    assert os.getpgid(0) == group


def test_hook_refuses_ctypes_and_escape_hatches():
    for source in ("import ctypes", "import _posixsubprocess", "import gc\ngc.get_objects()",
                   "import os\nos.chdir('/')", "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
                   "import os\nos.kill(1, 0)", "open('/proc/1/environ').read()", "import socket\nsocket.socket()",
                   "open('/proc/self/mem', 'rb')", "open('/proc/thread-self/mem', 'rb')"):
        r = sandbox.run_python(source, isolation="hook-only")
        assert not r.ok and "PermissionError: sandbox" in r.stderr, (source, r.stderr)


FRAME_ROUTES = {
    # route -> the last line of the refusal
    "import sys\nsys._getframe()": "ValueError: sandbox: no frame objects",
    "import sys\nsys._current_frames()": "PermissionError: sandbox: sys._current_frames is not allowed",
    "import sys\nsys.settrace(print)": "PermissionError: sandbox: sys.settrace is not allowed",
    "import sys\nsys.setprofile(print)": "PermissionError: sandbox: sys.setprofile is not allowed",
    "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    e.__traceback__.tb_frame":
        "PermissionError: sandbox: no frame objects",
    "def g():\n    yield\ng().gi_frame": "PermissionError: sandbox: no frame objects",
    "async def c():\n    pass\nco = c()\nco.close()\nco.cr_frame": "PermissionError: sandbox: no frame objects",
    "import signal\nsignal.signal(signal.SIGUSR1, print)": "PermissionError: sandbox: signal handlers are not allowed",
    "import _imp\n_imp.create_builtin": "AttributeError: module '_imp' has no attribute 'create_builtin'",
}


@pytest.mark.parametrize("source", list(FRAME_ROUTES))
def test_no_frame_objects_reach_the_program(source):
    # A frame leads (f_back, f_locals, f_code) to the harness's secret and the tests' expected values.
    r = sandbox.run_python(source, isolation="hook-only")
    assert not r.ok and r.stderr.strip().splitlines()[-1] == FRAME_ROUTES[source], r.stderr


def test_the_sandboxs_own_functions_are_read_only():
    # A test that hands a harness helper to the program: its defaults (what it compares with) stay put.
    source = "def leak(f):\n    f.__defaults__ = (lambda x, p, d=0: x, (('Eq', lambda a, b: True),), range, len)\n"
    tests = "try:\n    leak(_nc_compare)\nexcept PermissionError:\n    pass\nassert 1 == 2\n"
    r = sandbox.run_python(source, tests=tests, isolation="hook-only")
    assert not r.ok and r.stderr.strip().splitlines()[-1] == "AssertionError", r.stderr
    r = sandbox.run_python(source, tests=tests.replace("PermissionError", "ValueError"), isolation="hook-only")
    assert "PermissionError: sandbox: the sandbox's functions are read-only" in r.stderr, r.stderr
    r = sandbox.run_python(source, tests=tests, isolation="hook-only", audit_hook=False)
    assert r.ok  # without the hook the patch works: the refusal above is what stops it
    r = sandbox.run_python("def f():\n    return 1\nf.__defaults__ = ()\nf.__code__ = (lambda: 2).__code__\nprint(f())")
    assert (r.ok, r.stdout) == (True, "2\n")  # the program's own functions are its business


def test_stdlib_that_touches_frames_or_defaults_still_works():
    # namedtuple/TypeVar/enum/logging look at the caller's frame and accept "no frame" (ValueError);
    # namedtuple(defaults=) sets __defaults__ (dataclasses, inspect, traceback, unittest import it). The
    # stand-in _signal reports every handler as SIG_DFL (0).
    source = ("import dataclasses, inspect, traceback, unittest, signal, logging, enum, typing\n"
              "from collections import namedtuple\nP = namedtuple('P', 'x y', defaults=(2,))\n"
              "T = typing.TypeVar('T')\nE = enum.Enum('E', 'A B')\nlogging.warning('w')\n"
              "print(P(1), E.B.value, signal.SIGINT == 2, signal.getsignal(signal.SIGINT))\n")
    for isolation in LEVELS:
        r = sandbox.run_python(source, isolation=isolation)
        assert (r.ok, r.stdout, r.stderr) == (True, "P(x=1, y=2) 2 True 0\n", "WARNING:root:w\n"), r


ENV_PROBE = """
import os
seen = repr(dict(os.environ))
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            seen += open(f'/proc/{p}/environ', 'rb').read().decode('latin-1')
        except Exception:
            pass
print(seen)
assert 'hunter2' in seen
"""


@pytest.mark.parametrize("isolation,hook", MODES)
def test_cannot_read_the_callers_environment(isolation, hook):
    # The secret must be in the caller's *initial* environment (/proc/PID/environ), so the caller is a
    # fresh interpreter started with it.
    caller = (f"import json\nfrom nemocascade import sandbox\n"
              f"r = sandbox.run_python({ENV_PROBE!r}, isolation={isolation!r} or sandbox.available_isolation()[0],"
              f" audit_hook={hook})\nprint(json.dumps([r.ok, r.stdout, r.stderr]))\n")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": REPO, "NC_SANDBOX_SECRET": "hunter2"}
    out = subprocess.run([sys.executable, "-c", caller], env=env, capture_output=True, text=True, timeout=60)
    ok, stdout, stderr = json.loads(out.stdout)
    assert ok is False and "hunter2" not in stdout + stderr and "'PATH': '/usr/bin:/bin'" in stdout


# ------------------------------------------------------------------------------------ reward + pool

def _completion(code: str) -> str:
    return f"<think>\nplan\n</think>\n```python\n{code}```"


ANSWER = json.dumps({"tests": "assert f(2) == 5\nassert f(0) == 3\n", "entry_point": "f"})


def test_score_extracts_the_last_python_block_of_the_final_text():
    good, bad = "def f(x):\n    return x + 3\n", "def f(x):\n    return x\n"
    assert code_reward.score(_completion(good), ANSWER) == 1.0
    assert code_reward.score(_completion(bad), ANSWER) == 0.0
    assert code_reward.score(f"<think>\n</think>\n```python\n{bad}```\nbetter:\n```py\n{good}```", ANSWER) == 1.0
    assert code_reward.score(f"<think>\n</think>\n```python\n{good}```\n```python\n{bad}```", ANSWER) == 0.0
    assert code_reward.score(f"<think>\n</think>\n{good}", ANSWER) == 1.0  # no fence: the whole final text
    assert code_reward.score(f"<think>\n```python\n{good}```", ANSWER) == 0.0  # think never closed
    assert code_reward.score(f"<think>\n```python\n{good}```\n</think>\nno code", ANSWER) == 0.0
    # HumanEval style: the answer's prompt goes first, so a bare body completes it.
    he = json.dumps({"tests": "assert f(2) == 5\n", "entry_point": "f", "prompt": "def f(x):\n    '''x+3'''\n"})
    assert code_reward.score(_completion("    return x + 3\n"), he) == 1.0
    assert code_reward.score(_completion(good), he) == 1.0
    for answer in ("not json", "{}", json.dumps({"tests": 3}), None):
        assert code_reward.score(_completion(good), answer) == 0.0


def test_score_inside_verifier_pool_workers():
    hang = "import time\ntime.sleep(60)\n"
    items = [(_completion("def f(x):\n    return x + 3\n"), ANSWER), (_completion("def f(x):\n    return x\n"), ANSWER),
             (_completion(hang), ANSWER), (_completion("import os\nos.fork()\n"), ANSWER), ("garbage", "not json")]
    with VerifierPool(num_workers=2, timeout_s=code_reward.SCORE_TIMEOUT_S + 5.0) as pool:
        assert pool.score(code_reward.score, items) == [1.0, 0.0, 0.0, 0.0, 0.0]


def _descendants(root: int) -> set[int]:
    procs, found, todo = _procs(), set(), [root]
    while todo:
        parent = todo.pop()
        kids = [pid for pid, p in procs.items() if p[1] == parent and pid not in found]
        found.update(kids)
        todo += kids
    return found


@pytest.mark.skipif(sandbox._tool("setpriv") is None, reason="parent-death signal needs setpriv (util-linux)")
def test_sandbox_dies_with_a_pool_worker_killed_for_its_timeout():
    with VerifierPool(num_workers=1, timeout_s=2.0) as pool:
        worker = pool.worker_pids[0]
        out, spawned = [], set()
        t = threading.Thread(target=lambda: out.append(
            pool.score(code_reward.score, [(_completion("import time\ntime.sleep(60)\n"), ANSWER)])))
        t.start()
        while t.is_alive():
            spawned |= _descendants(worker)
            time.sleep(0.05)
        assert out == [[0.0]] and worker not in pool.worker_pids
    assert spawned  # the sandbox was seen running under the worker
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        running = [pid for pid, p in _procs().items() if pid in spawned and p[0] != "Z"]
        if not running:
            break
        time.sleep(0.1)
    assert running == []
