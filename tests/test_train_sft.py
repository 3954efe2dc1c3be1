"""SFT through the real driver: a run interrupted after k steps and resumed ends with exactly the
params of the uninterrupted run; the run writes summary.json, metrics.jsonl and plots."""
import json
import os

import jax
import numpy as np
import pytest

from nemocascade import cascade, checkpoint
from nemocascade.stages import common

from conftest import final_params, tiny_sft_config, distinct_items


def _cfg(tmp_path, steps=6):
    return tiny_sft_config(tmp_path, steps)


def test_interrupted_sft_resumes_to_identical_params(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    full_dir, cut_dir = str(tmp_path / "full"), str(tmp_path / "cut")
    cascade.run(cfg, full_dir, "sft_math", "tiny")

    original_log = common.Trainer.log

    def interrupting_log(self, step, metrics):
        original_log(self, step, metrics)
        if step == 2:  # after 3 completed steps: between periodic checkpoints (every 4)
            raise KeyboardInterrupt

    monkeypatch.setattr(common.Trainer, "log", interrupting_log)
    with pytest.raises(KeyboardInterrupt):
        cascade.run(cfg, cut_dir, "sft_math", "tiny")
    assert checkpoint.StageCheckpointer(os.path.join(cut_dir, "checkpoints", "sft")).latest_step() == 3
    assert not os.path.exists(os.path.join(cut_dir, "summary.json")) or \
        json.load(open(os.path.join(cut_dir, "summary.json")))["stages"] == []
    monkeypatch.setattr(common.Trainer, "log", original_log)
    cascade.run(cfg, cut_dir, "sft_math", "tiny")

    a, b = final_params(full_dir, "sft"), final_params(cut_dir, "sft")
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # metrics.jsonl of the resumed run has each step exactly once
    steps = [json.loads(line)["step"] for line in open(os.path.join(cut_dir, "metrics.jsonl"))]
    assert steps == list(range(6))


def test_run_writes_summary_metrics_and_plots(tmp_path):
    cfg = _cfg(tmp_path, steps=3)
    workdir = str(tmp_path / "run")
    summary = cascade.run(cfg, workdir, "sft_math", "tiny")
    on_disk = json.load(open(os.path.join(workdir, "summary.json")))
    assert on_disk == json.loads(json.dumps(summary))
    assert list(on_disk) == ["config", "variant", "seed", "stages", "total_wall_s"]
    (stage,) = on_disk["stages"]
    assert (stage["name"], stage["kind"], stage["domains"], stage["steps"], stage["teachers"]) == \
        ("sft", "sft", ["math"], 3, None)
    assert stage["eval"]["math"]["n"] == distinct_items(cfg, "math", "test", 8)
    assert 0.0 <= stage["eval"]["math"]["pass@1"] <= 1.0
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1, 2] and all("loss" in r and "tokens_per_s" in r for r in rows)
    for png in ("curves.png", "eval_by_stage.png"):
        assert os.path.getsize(os.path.join(workdir, "plots", png)) > 1000
    # a second invocation skips the finished stage and keeps the summary
    again = cascade.run(cfg, workdir, "sft_math", "tiny")
    assert again["stages"][0]["eval"] == stage["eval"]
