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


def test_paired_avg_at_k_gains_where_a_stage_and_its_start_both_measured_it():
    runs = {0: _summary(0.5, 0.7), 1: _summary(0.6, 0.8), 2: _summary(0.55, 0.6)}
    for seed, (sft, grpo) in {0: (0.30, 0.50), 1: (0.40, 0.50), 2: (0.35, 0.60)}.items():
        runs[seed]["stages"][0]["eval"]["math"]["avg@k"] = sft
        runs[seed]["stages"][1]["eval"]["math"]["avg@k"] = grpo
    del runs[2]["stages"][0]["eval"]["math"]["avg@k"]  # seed 2's start did not measure it: not a pair
    out = sweep.aggregate("x", None, runs)
    (gain,) = out["paired_avg@k"]  # gains 0.2, 0.1: mean 0.15, sd 0.0707
    assert (gain["from"], gain["to"], gain["domain"], gain["n_seeds"]) == ("sft", "grpo", "math", 2)
    assert gain["per_seed"] == pytest.approx([0.2, 0.1]) and gain["mean_gain"] == pytest.approx(0.15)
    half = T2 * 0.0707106781 / 2 ** 0.5
    assert gain["ci95"] == pytest.approx([0.15 - half, 0.15 + half])
    assert [p["per_seed"] for p in out["paired"]] == [pytest.approx([0.2, 0.2, 0.05])]  # greedy's, all three
    assert "paired avg@k gain" in sweep.table_markdown(out) and "| sft -> grpo | math | +15.0 |" in (
        sweep.table_markdown(out).split("paired avg@k gain")[1])


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


@pytest.mark.slow  # ~60 s; the default suite reached 20.2 min idle (2026-12-06). Aggregation: the unit tests above
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
    redo = subprocess.run(cmd + ["--redo_from=sft"], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert redo.returncode == 0, redo.stdout[-2000:] + redo.stderr[-2000:]
    for s in (0, 1):  # passed through to each seed's run.py: SFT trained again (deterministic: the same scores)
        redone = json.load(open(wd / f"seed_{s}" / "summary.json"))
        assert redone["redone"][-1]["dropped"] == ["sft"]
        assert redone["stages"][0]["eval"] == per_seed[s]["stages"][0]["eval"]
    bad = subprocess.run(cmd[:3] + ["--seeds=0,0", f"--workdir={wd}"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "none twice" in bad.stderr


def _arms_run(start_val, teacher_val, mopd_curve, grpo_curve, finals, teacher_test=0.8):
    """A seed's summary and metrics: `start` -> arms mopd (teacher stage `t`) and grpo_arm, math only."""
    summary = {"stages": [
        {"name": "t", "eval": {"math": {"pass@1": teacher_test}}, "val": {"math": {"pass@1": teacher_val}}},
        {"name": "start", "eval": {"math": {"pass@1": 0.5}}, "val": {"math": {"pass@1": start_val}}},
        {"name": "mopd", "eval": {"math": {"pass@1": finals[0]}}, "teachers": {"math": "stage:t"},
         "teacher_scores": {"math": teacher_val}, "started_from": "start"},
        {"name": "grpo_arm", "eval": {"math": {"pass@1": finals[1]}}, "started_from": "start"}]}
    rows = [{"stage": a, "step": 4 * i + 3, "eval/math/pass@1": v}
            for a, curve in (("mopd", mopd_curve), ("grpo_arm", grpo_curve)) for i, v in enumerate(curve)]
    return summary, rows


def test_arms_steps_to_teacher_curves_and_final_gaps_by_hand():
    s0, m0 = _arms_run(0.60, 0.70, [0.66, 0.695, 0.70], [0.62, 0.64, 0.70], (0.78, 0.74))
    s1, m1 = _arms_run(0.58, 0.72, [0.70, 0.71, 0.72], [0.60, 0.61, 0.62], (0.76, 0.70))
    s2, m2 = _arms_run(0.70, 0.705, [0.7] * 3, [0.7] * 3, (0.8, 0.8))  # within 1 point: not regressed, left out
    out = sweep.arms({0: s0, 1: s1, 2: s2}, {0: m0, 1: m1, 2: m2}, ("mopd", "grpo_arm"), "start")
    math = out["domains"]["math"]
    assert math["seeds"] == [0, 1] and math["teacher_val"] == pytest.approx(0.71)
    # within 1 point of 0.70 (>= 0.69): mopd at its 2nd eval (step 8), grpo at its 3rd (12); seed 1 (>= 0.71):
    # mopd at step 8, grpo never
    assert math["mopd"]["steps_to_teacher"] == [8, 8] and math["grpo_arm"]["steps_to_teacher"] == [12, None]
    assert math["mopd"]["curve"]["steps"] == [0, 4, 8, 12]
    assert math["mopd"]["curve"]["mean"] == pytest.approx([0.59, 0.68, 0.7025, 0.71])
    half = T2 * 0.028284271 / 2 ** 0.5  # step 4: values 0.66, 0.70, sample sd 0.028284
    assert math["mopd"]["curve"]["ci95"][1] == pytest.approx([0.68 - half, 0.68 + half])
    assert math["mopd"]["final_gap_test"]["per_seed"] == pytest.approx([0.02, 0.04])
    assert math["grpo_arm"]["final_test"]["mean"] == pytest.approx(0.72)
    table = sweep.arms_markdown(out)
    assert "| math | mopd | 2 | 8, 8 | 77.0 [" in table and "| math | grpo_arm | 2 | 12, - | 72.0 [" in table


def test_arms_needs_a_distilling_arm():
    s, m = _arms_run(0.6, 0.7, [0.7], [0.7], (0.7, 0.7))
    del s["stages"][2]["teacher_scores"]
    with pytest.raises(ValueError, match="distils from teachers"):
        sweep.arms({0: s}, {0: m}, ("mopd", "grpo_arm"), "start")
