"""Two CPU processes joined by jax.distributed, started by the launcher itself on a fresh workdir: one builds the
data and tokenizer while the other waits, process 0 alone writes metrics and summaries (one row per step), orbax
writes the checkpoints from both, and the two train in lockstep with one process holding both devices (the same
global batch and mesh)."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

# cascade_math:tiny shrunk to seconds: a 1-layer d=32 model, a few SFT and GRPO steps
SHRINK = ["--config.model.d_model=32", "--config.model.n_layers=1", "--config.model.n_heads=2",
          "--config.model.n_kv_heads=1", "--config.model.head_dim=16", "--config.model.d_ff=64",
          "--config.data.domains.math.num_train=256",
          "--config.data.domains.math.num_test=8", "--config.eval.n=8", "--config.eval.batch_size=8",
          "--config.eval.max_new_tokens=16",
          "--config.eval.avg_k=2", "--config.reward.num_workers=0", "--config.stages.sft.steps=4",
          "--config.stages.sft.batch_size=8", "--config.stages.sft.checkpoint_every=2",
          "--config.stages.sft.eval_every=0", "--config.stages.sft.optim.warmup_steps=1",
          "--config.stages.grpo.steps=2", "--config.stages.grpo.rollout.prompts_per_step=4",
          "--config.stages.grpo.rollout.group_size=4",
          "--config.stages.grpo.rollout.length_curriculum=((0,16),)", "--config.stages.grpo.filters.dynamic=False",
          "--config.stages.grpo.checkpoint_every=1", "--config.stages.grpo.eval_every=0"]


def _rows(workdir):
    return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


@pytest.mark.slow  # ~105 s: two jax.distributed processes and a one-process reference run, each a cascade
def test_two_processes_train_in_lockstep_with_one(tmp_path):
    env = os.environ | {"PYTHON": sys.executable, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    multi = tmp_path / "multi"
    proc = subprocess.run(["bash", "launch/local_multiprocess.sh", "2", "cascade_math:tiny", str(multi), *SHRINK],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    logs = "".join(f"\n--- process {i}\n" + (tmp_path / f"multi.logs/process_{i}.log").read_text()[-3000:]
                   for i in (0, 1) if (tmp_path / f"multi.logs/process_{i}.log").exists())
    assert proc.returncode == 0, proc.stderr[-2000:] + logs
    # one mesh over both processes
    assert "devices OrderedDict([('data', 1), ('fsdp', 2), ('expert', 1), ('tensor', 1)])" in logs

    # the reference: one process holding two CPU devices, the same mesh and global batch
    single = tmp_path / "single"
    ref = subprocess.run([sys.executable, "experiments/run.py", "--config=cascade_math:tiny", f"--workdir={single}",
                          *SHRINK], cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env=env | {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
    assert ref.returncode == 0, ref.stderr[-3000:]

    rows, ref_rows = _rows(multi), _rows(single)
    key = lambda r: (r["stage"], r["step"], tuple(sorted(k for k in r if k.startswith("eval/"))))  # noqa: E731
    assert [key(r) for r in rows] == [key(r) for r in ref_rows]  # one row per step: process 1 wrote none
    sft = [(r["loss"], r2["loss"]) for r, r2 in zip(rows, ref_rows) if r["stage"] == "sft" and "loss" in r]
    assert len(sft) == 4
    for a, b in sft:
        assert abs(a - b) <= 1e-4 * max(1.0, abs(b)), sft
    grpo = [(r, r2) for r, r2 in zip(rows, ref_rows) if r["stage"] == "grpo" and "reward" in r]
    assert len(grpo) == 2
    for r, r2 in grpo:  # the same rollouts (the samplers drew the same tokens) and the same update
        assert r["reward"] == r2["reward"] and r["response_len"] == r2["response_len"], (r, r2)
        assert abs(r["loss"] - r2["loss"]) <= 1e-4 * max(1.0, abs(r2["loss"])), (r, r2)

    summary, ref_summary = (json.load(open(d / "summary.json")) for d in (multi, single))
    assert [s["name"] for s in summary["stages"]] == ["sft", "grpo"]
    for s, s2 in zip(summary["stages"], ref_summary["stages"]):
        assert s["eval"]["math"]["pass@1"] == s2["eval"]["math"]["pass@1"]
    for d in (multi / "checkpoints" / "final" / "sft", multi / "checkpoints" / "final" / "grpo", multi / "plots",
              multi / "tb"):
        assert d.is_dir(), d
    assert not list(multi.glob("checkpoints/final/*.tmp"))  # both processes saved into one checkpoint
