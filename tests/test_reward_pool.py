"""VerifierPool: order, timeouts that kill and replace workers, raising and crashing calls -> 0.0 and
counted in ``last_stats``; inline (``num_workers=0``) the same timeout holds in-process.

Stdlib callables stand in for most verifiers (time.sleep hangs, math.sqrt(-1) raises, os._exit crashes).
One pool serves the whole file because spawning workers costs an interpreter start each.
"""

import importlib.util
import math
import operator
import os
import signal
import sys
import threading
import time
import types

import pytest

from nemocascade.rewards import math as math_reward
from nemocascade.rewards import pool as pool_module
from nemocascade.rewards.pool import VerifierPool


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(num_workers=2, timeout_s=1.0) as p:
        yield p


def sleep_then(seconds: float, value: float) -> float:
    """A verifier that takes ``seconds`` and answers ``value`` (workers import it from this module)."""
    time.sleep(seconds)
    return value


def loop_forever(*args) -> float:
    while True:
        pass


def swallows_timeout() -> float:
    """A verifier that catches everything, the interruption included, and answers late."""
    try:
        loop_forever()
    except BaseException:
        return 1.0


def counts(timeouts=0, errors=0, crashes=0) -> dict:
    return {"timeouts": timeouts, "errors": errors, "crashes": crashes}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_results_follow_item_order(pool):
    items = [(i, 0.5) for i in range(25)]
    assert pool.score(operator.add, items) == [i + 0.5 for i in range(25)]
    assert pool.last_stats == counts()
    assert pool.score(operator.add, []) == []


def test_hung_call_times_out_and_worker_is_replaced(pool):
    before = pool.worker_pids
    # Both workers hang: both are killed (and reaped) and two fresh ones take their place.
    out = pool.score(time.sleep, [(3600,), (3600,)], timeout_s=0.3)
    assert out == [0.0, 0.0] and pool.last_stats == counts(timeouts=2)
    after = pool.worker_pids
    assert len(after) == 2 and not set(before) & set(after)
    assert not any(_alive(pid) for pid in before)  # killed and reaped, not left running
    assert pool.score(operator.mul, [(2, 3), (4, 5), (6, 7)]) == [6.0, 20.0, 42.0]


def test_hang_in_the_middle_of_a_batch(pool):
    # The limit is loose because a replacement worker first imports this test module (and pytest).
    items = [(0, 1.0), (3600, 2.0), (0, 3.0), (0, 4.0), (0, 5.0)]
    assert pool.score(sleep_then, items, timeout_s=2.0) == [1.0, 0.0, 3.0, 4.0, 5.0]
    assert pool.last_stats == counts(timeouts=1)
    assert pool.score(sleep_then, [(0, 7.0), (0, 8.0)]) == [7.0, 8.0]


def test_raising_and_non_numeric_calls_score_zero(pool):
    assert pool.score(math.sqrt, [(4,), (-1,), (9,)]) == [2.0, 0.0, 3.0]
    assert pool.last_stats == counts(errors=1)
    assert pool.score(operator.truediv, [(1, 0), (3, 2)]) == [0.0, 1.5]
    assert pool.score(str, [("x",), ("2.5",)]) == [0.0, 2.5]  # float("x") fails
    assert pool.last_stats == counts(errors=1)
    assert pool.score(time.sleep, [(0,)]) == [0.0]  # returns None: float(None) fails
    assert pool.last_stats == counts(errors=1)


def test_crashing_call_scores_zero_and_worker_is_replaced(pool):
    before = pool.worker_pids
    assert pool.score(os._exit, [(3,)]) == [0.0]
    assert pool.last_stats == counts(crashes=1)
    assert len(set(before) - set(pool.worker_pids)) == 1
    assert pool.score(operator.sub, [(5, 1), (7, 2)]) == [4.0, 5.0]


def test_math_reward_through_pool(pool):
    items = [(r"\boxed{\sqrt{12}}", r"2\sqrt{3}"), (r"\boxed{71}", "17"), (r"<think>\boxed{3}", "3"),
             (r"</think>\boxed{\dfrac34}", "0.75")]
    # the claim is what the verifier answers through the pool, not how fast: under CI's load sympy's first
    # simplification ran past the fixture's 1 s and scored 0 (a counted timeout, as the stats check)
    assert pool.score(math_reward.score, items, timeout_s=60.0) == [1.0, 0.0, 0.0, 1.0]
    assert pool.last_stats == counts()


def test_bad_fn_and_items_are_reported(pool):
    with pytest.raises(TypeError, match="picklable"):
        pool.score(lambda x: x, [(1,)])
    with pytest.raises(TypeError, match=r"items\[1\]"):
        pool.score(abs, [(1,), 2])
    # An item whose args cannot be pickled scores 0.0; the others still run.
    assert pool.score(len, [("ab",), (lambda: 0,), ("abc",)]) == [2.0, 0.0, 3.0]
    assert pool.last_stats == counts(errors=1)


def test_fn_that_workers_cannot_import_raises_and_pool_survives(pool):
    # Pickles here (the module is in this process's sys.modules), fails to load in a fresh worker:
    # a setup error that would otherwise silently score every rollout 0.
    ghost = types.ModuleType("ghost_verifiers")
    exec("def always_one(*args):\n    return 1.0", ghost.__dict__)
    sys.modules["ghost_verifiers"] = ghost
    try:
        with pytest.raises(RuntimeError, match="ghost_verifiers"):
            pool.score(ghost.always_one, [(1,), (2,), (3,)])
    finally:
        del sys.modules["ghost_verifiers"]
    assert pool.score(operator.add, [(1, 1), (2, 2), (3, 3)]) == [2.0, 4.0, 6.0]


def _load_by_path(path, name):
    """What configs.load and ml_collections do to a config file: run it under a name no fresh interpreter can
    import (ml_collections also puts it in sys.modules)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def test_a_verifier_defined_in_a_file_loaded_by_path_scores_in_workers(tmp_path):
    # a config file that registers a domain's verifier (README "A new domain and its verifier"); its folder's own
    # modules import
    (tmp_path / "_helper.py").write_text("BONUS = 1.0\n")
    (tmp_path / "my_config.py").write_text(
        "import functools\nfrom _helper import BONUS\n"
        "def wrap(f):\n    @functools.wraps(f)\n    def g(*a):\n        return f(*a)\n    return g\n"
        "@wrap\ndef score(text, answer):\n    return BONUS if text == answer else 0.0\n")
    sys.path.append(str(tmp_path))
    try:
        module = _load_by_path(str(tmp_path / "my_config.py"), "config_config_test")
        assert pool_module.portable(module.score) is not module.score  # travels as (file, name)
        with VerifierPool(num_workers=2, timeout_s=2.0) as p:
            assert p.score(module.score, [("a", "a"), ("a", "b"), ("c", "c")]) == [1.0, 0.0, 1.0]
            assert p.last_stats == counts()
    finally:
        sys.path.remove(str(tmp_path))
        del sys.modules["config_config_test"]
    assert pool_module.portable(math_reward.score) is math_reward.score  # importable by name: unchanged


def test_loading_a_verifier_does_not_count_against_its_timeout(tmp_path):
    # the module takes 1.5 s to import, each call is instant: with a 0.5 s limit nothing may time out
    (tmp_path / "slow_import_verifier.py").write_text(
        "import time\ntime.sleep(1.5)\ndef score(x):\n    return 2.0 * x\n")
    module = _load_by_path(str(tmp_path / "slow_import_verifier.py"), "slow_import_config")
    try:
        with VerifierPool(num_workers=2, timeout_s=0.5) as p:
            assert p.score(module.score, [(1,), (2,), (3,), (4,)]) == [2.0, 4.0, 6.0, 8.0]
            assert p.last_stats == counts()
            assert p.score(sleep_then, [(1.0, 1.0), (0.0, 2.0)]) == [0.0, 2.0]  # a slow call still times out
            assert p.last_stats == counts(timeouts=1)
    finally:
        del sys.modules["slow_import_config"]


def test_inline_mode_never_raises():
    with VerifierPool(num_workers=0) as inline:
        assert inline.worker_pids == []
        assert inline.score(math.sqrt, [(16,), (-1,)]) == [4.0, 0.0]
        assert inline.last_stats == counts(errors=1)
        assert inline.score(lambda s: len(s), [("abcd",)]) == [4.0]  # no pickling inline
        assert inline.last_stats == counts()


def test_inline_timeout_holds_in_process():
    handler = signal.getsignal(signal.SIGALRM)
    with VerifierPool(num_workers=0, timeout_s=0.5) as inline:
        for fn, items in [(loop_forever, [()]), (time.sleep, [(3600,)]), (swallows_timeout, [()])]:
            start = time.monotonic()
            assert inline.score(fn, items) == [0.0], fn
            assert time.monotonic() - start < 1.0 and inline.last_stats == counts(timeouts=1), fn
        assert inline.score(operator.add, [(1, 2), (3, 4)]) == [3.0, 7.0]
        assert inline.last_stats == counts()
        start = time.monotonic()
        assert inline.score(loop_forever, [(), ()], timeout_s=0.2) == [0.0, 0.0]
        assert time.monotonic() - start < 0.9 and inline.last_stats == counts(timeouts=2)
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_inline_timeout_holds_off_the_main_thread():
    # No signals there: an asynchronous exception interrupts the (pure-Python) call instead.
    out = []
    with VerifierPool(num_workers=0, timeout_s=0.5) as inline:
        start = time.monotonic()
        worker = threading.Thread(target=lambda: out.append(inline.score(loop_forever, [(), ()])))
        worker.start()
        worker.join(5.0)
        assert out == [[0.0, 0.0]] and time.monotonic() - start < 1.5
        assert inline.last_stats == counts(timeouts=2)


def test_invalid_construction_and_use_after_close():
    with pytest.raises(ValueError, match="num_workers"):
        VerifierPool(num_workers=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        VerifierPool(num_workers=0, timeout_s=0)
    p = VerifierPool(num_workers=0)
    p.close()
    p.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        p.score(abs, [(1,)])
