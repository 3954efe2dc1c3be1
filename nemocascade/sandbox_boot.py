"""What runs inside the sandbox's Python process: rlimits, the audit hook and the test harness.

:mod:`nemocascade.sandbox` starts ``python -I -S -B -c <this file's source> program cpu_s mem_bytes nproc
fsize nofile hook harness`` in the scratch directory (importing this module elsewhere runs nothing).
:func:`_boot` sets the limits, installs the audit hook, closes the routes to frame objects, then runs the
program. What the hook refuses and why: the sandbox's module docstring.

Harness mode (``harness=1``). Before any program code runs:

1. the parent's payload is read from stdin to EOF: a per-run secret (hex, one line), then the trusted test
   source; stdin is then /dev/null. The secret stays a local of :func:`_boot` and :func:`_run_with_tests`,
   never a global, an attribute or a default;
2. the tests are rewritten to strict checks (:func:`_compile_tests`); the builtins are copied, and so are the
   modules the tests import, or made afresh (:func:`_snapshot_modules`).

Then the program runs as module ``solution`` (so an ``if __name__ == "__main__":`` block does not run, as
in HumanEval's own harness), and the tests run in a namespace of their own: the program's globals minus
dunders and names of builtins, the pristine builtins (``abs`` strict, ``map``/``filter`` as generators so
a StopIteration raised by the program cannot end a test's loop early), those modules, the strict
helpers. Only after the tests returned does the harness write ``\\n<secret> PASS\\n`` to fd 1 and
``_exit(0)``; any exception, ``SystemExit`` included, ends the run with ``_exit(1)`` and no secret (the
parent's check: ``sandbox._run``).

Not closed: the program can still reach classes through ``object.__subclasses__()`` and change their
methods (``_random.Random.__subclasses__()`` includes the tests' fresh ``random.Random``), and so the
globals of those methods' module (``string.Formatter.format.__globals__`` is the fresh ``string``'s);
a package (``collections``, ``re``, ``json``) is copied one level deep only, so its functions still read
the real package's globals; and a fresh module's own imports are the real, shared modules.

Strict checks: in the tests (never the program), every ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``,
``in``, ``not in``, every arithmetic or unary operator, the truth of ``assert``/``if``/``while``/
``not``/``and``/``or``/comprehension conditions become calls of helpers that first turn each operand
into a plain value (:func:`_plain`: int, float, complex, bool, str, bytes, None, list, tuple, dict, set,
frozenset, recursively, or a builtin type object) and then apply the builtin operator. A subclass of a
builtin becomes its builtin value, read by the base type's own method (its ``__eq__``/``__bool__`` are
never called); any other object is a TypeError, i.e. a failed test. All operands of a chained comparison
are evaluated before the first comparison. ``is``/``is not`` and augmented assignments are left alone.

Discipline that keeps the secret and the helpers out of the program's hands (it can reach this module's
globals, e.g. through ``object.__subclasses__()``): after the program starts, no code here reads a
global name; everything it needs is a positional default bound when the function was defined (the hook
refuses replacing ``__code__``/``__defaults__``), and defaults hold no mutable container.
"""

import sys

import _operator
import posix

_COMPARE = (("Eq", _operator.eq), ("NotEq", _operator.ne), ("Lt", _operator.lt), ("LtE", _operator.le),
            ("Gt", _operator.gt), ("GtE", _operator.ge), ("In", lambda a, b: a in b),
            ("NotIn", lambda a, b: a not in b))
_BINARY = (("Add", _operator.add), ("Sub", _operator.sub), ("Mult", _operator.mul), ("Div", _operator.truediv),
           ("FloorDiv", _operator.floordiv), ("Mod", _operator.mod), ("Pow", _operator.pow),
           ("LShift", _operator.lshift), ("RShift", _operator.rshift), ("BitOr", _operator.or_),
           ("BitXor", _operator.xor), ("BitAnd", _operator.and_), ("MatMult", _operator.matmul))
_UNARY = (("USub", _operator.neg), ("UAdd", _operator.pos), ("Invert", _operator.invert))
_FRAME_ATTRS = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"))


# ------------------------------------------------------------------------------------------ the hook
def _install_hook():
    import _stat
    import types  # noqa: F401  imported now: its import reads a traceback's tb_frame, which the hook refuses

    # Everything the hook uses is bound as a positional default: no global or builtin name lookups
    # (the program could rebind those), no closure cells (writable through ``cell_contents``), no
    # mutable containers (``own`` is only compared by identity), and replacing ``__code__``/``__defaults__``
    # of this module's functions (``__globals__`` is ``own``) is refused. Other functions' are the
    # program's business (``collections.namedtuple`` sets ``__new__.__defaults__``).
    def hook(event, args, home=posix.getcwd(), readlink=posix.readlink, lstat=posix.lstat,
             getcwd=posix.getcwd, getpid=posix.getpid, is_dir_mode=_stat.S_ISDIR, item=tuple.__getitem__,
             type=type, str=str, bytes=bytes, int=int, OSError=OSError, Denied=PermissionError,
             NoFrame=ValueError, function=type(_install_hook), own=globals(), frame_attrs=_FRAME_ATTRS,
             write_flags=posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND,
             refused=frozenset((
                 "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
                 "os.startfile", "subprocess.Popen", "os.killpg", "os.link", "os.symlink", "os.chdir",
                 "resource.setrlimit", "resource.prlimit", "gc.get_objects", "gc.get_referrers",
                 "gc.get_referents", "code.__new__", "cpython.PyInterpreterState_New", "sys.remote_exec",
                 "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
                 "sys.addaudithook")),
             refused_prefixes=("socket.", "ctypes.", "syslog.", "sqlite3.", "_posixshmem."),
             refused_modules=frozenset((
                 "_posixsubprocess", "_ctypes", "ctypes", "_sqlite3", "_dbm", "_gdbm", "_posixshmem",
                 "_multiprocessing", "_testcapi", "_testinternalcapi", "_xxsubinterpreters",
                 "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues")),
             memory=frozenset(("/proc/kcore", "/dev/mem", "/dev/kmem", "/dev/port")),
             path_events=frozenset((
                 "os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.utime", "os.mkfifo",
                 "os.mknod", "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags")),
             code_attrs=("__code__", "__defaults__", "__kwdefaults__")):
        if event in refused or event.startswith(refused_prefixes):
            raise Denied("sandbox: " + event + " is not allowed")
        if event == "sys._getframe":  # ValueError, as for a stack too shallow: what stdlib callers expect
            raise NoFrame("sandbox: no frame objects")
        if event == "object.__getattr__":
            if type(args[1]) is not str or args[1] in frame_attrs:
                raise Denied("sandbox: no frame objects")
            return
        if event == "import":
            if type(args[0]) is not str or args[0].split(".")[0] in refused_modules:
                raise Denied("sandbox: this module is not allowed")
            return
        if event == "object.__setattr__":
            if type(args[0]) is function and args[0].__globals__ is own and (
                    type(args[1]) is not str or args[1] in code_attrs):
                raise Denied("sandbox: the sandbox's functions are read-only")
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
            # ".." is resolved here by name, by the kernel through the directory it is in: a thread that
            # moves that directory up (a rename inside the scratch directory) while the kernel walks below
            # it sends the remaining ".." steps out of it ("a/b/c/../../../proc/self/mem" reads memory).
            # So no ".." may leave a directory the program can move: none after a name in a relative path
            # (the kernel may start from a dir_fd inside the scratch directory, which this hook never
            # sees), none out of a directory below the scratch directory in any path.
            if not text.startswith("/"):
                named = False
                for part in text.split("/"):
                    if part == "..":
                        if named:
                            raise Denied("sandbox: no '..' after a directory name: " + text)
                    elif part != "" and part != ".":
                        named = True
            # Resolve like the kernel will: absolute, every existing symlink followed.
            todo, done, hops = (text if text.startswith("/") else getcwd() + "/" + text).split("/"), [], 0
            todo.reverse()
            while todo:
                part = todo.pop()
                if part == "" or part == ".":
                    continue
                if part == "..":
                    if ("/" + "/".join(done)).startswith(home + "/"):
                        raise Denied("sandbox: no '..' out of a directory below the scratch directory: " + text)
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
                if real.endswith("/mem"):  # its own memory holds the harness's secret and the tests
                    raise Denied("sandbox: no reading process memory: " + text)
            if real in memory:
                raise Denied("sandbox: no reading memory devices: " + text)
            try:
                is_dir = is_dir_mode(item(lstat(real), 0))
            except OSError:
                is_dir = False
            if is_dir:  # a directory fd outside the scratch dir would let dir_fd= escape these checks
                raise Denied("sandbox: no directory handles outside the scratch directory: " + text)

    sys.addaudithook(hook)


def _close_signal_handlers():
    """A Python signal handler receives the interrupted frame, and ``frame.f_back`` (no audit event) leads
    to the tests' frames and the harness's. ``signal.signal`` raises no audit event either, so ``_signal``
    is replaced by a module with its constants and functions that refuse; and since ``_imp.create_builtin``
    (no audit event) could build a fresh ``_signal``, every other builtin module is imported now and that
    function removed. ``import signal`` keeps working (asyncio, unittest import it)."""
    import _imp

    real = sys.modules.pop("_signal", None)
    for name in sys.builtin_module_names:
        if name != "_signal" and name not in sys.modules:
            try:
                __import__(name)
            except Exception:  # refused by the hook
                pass
    del _imp.create_builtin
    stand_ins = {"Denied": PermissionError}  # their own globals: not this module's
    exec("def refused(*args, **kwargs):\n    raise Denied('sandbox: signal handlers are not allowed')\n"
         "def getsignal(signalnum):\n    return 0\n", stand_ins)  # 0 = SIG_DFL
    fake = type(sys)("_signal")
    for name, value in (real.__dict__.items() if real is not None else ()):
        if type(value) is int or type(value) is type:
            setattr(fake, name, value)
        elif not name.startswith("__"):
            setattr(fake, name, stand_ins["refused"])
    fake.getsignal = stand_ins["getsignal"]
    sys.modules["_signal"] = fake


def _close_gc_garbage():
    """With ``gc.DEBUG_SAVEALL`` the collector hands every piece of cyclic garbage to the program in
    ``gc.garbage``, frame objects included (no audit event): a frame caught in a cycle with its own
    exception leads through ``f_back`` (itself no audit event) to the tests' frames and the harness's, so
    to their constants and the secret. ``gc.set_debug`` raises no audit event either, so it is replaced in
    the one ``gc`` module (multi-phase init: no cached copy of its functions, and ``_imp.create_builtin`` is
    gone) by a stand-in that refuses any flag; nothing else puts collectable objects in ``gc.garbage``."""
    import gc

    stand_ins = {"Denied": PermissionError}  # their own globals: not this module's
    exec("def set_debug(flags):\n    if flags:\n        raise Denied('sandbox: gc.set_debug is not allowed')\n",
         stand_ins)
    gc.set_debug(0)
    gc.set_debug = stand_ins["set_debug"]


# -------------------------------------------------------------------------------- the strict checks
def _plain(x, plain, depth=0, type=type, issubclass=issubclass, TypeError=TypeError, NoneType=type(None),
           int=int, float=float, complex=complex, bool=bool, str=str, bytes=bytes, list=list, tuple=tuple,
           dict=dict, set=set, frozenset=frozenset, items=dict.items,
           builtin_types=(int, float, complex, bool, str, bytes, list, tuple, dict, set, frozenset, type(None)),
           readers=((int, int.__int__), (float, float.__float__), (complex, complex.__complex__),
                    (str, str.__str__), (bytes, bytes.__bytes__), (list, list.copy),
                    (tuple, lambda t, get=tuple.__getitem__, whole=slice(None): get(t, whole)), (dict, dict.copy),
                    (set, set.copy), (frozenset, frozenset.copy))):
    """``x`` as a plain value (module docstring), rebuilt from builtin parts; TypeError for anything else.
    ``plain`` is this function (passed in: a global lookup could find the program's replacement)."""
    t = type(x)
    if t is int or t is str or t is float or t is bool or t is NoneType or t is bytes or t is complex:
        return x
    if depth > 64:
        raise TypeError("sandbox: value nested too deeply to compare")
    if t is list:
        return [plain(v, plain, depth + 1) for v in x]
    if t is tuple:
        return tuple([plain(v, plain, depth + 1) for v in x])
    if t is dict:
        return {plain(k, plain, depth + 1): plain(v, plain, depth + 1) for k, v in items(x)}
    if t is set:
        return {plain(v, plain, depth + 1) for v in x}
    if t is frozenset:
        return frozenset([plain(v, plain, depth + 1) for v in x])
    if t is type:
        for each in builtin_types:
            if x is each:
                return x
    for base, read in readers:
        if issubclass(t, base):  # its builtin value; the subclass's own methods are never called
            return plain(read(x), plain, depth + 1)
    raise TypeError("sandbox: the tests compare plain values only (int, float, str, list, dict, ...)")


def _compare(operands, ops, plain=_plain, table=_COMPARE, range=range, len=len):
    """``operands[0] ops[0] operands[1] ops[1] ...`` (ast operator names) on plain values."""
    for i in range(len(ops)):
        a, b, op = operands[i], operands[i + 1], ops[i]
        if op == "Is":
            result = a is b
        elif op == "IsNot":
            result = a is not b
        else:
            a, b = plain(a, plain), plain(b, plain)
            for name, fn in table:
                if name == op:
                    result = fn(a, b)
        if not result:
            return False
    return True


def _binary(a, op, b, plain=_plain, table=_BINARY):
    a, b = plain(a, plain), plain(b, plain)
    for name, fn in table:
        if name == op:
            return fn(a, b)


def _unary(op, a, plain=_plain, table=_UNARY):
    a = plain(a, plain)
    for name, fn in table:
        if name == op:
            return fn(a)


def _truth(x, plain=_plain, bool=bool):
    return bool(plain(x, plain))


def _plain_value(x, plain=_plain):
    return plain(x, plain)


def _strict_abs(x, plain=_plain, abs=abs):
    return abs(plain(x, plain))


def _lazy_map(function, iterable, *iterables, zip=zip):
    """``map`` as a generator: a StopIteration raised by ``function`` is a RuntimeError (PEP 479), not the
    silent end of the iteration that would let ``all(map(candidate, cases))`` pass."""
    for args in zip(iterable, *iterables):
        yield function(*args)


def _lazy_filter(function, iterable, truth=_truth):
    for x in iterable:
        if truth(x if function is None else function(x)):
            yield x


_HELPERS = (("_nc_compare", _compare), ("_nc_binary", _binary), ("_nc_unary", _unary), ("_nc_truth", _truth),
            ("_nc_plain", _plain_value))


def _compile_tests(source: str):
    """(code object, names of the modules they import) of the trusted tests, rewritten to strict checks."""
    import ast

    def call(name, *args):
        return ast.Call(ast.Name(name, ast.Load()), list(args), [])

    def literal(node):
        return isinstance(node, ast.Constant)

    class Strict(ast.NodeTransformer):
        def visit_Compare(self, node):
            self.generic_visit(node)
            names = tuple(type(op).__name__ for op in node.ops)
            if all(n in ("Is", "IsNot") for n in names):
                return node
            return call("_nc_compare", ast.Tuple([node.left, *node.comparators], ast.Load()), ast.Constant(names))

        def visit_BinOp(self, node):
            self.generic_visit(node)
            if literal(node.left) and literal(node.right):
                return node
            return call("_nc_binary", node.left, ast.Constant(type(node.op).__name__), node.right)

        def visit_UnaryOp(self, node):
            self.generic_visit(node)
            if isinstance(node.op, ast.Not):
                node.operand = call("_nc_truth", node.operand)
                return node
            return node if literal(node.operand) else call("_nc_unary", ast.Constant(type(node.op).__name__),
                                                           node.operand)

        def visit_BoolOp(self, node):
            self.generic_visit(node)
            node.values[:-1] = [call("_nc_plain", v) for v in node.values[:-1]]
            return node

        def visit_test(self, node):
            self.generic_visit(node)
            node.test = call("_nc_truth", node.test)
            return node

        visit_Assert = visit_If = visit_While = visit_IfExp = visit_test

        def visit_comprehension(self, node):
            self.generic_visit(node)
            node.ifs = [call("_nc_truth", c) for c in node.ifs]
            return node

    tree = Strict().visit(ast.parse(source, "<tests>"))
    modules = set()
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        for name in names:
            parts = name.split(".")
            modules.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return compile(ast.fix_missing_locations(tree), "<tests>", "exec"), sorted(modules)


# ---------------------------------------------------------------------------------------- the harness
def _snapshot_modules(names, pristine):
    """name -> the module the tests' ``import`` gets, made before the program runs: a fresh instance of a
    plain-Python, non-package module (its own globals, tables and hidden state: ``random``'s generator,
    ``copy``'s dispatch table) with builtins of its own (a copy of ``pristine``: its functions look names
    like ``len``/``type`` up there at call time, and the program may rebind them in ``builtins``), else a
    copy of the namespace of the module as imported now."""
    import importlib.util
    from types import MappingProxyType

    copies = {}
    for name in names:  # sorted: parents first
        try:
            __import__(name)
            spec = sys.modules[name].__spec__
            if spec.origin and spec.origin.endswith(".py") and spec.submodule_search_locations is None:
                copy = importlib.util.module_from_spec(spec)
                copy.__dict__["__builtins__"] = dict(pristine)
                spec.loader.exec_module(copy)
            else:
                copy = type(sys)(name)
                copy.__dict__.update(sys.modules[name].__dict__)
        except Exception:  # a refused or missing module: the tests' own import will fail the run
            continue
        copies[name] = copy
        parent, _, child = name.rpartition(".")
        if parent in copies:
            setattr(copies[parent], child, copy)
    return MappingProxyType(copies)


def _import(copies, real_import, name, globals=None, locals=None, fromlist=(), level=0):
    """The tests' ``__import__``: the module copies first."""
    if level == 0 and name in copies:
        top = name if fromlist else name.partition(".")[0]
        if top in copies:
            return copies[top]
    return real_import(name, globals, locals, fromlist, level)


def _read_payload():
    """(secret, test source) from stdin, read to EOF; stdin becomes /dev/null."""
    chunks = []
    while chunk := posix.read(0, 1 << 16):
        chunks.append(chunk)
    devnull = posix.open("/dev/null", posix.O_RDONLY)
    posix.dup2(devnull, 0)
    posix.close(devnull)
    secret, _, tests = b"".join(chunks).partition(b"\n")
    return secret, tests.decode("utf-8", "replace")


def _run_with_tests(program, tests, secret, exec=exec, type=type, str=str, items=dict.items,
                    BaseException=BaseException, SystemExit=SystemExit, write=posix.write, _exit=posix._exit,
                    excepthook=sys.excepthook, flushes=(sys.stdout.flush, sys.stderr.flush)):
    """Run ``program`` then ``tests`` (module docstring); write the verdict only if both returned. Never returns."""
    import builtins
    from functools import partial

    code, modules = _compile_tests(tests)
    pristine = dict(builtins.__dict__)
    test_builtins = dict(pristine, abs=_strict_abs, map=_lazy_map, filter=_lazy_filter,
                         __import__=partial(_import, _snapshot_modules(modules, pristine), pristine["__import__"]))
    extras = dict(_HELPERS, __builtins__=test_builtins, __name__="__tests__")
    solution = type(sys)("solution")
    solution.__dict__.update(__builtins__=builtins, __file__="program.py")
    main = solution.__dict__
    sys.modules["__main__"] = sys.modules["solution"] = solution
    sys.argv[:] = ["program.py"]
    # From here on: locals and defaults only (module docstring).
    try:
        exec(program, main)
        namespace = {k: v for k, v in items(main) if type(k) is str and k[:2] != "__" and k not in pristine}
        namespace.update(extras)
        exec(code, namespace)
    except BaseException as e:
        if type(e) is SystemExit:
            write(2, b"sandbox: the program exited (SystemExit) before its tests passed\n")
        try:
            excepthook(type(e), e, e.__traceback__)
        except BaseException:
            pass
        _exit(1)
    try:
        for flush in flushes:
            try:
                flush()
            except BaseException:
                pass
        verdict = b"\n" + secret + b" PASS\n"
        while verdict:
            verdict = verdict[write(1, verdict):]
    except BaseException:
        _exit(1)
    _exit(0)


def _boot():
    import resource
    program = sys.argv[1]
    cpu_s, mem, nproc, fsize, nofile, hook, harness = (int(x) for x in sys.argv[2:9])
    for what, soft, hard in ((resource.RLIMIT_CPU, cpu_s, cpu_s), (resource.RLIMIT_AS, mem, mem),
                             (resource.RLIMIT_NPROC, nproc, nproc), (resource.RLIMIT_FSIZE, fsize, fsize),
                             (resource.RLIMIT_NOFILE, nofile, nofile), (resource.RLIMIT_CORE, 0, 0)):
        cap = resource.getrlimit(what)[1]
        if cap != resource.RLIM_INFINITY:
            soft, hard = min(soft, cap), min(hard, cap)
        resource.setrlimit(what, (soft, hard))
    secret, tests = _read_payload() if harness else (None, None)
    with open(program, "rb") as f:
        code = compile(f.read(), "program.py", "exec")
    if hook:
        _install_hook()  # cwd is the scratch directory: the hook takes it as home
        _close_signal_handlers()
        _close_gc_garbage()
    if harness:
        _run_with_tests(code, tests, secret)
    main = type(sys)("__main__")
    main.__dict__.update(__builtins__=__builtins__, __file__="program.py")
    sys.modules["__main__"] = main
    sys.argv[:] = ["program.py"]
    exec(code, main.__dict__)


if __name__ == "__main__":
    _boot()
