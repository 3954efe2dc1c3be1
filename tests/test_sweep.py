"""Seed sweeps: nemocascade/sweep.py aggregates summaries (pinned by hand), experiments/sweep.py runs the seeds."""
import json
import os
import subprocess
import sys

import pytest

from nemocascade import sweep

from conftest import ROOT

T2 = 12.706204736174707  # Student t, 97.5% quantile, 1 degree of freedom
T3 = 4.302652729749464  # 2 degrees of freedom


def _summary(sft, grpo, init=None):
    s = {"stages": [{"name": "sft", "eval": {"math": {"pass@1": sft, "n": 500}}, "started_from": None},
                    {"name": "grpo", "eval": {"math": {"pass@1": grpo, "n": 500}}, "started_from": "sft"}]}
    if init is not None:
        s["init"] = {"eval": {"math": {"pass@1": init, "n": 500}}}
    return s


def test_aggregate_means_intervals_and_paired_gains_by_hand():
    out = sweep.aggregate("cascade_math", None, {0: _summary(0.5, 0.7), 1: _summary(0.6, 0.8), 2: _summary(0.55, 0.65)})
    sft, grpo = out["stages"]
    assert sft["eval"]["math"]["per_seed"] == [0.5, 0.6, 0.55] and sft["eval"]["math"]["mean"] == pytest.approx(0.55)
    half = T3 * 0.05 / 3 ** 0.5  # sd of (0.5, 0.6, 0.55) is 0.05
    assert sft["eval"]["math"]["ci95"] == pytest.approx([0.55 - half, 0.55 + half])
    (gain,) = out["paired"]  # gains per seed 0.2, 0.2, 0.1: mean 1/6, sd 0.057735
    assert (gain["from"], gain["to"], gain["domain"]) == ("sft", "grpo", "math")
    assert gain["mean_gain"] == pytest.approx(1 / 6)
    half = T3 * 0.0577350269 / 3 ** 0.5
    assert gain["ci95"] == pytest.approx([1 / 6 - half, 1 / 6 + half])
    table = sweep.table_markdown(out)
    assert "| sft | 55.0 [" in table and "| sft -> grpo | math | +16.7 |" in table


def test_aggregate_carries_avg_at_k_where_measured():
    runs = {0: _summary(0.5, 0.7), 1: _summary(0.6, 0.8)}
    runs[0]["stages"][1]["eval"]["math"]["avg@k"] = 0.6
    runs[1]["stages"][1]["eval"]["math"]["avg@k"] = 0.7
    out = sweep.aggregate("cascade_math", None, runs)
    assert "avg@k" not in out["stages"][0]  # sft: no run measured it
    row = out["stages"][1]["avg@k"]["math"]
    assert row["mean"] == pytest.approx(0.65) and row["per_seed"] == [0.6, 0.7]
    half = T2 * 0.0707106781 / 2 ** 0.5
    assert row["ci95"] == pytest.approx([0.65 - half, 0.65 + half])
    assert "| grpo | 65.0 [" in sweep.table_markdown(out).split("avg@k")[1]


def test_aggregate_with_init_a_missing_stage_and_one_seed():
    s1 = _summary(0.5, 0.7, init=0.1)
    s2 = _summary(0.6, 0.8, init=0.3)
    del s2["stages"][1]  # seed 2 has not finished grpo yet
    out = sweep.aggregate("x", "tiny", {1: s1, 2: s2})
    assert [s["name"] for s in out["stages"]] == ["init", "sft", "grpo"]
    assert out["stages"][2]["eval"]["math"]["n_seeds"] == 1 and out["stages"][2]["eval"]["math"]["ci95"] is None
    init_to_sft = next(p for p in out["paired"] if p["to"] == "sft")
    assert init_to_sft["from"] == "init" and init_to_sft["per_seed"] == pytest.approx([0.4, 0.3])
    assert init_to_sft["ci95"] == pytest.approx([0.35 - T2 * 0.0707107 / 2 ** 0.5, 0.35 + T2 * 0.0707107 / 2 ** 0.5])


def test_sweep_cli_runs_seeds_in_parallel_resumes_and_aggregates(tmp_path):
    wd = tmp_path / "sweep"
    cmd = [sys.executable, "experiments/sweep.py", "--config=sft_math:tiny", "--seeds=0,1", f"--workdir={wd}",
           "--parallel=2", "--config.stages.sft.steps=2", "--config.model.n_layers=1",
           "--config.data.domains.math.num_train=256", "--config.eval.n=8"]
    env = {**os.environ, "NEMOCASCADE_PROGRESS": "0"}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = json.load(open(wd / "sweep.json"))
    per_seed = [json.load(open(wd / f"seed_{s}" / "summary.json")) for s in (0, 1)]
    assert [s["seed"] for s in per_seed] == [0, 1]
    row = out["stages"][0]["eval"]["math"]
    assert row["per_seed"] == [s["stages"][0]["eval"]["math"]["pass@1"] for s in per_seed] and row["n_seeds"] == 2
    assert (wd / "sweep.png").stat().st_size > 0 and (wd / "sweep_table.md").exists()
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)  # resumes: done
    assert again.returncode == 0 and json.load(open(wd / "sweep.json")) == out
    bad = subprocess.run(cmd[:3] + ["--seeds=0,0", f"--workdir={wd}"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "none twice" in bad.stderr
