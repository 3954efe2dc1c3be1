"""Shared test helpers."""
import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# One persistent XLA compilation cache for the suite: its workers and the CLI runs they start (which inherit the
# environment) compile the same tiny-model programs many times over. Set before any test imports jax; a
# JAX_COMPILATION_CACHE_DIR of your own wins.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "nemocascade-tests-xla-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# With libtpu installed (the [tpu] extra; tests/test_tpu_compile.py), every worker loads it, and without this the
# ones after the first cannot take libtpu's lockfile ("Internal error when accessing libtpu multi-process lockfile")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

# The longest files first (measured 2026-12-07, seconds of one worker): a worker takes a whole file (--dist
# loadfile, pytest.ini), so a long one started last sets when the suite ends. xdist's own order (most tests first,
# turned off in pytest.ini) had put the single-test end-to-end files last.
LONGEST_FIRST = ("test_cascade_math_tiny.py", "test_objectives.py", "test_cascade_driver.py", "test_sharding.py",
                 "test_grpo.py", "test_model.py", "test_reliability.py", "test_notebooks.py", "test_episodes.py",
                 "test_reward_model.py", "test_lora.py", "test_extension.py", "test_moe.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture
def run_cli():
    """`run_cli(spec, workdir, *flags, timeout=900, check=True)`: `experiments/run.py --config=spec
    --workdir=workdir *flags` in a fresh interpreter from the repository root, as a user runs it; with `check`, a
    non-zero exit fails the test with the tail of its output."""
    def run(spec, workdir, *flags, timeout=900, check=True):
        cmd = [sys.executable, "experiments/run.py", f"--config={spec}", f"--workdir={workdir}", *flags]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc
    return run


def tiny_math_config(spec, tmp_path):
    """Config `spec` (a math config's `tiny` variant) shrunk to seconds: a 1-layer d=32 model, 256 examples, inline
    verifiers, data and tokenizer under `tmp_path` (shared by every run of a test, so they are built once)."""
    from nemocascade import configs

    cfg = configs.load(spec)
    cfg.data.data_dir = str(tmp_path / "data")
    cfg.tokenizer.path = str(tmp_path / "tok" / "t.model")
    cfg.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)
    cfg.data.domains.math.update(num_train=256, num_test=8)
    cfg.eval.update(n=8, batch_size=8, max_new_tokens=24)
    cfg.reward.num_workers = 0
    return cfg


def tiny_sft_config(tmp_path, steps=6):
    """sft_math:tiny through `tiny_math_config`, `steps` SFT steps of 4 x 96 tokens."""
    cfg = tiny_math_config("sft_math:tiny", tmp_path)
    cfg.stages.sft.update(steps=steps, batch_size=4, seq_len=96, checkpoint_every=4, eval_every=0)
    return cfg


def final_params(workdir, stage):
    """The params a finished stage saved (`checkpoints/final/<stage>`), as numpy arrays."""
    from nemocascade import checkpoint

    with checkpoint.ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(os.path.join(workdir, "checkpoints", "final", stage))



def distinct_items(cfg, domain, split, n):
    """How many items an evaluation of `n` scores: `n`, or every distinct problem (`domains.problem_key`) of the
    split when it holds fewer, from the generator itself (the data the run builds: `generate_split` with the run's
    seed and options); what `n` in summary.json must count."""
    from nemocascade.data import domains

    dc = cfg.data.domains[domain]
    size = dc.num_test if split == "test" else (dc.get("num_val") or dc.num_test)
    records = domains.generate_split(domain, split, size, cfg.seed, **dc.opts.to_dict())
    return min(n, len({domains.problem_key(r) for r in records}))
