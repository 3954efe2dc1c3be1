"""Shared test helpers."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def run_cli():
    """`run_cli(spec, workdir, timeout=900, check=True)`: `experiments/run.py --config=spec --workdir=workdir`
    in a fresh interpreter from the repository root, as a user runs it; with `check`, a non-zero exit fails the
    test with the tail of its output."""
    def run(spec, workdir, timeout=900, check=True):
        cmd = [sys.executable, "experiments/run.py", f"--config={spec}", f"--workdir={workdir}"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        return proc
    return run
