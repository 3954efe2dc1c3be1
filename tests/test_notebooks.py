"""Every notebook in notebooks/ runs top to bottom (nbclient, a fresh kernel in the repository root) with
NEMOCASCADE_NOTEBOOK_SMOKE=1, which shrinks each run to seconds (`configs.smoke`), and is committed with its
outputs stripped. The time each took is printed (`pytest -s`)."""
import json
import os
import time

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT

NOTEBOOKS = sorted(f for f in os.listdir(os.path.join(ROOT, "notebooks")) if f.endswith(".ipynb"))


def test_the_notebooks_are_the_four_the_readme_lists():
    assert NOTEBOOKS == ["fork_an_experiment.ipynb", "mopd.ipynb", "quickstart.ipynb", "tpu_vm.ipynb"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_without_outputs(name):
    book = json.load(open(os.path.join(ROOT, "notebooks", name)))
    code = [c for c in book["cells"] if c["cell_type"] == "code"]
    assert code and all(not c["outputs"] and c["execution_count"] is None for c in code)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "tpu_vm.ipynb" else n
                                  for n in NOTEBOOKS])  # tpu_vm: ~130 s (SmolLM2 GRPO + MOPD on 2 CPU devices)
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
    monkeypatch.setenv("NEMOCASCADE_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("NEMOCASCADE_NOTEBOOK_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("NEMOCASCADE_PROGRESS", "0")
    book = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
    start = time.time()
    NotebookClient(book, timeout=600, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    print(f"\n{name}: ran in {time.time() - start:.0f} s")
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert os.path.isdir(tmp_path / "runs")  # the runs went where the test said, not into the checkout
